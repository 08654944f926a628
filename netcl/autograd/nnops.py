"""Structured ops on Nodes (GEMM, convolution, pooling, norms, embedding) with their backward rules.

Each forward calls the op in netcl.ops; each backward calls the op's backward kernels (conv2d_backward_*,
max_pool2d_backward, batch_norm_backward...). A fused relu epilogue is differentiated through the
saved output: where(y > 0, g, 0), which the JIT fuses into the next kernel's input.
"""

from __future__ import annotations

import weakref
from typing import Any

from netcl import kernels, ops
from netcl.autograd import autocast
from netcl.autograd import elementwise as ew
from netcl.autograd.elementwise import sum_to_shape
from netcl.autograd.engine import Node, as_node, record
from netcl.autograd.movement import reshape
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError
from netcl.ops import gemm as mm
from netcl.ops import norm


def _relu_mask(g: Tensor, out: Tensor) -> Tensor:
    return ops.where(ops.gt(out, 0), g, 0.0)


# Nodes made by linear(..., activation="relu") -> their output: a linear layer fed by one folds the
# producer's relu backward into its own input-gradient GEMM (where(out > 0, g W, 0) in one launch) and
# tags that gradient tensor, so the producer's backward skips its separate mask launch. The mask is
# idempotent, so a gradient that lost the tag (summed with another path's) is simply masked again.
_RELU_OUT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MASKED_FOR = "_netcl_relu_masked_for"


def sum_rows(g2: Tensor) -> Tensor:
    """Column sums of a 2-D gradient (the bias gradient)."""
    return ops.sum(g2, axis=0)


def matmul(a: Node, b: Node) -> Node:
    """a @ b with NumPy's rules (1-D operands, batch broadcasting); grads g b^T and a^T g."""
    a, b = as_node(a), as_node(b)
    a, b = autocast.cast_inputs("matmul", a, b)
    if a.ndim == 1 or b.ndim == 1:
        a2 = reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
        b2 = reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
        out = matmul(a2, b2)
        shape = out.shape
        if a.ndim == 1:
            shape = shape[:-2] + shape[-1:]
        if b.ndim == 1:
            shape = shape[:-1]
        return reshape(out, shape)
    av, bv = a.value, b.value
    out = mm.matmul(av, bv)

    def backward(g: Tensor):
        ga = sum_to_shape(mm.matmul(g, bv.transpose(-2, -1)), av.shape) if a.requires_grad else None
        gb = sum_to_shape(mm.matmul(av.transpose(-2, -1), g), bv.shape) if b.requires_grad else None
        return ga, gb

    return record(out, (a, b), backward, "matmul")


def linear(x: Node, weight: Node, bias: Node | None = None, activation: str | None = None) -> Node:
    """activation(x @ weight.T + bias), weight (out, in) like PyTorch; relu is fused into the GEMM.

    Backward: g_x = g W, g_W = g^T x (x flattened to 2-D), g_b = column sums of g."""
    kernels.activation(activation)  # ValueError naming the choices (netcl.kernels.ACTIVATIONS)
    x, weight, bias = autocast.cast_inputs("linear", x, weight, bias)
    if activation not in (None, "none", "relu"):
        z = linear(x, weight, bias)
        if activation == "silu":
            return ew.silu(z)
        return ew.gelu(z, approximate="tanh" if activation == "gelu_tanh" else "none")
    x, weight = as_node(x), as_node(weight)
    bias = as_node(bias) if bias is not None else None
    xv, wv = x.value, weight.value
    bv = bias.value if bias is not None else None
    out = mm.linear(xv, wv, bv, activation=activation)
    parents = (x, weight) if bias is None else (x, weight, bias)
    in_features, out_features = wv.shape[1], wv.shape[0]

    x_relu_out = _RELU_OUT.get(x) if xv.ndim == 2 else None  # x made by a linear+relu: fold its mask

    def backward(g: Tensor):
        if activation == "relu" and getattr(g, _MASKED_FOR, None) is not out:
            g = _relu_mask(g, out)
        # 2-D inputs (the common case) need no reshapes: each costs a view's construction per step
        g2 = g if g.ndim == 2 else g.reshape(-1, out_features)
        x2 = xv if xv.ndim == 2 else xv.reshape(-1, in_features)
        gx = None
        if x.requires_grad and x_relu_out is not None:
            gx, masked = mm.matmul_relu_mask(g2, wv, x_relu_out)
            if masked:
                setattr(gx, _MASKED_FOR, x_relu_out)
        elif x.requires_grad:
            gx = mm.matmul(g2, wv)
            gx = gx if xv.ndim == 2 else gx.reshape(xv.shape)
        gw = gb = None
        want_b = bias is not None and bias.requires_grad
        if weight.requires_grad and want_b:
            # g^T x and the column sums of g in one launch where the CPU GEMM runs (gb None elsewhere)
            gw, gb = mm.matmul_rowsum(g2.transpose(0, 1), x2)
        elif weight.requires_grad:
            gw = mm.matmul(g2.transpose(0, 1), x2)
        if want_b and gb is None:
            gb = sum_rows(g2)
        return (gx, gw) if bias is None else (gx, gw, gb)

    node = record(out, parents, backward, "linear" if activation is None else "linear_relu")
    if activation == "relu" and node.requires_grad:
        _RELU_OUT[node] = out
    return node


