"""Structured ops on Nodes (GEMM, convolution, pooling, norms, embedding).

matmul, conv2d, the pooling ops and the norms are generated from their declarations in netcl.ops
(netcl.autograd.declared); here are the ones written by hand: linear (it folds its producer's relu into its
input gradient), linear_relu, conv2d_relu and embedding. A fused relu epilogue is differentiated through the
saved output: where(y > 0, g, 0), which the JIT fuses into the next kernel's input.
"""

from __future__ import annotations

from typing import Any

from netcl import kernels, ops
from netcl.autograd import autocast
from netcl.autograd import elementwise as ew
from netcl.autograd.declared import OPS, implements
from netcl.autograd.engine import Node, as_node, partial_gradient, record
from netcl.core.tensor import Tensor
from netcl.ops import gemm as mm


def _relu_mask(g: Tensor, out: Tensor) -> Tensor:
    return ops.where(ops.gt(out, 0), g, 0.0)


# A node recorded as "linear_relu" (linear(..., activation="relu")) holds the relu's output as its value: a
# linear layer fed by one folds the producer's relu backward into its own input-gradient GEMM
# (where(out > 0, g W, 0) in one launch) and tags that gradient tensor, so the producer's backward skips its
# separate mask launch. The mask is idempotent, so a gradient that lost the tag (summed with another path's)
# is simply masked again.
_RELU_OP = "linear_relu"
_MASKED_FOR = "_netcl_relu_masked_for"


@implements("linear")
def linear(x: Node, weight: Node, bias: Node | None = None, activation: str | None = None) -> Node:
    """activation(x @ weight.T + bias), weight (out, in) like PyTorch; relu is fused into the GEMM.

    Backward: g_x = g W, g_W = g^T x (x flattened to 2-D), g_b = column sums of g."""
    if activation is not None and activation != "relu":
        kernels.activation(activation)  # ValueError naming the choices (netcl.kernels.ACTIVATIONS)
    # as the generated ops do (netcl.autograd.declared): the autocast check an attribute read, no as_node call
    # for what is a Node already
    wide_w = wide_b = False  # weight, bias cast from float32 by autocast: their gradients' float32 sums kept
    if autocast._state.stack:
        given = weight, bias
        x, weight, bias = autocast.cast_inputs("linear", x, weight, bias)
        wide_w, wide_b = autocast.widened(given[0], weight), autocast.widened(given[1], bias)
    if activation not in (None, "none", "relu"):
        z = linear(x, weight, bias)
        if activation == "silu":
            return ew.silu(z)
        return ew.gelu(z, approximate="tanh" if activation == "gelu_tanh" else "none")
    if not isinstance(x, Node):
        x = as_node(x)
    if not isinstance(weight, Node):
        weight = as_node(weight)
    if bias is not None and not isinstance(bias, Node):
        bias = as_node(bias)
    xv, wv = x.value, weight.value
    bv = bias.value if bias is not None else None
    out = mm.linear(xv, wv, bv, activation=activation)
    parents = (x, weight) if bias is None else (x, weight, bias)
    in_features, out_features = wv.shape[1], wv.shape[0]
    x_2d = len(xv.shape) == 2

    x_relu_out = xv if x_2d and x._op == _RELU_OP else None  # x made by a linear+relu: fold its mask
    relu_out = out if activation == "relu" else None  # the rule keeps the output only for relu's mask

    def backward(g: Tensor):
        if relu_out is not None and getattr(g, _MASKED_FOR, None) is not relu_out:
            g = _relu_mask(g, relu_out)
        # 2-D inputs (the common case) need no reshapes: each costs a view's construction per step
        g2 = g if x_2d else g.reshape(-1, out_features)
        x2 = xv if x_2d else xv.reshape(-1, in_features)
        gx = None
        if x.requires_grad and x_relu_out is not None:
            gx, masked = mm.matmul_relu_mask(g2, wv, x_relu_out)
            if masked:
                setattr(gx, _MASKED_FOR, x_relu_out)
        elif x.requires_grad:
            # x's gradient so far (another layer read x: attention's q, k and v, SwiGLU's gate and up) added
            # in the GEMM's epilogue instead of by a launch of its own
            prev = partial_gradient(0, xv.shape, g2.dtype, g2.queue)
            if prev is not None and not x_2d:
                prev = prev.reshape(-1, in_features)
            gx = mm.matmul(g2, wv) if prev is None else mm.gemm(g2, wv, residual=prev)
            gx = gx if x_2d else gx.reshape(xv.shape)
        gw, gb = mm.linear_param_grads(g2, x2, weight.requires_grad, bias is not None and bias.requires_grad,
                                       wide_w, wide_b)
        return (gx, gw) if bias is None else (gx, gw, gb)

    return record(out, parents, backward, _RELU_OP if activation == "relu" else "linear", sums=True)


def linear_relu(x: Node, weight: Node, bias: Node | None = None) -> Node:
    return linear(x, weight, bias, activation="relu")


# the generated ops, under the names this module always had
matmul = OPS["matmul"]
conv2d = OPS["conv2d"]
max_pool2d = OPS["max_pool2d"]
avg_pool2d = OPS["avg_pool2d"]
adaptive_avg_pool2d = OPS["adaptive_avg_pool2d"]
batch_norm = OPS["batch_norm"]
layer_norm = OPS["layer_norm"]
group_norm = OPS["group_norm"]
rms_norm = OPS["rms_norm"]
embedding = OPS["embedding"]


def conv2d_relu(x: Node, weight: Node, bias: Node | None = None, **kwargs: Any) -> Node:
    return conv2d(x, weight, bias, activation="relu", **kwargs)


__all__ = [
    "adaptive_avg_pool2d",
    "avg_pool2d",
    "batch_norm",
    "conv2d",
    "conv2d_relu",
    "embedding",
    "group_norm",
    "layer_norm",
    "linear",
    "linear_relu",
    "matmul",
    "max_pool2d",
    "rms_norm",
]
