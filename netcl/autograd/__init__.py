"""Reverse-mode autograd: `with ag.Tape() as tape:` records ops on Nodes, `tape.backward(loss)` fills `.grad`.

    import netcl.autograd as ag
    with ag.Tape() as tape:
        x = ag.tensor(x_raw)
        loss = ag.cross_entropy(model(x), ag.tensor(labels))
    tape.backward(loss)

Every elementwise function of netcl.ops is an op here, its derivative from netcl.jit.autodiff's table
(elementwise.py); the other ops have their backward rule beside their forward (reduce.py, movement.py,
nnops.py, loss.py), calling the backward kernels of netcl.ops. Reduced losses are Tensors of shape (1,).
"""

from netcl.autograd import elementwise as _elementwise
from netcl.autograd import operators as _operators
from netcl.autograd.elementwise import *  # noqa: F403  (every elementwise op of netcl.ops, on Nodes)
from netcl.autograd.engine import (
    Node,
    Parameter,
    Tape,
    as_node,
    backward,
    current_tape,
    enable_grad,
    is_grad_enabled,
    is_recording,
    needs_grad,
    no_grad,
    record,
    tensor,
)
from netcl.autograd.loss import (
    binary_cross_entropy_with_logits,
    cross_entropy,
    l1,
    l1_loss,
    mse,
    mse_loss,
    nll,
    nll_loss,
    smooth_l1,
    smooth_l1_loss,
)
from netcl.autograd.movement import (
    cat,
    chunk,
    concat,
    contiguous,
    expand,
    flatten,
    getitem,
    permute,
    reshape,
    split,
    squeeze,
    stack,
    transpose,
    unsqueeze,
    view,
)
from netcl.autograd.nnops import (
    adaptive_avg_pool2d,
    avg_pool2d,
    batch_norm,
    conv2d,
    conv2d_relu,
    embedding,
    group_norm,
    layer_norm,
    linear,
    linear_relu,
    matmul,
    max_pool2d,
    rms_norm,
)
from netcl.autograd.reduce import log_softmax, logsumexp, max, mean, min, softmax, std, sum, var

_operators.install()

__all__ = [
    "Node",
    "Parameter",
    "Tape",
    "adaptive_avg_pool2d",
    "as_node",
    "avg_pool2d",
    "backward",
    "batch_norm",
    "binary_cross_entropy_with_logits",
    "cat",
    "chunk",
    "concat",
    "contiguous",
    "conv2d",
    "conv2d_relu",
    "cross_entropy",
    "current_tape",
    "embedding",
    "enable_grad",
    "expand",
    "flatten",
    "getitem",
    "group_norm",
    "is_grad_enabled",
    "is_recording",
    "l1",
    "l1_loss",
    "layer_norm",
    "linear",
    "linear_relu",
    "log_softmax",
    "logsumexp",
    "matmul",
    "max",
    "max_pool2d",
    "mean",
    "min",
    "mse",
    "mse_loss",
    "needs_grad",
    "nll",
    "nll_loss",
    "no_grad",
    "permute",
    "record",
    "reshape",
    "rms_norm",
    "smooth_l1",
    "smooth_l1_loss",
    "softmax",
    "split",
    "squeeze",
    "stack",
    "std",
    "sum",
    "tensor",
    "transpose",
    "unsqueeze",
    "var",
    "view",
]
__all__ += _elementwise.__all__  # every elementwise op