def linear_relu(x: Node, weight: Node, bias: Node | None = None) -> Node:
    return linear(x, weight, bias, activation="relu")


def conv2d(
    x: Node,
    weight: Node,
    bias: Node | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    activation: str | None = None,
) -> Node:
    """NCHW convolution (relu epilogue optional); backward through conv2d_backward_input/weight/bias."""
    x, weight, bias = autocast.cast_inputs("conv2d", x, weight, bias)
    x, weight = as_node(x), as_node(weight)
    bias = as_node(bias) if bias is not None else None
    xv, wv = x.value, weight.value
    bv = bias.value if bias is not None else None
    out = ops.conv2d(
        xv, wv, bv, stride=stride, padding=padding, dilation=dilation, groups=groups, activation=activation
    )
    parents = (x, weight) if bias is None else (x, weight, bias)
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)

    def backward(g: Tensor):
        if activation == "relu":
            g = _relu_mask(g, out)
        g = g.contiguous()
        gx = ops.conv2d_backward_input(g, wv, xv.shape, **geometry) if x.requires_grad else None
        gw = ops.conv2d_backward_weight(xv, g, wv.shape, **geometry) if weight.requires_grad else None
        grads = [gx, gw]
        if bias is not None:
            grads.append(ops.conv2d_backward_bias(g) if bias.requires_grad else None)
        return tuple(grads)

    return record(out, parents, backward, "conv2d" if activation is None else "conv2d_relu")


def conv2d_relu(x: Node, weight: Node, bias: Node | None = None, **kwargs: Any) -> Node:
    return conv2d(x, weight, bias, activation="relu", **kwargs)


