"""Stateless functions on Nodes (`import netcl.nn.functional as F`): activations, layers' ops, losses.

They are the differentiable ops of netcl.autograd under PyTorch's functional names.
"""

from netcl.autograd import (  # noqa: F401
    adaptive_avg_pool2d,
    avg_pool2d,
    batch_norm,
    binary_cross_entropy_with_logits,
    conv2d,
    cross_entropy,
    dropout,
    embedding,
    gelu,
    group_norm,
    l1,
    l1_loss,
    layer_norm,
    leaky_relu,
    linear,
    log_softmax,
    max_pool2d,
    mse,
    mse_loss,
    nll,
    nll_loss,
    relu,
    rms_norm,
    sigmoid,
    silu,
    smooth_l1,
    smooth_l1_loss,
    softmax,
    softplus,
    tanh,
)
