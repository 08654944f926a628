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