def max_pool2d(
    x: Node,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> Node:
    """Window maxima; the gradient goes to each window's argmax (indices saved by the forward)."""
    x = as_node(x)
    xv = x.value
    out, indices = ops.max_pool2d(xv, kernel_size, stride, padding, dilation, ceil_mode)
    shape = xv.shape

    def backward(g: Tensor):
        return (
            ops.max_pool2d_backward(g, indices, shape, kernel_size, stride, padding, dilation, ceil_mode),
        )

    return record(out, (x,), backward, "max_pool2d")


def avg_pool2d(
    x: Node,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Node:
    x = as_node(x)
    shape = x.shape
    out = ops.avg_pool2d(x.value, kernel_size, stride, padding, ceil_mode, count_include_pad)
    return record(
        out,
        (x,),
        lambda g: (
            ops.avg_pool2d_backward(g, shape, kernel_size, stride, padding, ceil_mode, count_include_pad),
        ),
        "avg_pool2d",
    )


def adaptive_avg_pool2d(x: Node, output_size: Any) -> Node:
    x = as_node(x)
    shape = x.shape
    out = ops.adaptive_avg_pool2d(x.value, output_size)
    return record(out, (x,), lambda g: (ops.adaptive_avg_pool2d_backward(g, shape),), "adaptive_avg_pool2d")


def _optional(n: Node | None) -> Tensor | None:
    return n.value if n is not None else None


def batch_norm(
    x: Node,
    weight: Node | None,
    bias: Node | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    training: bool,
    momentum: float = 0.1,
    eps: float = 1e-5,
    activation: str | None = None,
) -> Node:
    """BatchNorm over axis 1 (running stats updated in place when training); relu optionally fused."""
    (x,) = autocast.cast_inputs("batch_norm", x)  # weight and bias stay float32 (norm.batch_norm mixes)
    x = as_node(x)
    weight = as_node(weight) if weight is not None else None
    bias = as_node(bias) if bias is not None else None
    xv = x.value
    wv, bv = _optional(weight), _optional(bias)
    out, save_mean, save_invstd = norm.batch_norm(
        xv, wv, bv, running_mean, running_var, training, momentum, eps, activation=activation
    )
    parents = tuple(n for n in (x, weight, bias) if n is not None)

    def backward(g: Tensor):
        gx, gw, gb = norm.batch_norm_backward(
            g, xv, wv, save_mean, save_invstd, training, bias=bv, activation=activation
        )
        grads = [gx]
        if weight is not None:
            grads.append(gw)
        if bias is not None:
            grads.append(gb)
        return tuple(grads)

    return record(out, parents, backward, "batch_norm")


def _affine_norm(op: str, x: Node, arg: Any, weight: Node | None, bias: Node | None, eps: float) -> Node:
    """layer_norm / group_norm (`arg`: normalized_shape / num_groups): the op's forward saves mean and
    rstd; its backward gives d x, d weight, d bias."""
    forward, backward_op = getattr(norm, op), getattr(norm, f"{op}_backward")
    x, weight, bias = autocast.cast_inputs(op, x, weight, bias)
    x = as_node(x)
    weight = as_node(weight) if weight is not None else None
    bias = as_node(bias) if bias is not None else None
    xv, wv, bv = x.value, _optional(weight), _optional(bias)
    out, mean, rstd = forward(xv, arg, wv, bv, eps)
    parents = tuple(n for n in (x, weight, bias) if n is not None)

    def backward(g: Tensor):
        gx, gw, gb = backward_op(g, xv, arg, mean, rstd, wv, bv)
        return tuple([gx] + ([gw] if weight is not None else []) + ([gb] if bias is not None else []))

    return record(out, parents, backward, op)


def layer_norm(
    x: Node, normalized_shape: Any, weight: Node | None = None, bias: Node | None = None, eps: float = 1e-5
) -> Node:
    return _affine_norm("layer_norm", x, normalized_shape, weight, bias, eps)


def rms_norm(x: Node, normalized_shape: Any, weight: Node | None = None, eps: float = 1e-6) -> Node:
    x, weight = autocast.cast_inputs("rms_norm", x, weight)
    x = as_node(x)
    weight = as_node(weight) if weight is not None else None
    xv, wv = x.value, _optional(weight)
    out, rstd = norm.rms_norm(xv, normalized_shape, wv, eps)
    parents = (x,) if weight is None else (x, weight)

    def backward(g: Tensor):
        gx, gw = norm.rms_norm_backward(g, xv, normalized_shape, rstd, wv)
        return (gx,) if weight is None else (gx, gw)

    return record(out, parents, backward, "rms_norm")


def group_norm(
    x: Node, num_groups: int, weight: Node | None = None, bias: Node | None = None, eps: float = 1e-5
) -> Node:
    return _affine_norm("group_norm", x, num_groups, weight, bias, eps)


def embedding(weight: Node, ids: Any) -> Node:
    """Rows of weight (V, D) picked by integer ids (...); the gradient is scatter-added into (V, D)."""
    weight = as_node(weight)
    idv = ids.value if isinstance(ids, Node) else ids
    if not isinstance(idv, Tensor) or idv.dtype.kind not in "iu":
        raise DTypeError(f"embedding: ids must be an integer Tensor (int32 or int64), got "
                         f"{getattr(idv, 'dtype', type(idv).__name__)}")
    wv = weight.value
    out = ops.embedding(wv, idv)

    def backward(g: Tensor):
        flat_ids = idv.reshape(-1)
        g2 = g.reshape(-1, wv.shape[1])
        index = flat_ids.reshape(-1, 1).expand(-1, wv.shape[1])
        # the forward's kernel checked the ids: no host check here, so a recorded step (netcl.graph) holds it
        return (ops.scatter_add(Tensor.zeros(wv.queue, wv.shape, g.dtype), 0, index, g2, check_bounds=False),)

    return record(out, (weight,), backward, "embedding")


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
