"""Reverse-mode autograd: `with ag.Tape() as tape:` records ops on Nodes, `tape.backward(loss)` fills `.grad`.

    import netcl.autograd as ag
    with ag.Tape() as tape:
        x = ag.tensor(x_raw)
        loss = ag.cross_entropy(model(x), ag.tensor(labels))
    tape.backward(loss)

Every differentiable op has its rule beside its forward (elementwise.py, reduce.py, movement.py,
nnops.py, loss.py). Reduced losses are Tensors of shape (1,).
"""

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
from netcl.autograd.elementwise import (
    abs,
    add,
    cast,
    clamp,
    cos,
    div,
    dropout,
    eq,
    exp,
    expm1,
    ge,
    gelu,
    gt,
    le,
    leaky_relu,
    log,
    log1p,
    lt,
    maximum,
    minimum,
    mul,
    ne,
    neg,
    pow,
    reciprocal,
    relu,
    rsqrt,
    sigmoid,
    silu,
    sin,
    softplus,
    sqrt,
    square,
    sub,
    sum_to_shape,
    tanh,
    where,
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

from netcl.autograd import operators as _operators

_operators.install()
