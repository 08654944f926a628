"""Layers: one small class each, the math and shapes in its docstring (PyTorch's names and defaults).

Layers with parameters take the queue first: Linear(q, in_features, out_features).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import netcl.autograd as ag
from netcl import ops
from netcl.autograd import autocast
from netcl.autograd.engine import Node, Parameter, as_node
from netcl.core import shapes
from netcl.core.backend import as_queue
from netcl.core.tensor import Tensor
from netcl.errors import ShapeError
from netcl.nn import init
from netcl.nn.module import Module, structure_changed
from netcl.ops import random


def _normalized_shape(value: Any) -> tuple[int, ...]:
    return shapes.shape(value, "normalized_shape")


def _probability(p: Any, what: str) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"{what} must be a number in [0, 1], got {p!r} ({type(p).__name__})")
    if not 0.0 <= p <= 1.0:  # NaN fails this too
        raise ValueError(f"{what} must be in [0, 1], got {p}")
    return float(p)


class Linear(Module):
    """y = x W^T + b; x (..., in_features) -> y (..., out_features); W (out, in), b (out,).

    Init as PyTorch: W ~ kaiming_uniform(a=sqrt(5)) = U(+-1/sqrt(in)), b ~ U(+-1/sqrt(in))."""

    kept_dtype_buffers = ("weight_scale",)

    def __init__(
        self,
        q: Any,
        in_features: int,
        out_features: int,
        bias: bool = True,
        dtype: Any = "float32",
        generator: random.Generator | None = None,
    ):
        super().__init__()
        q = as_queue(q)
        self.in_features = shapes.size(in_features, "Linear: in_features")
        self.out_features = shapes.size(out_features, "Linear: out_features")
        self.weight = Parameter(
            init.kaiming_uniform(q, (self.out_features, self.in_features), dtype=dtype, generator=generator)
        )
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features else 0.0
        self.bias = (
            Parameter(init.uniform(q, (self.out_features,), bound, dtype, generator)) if bias else None
        )

        # per output channel, once quantize_int8() ran: a buffer, so the int8 weights' state_dict (a
        # checkpoint of the quantized model) holds their scales; float32 whatever the model's dtype
        self.register_buffer("weight_scale", None)

    def forward(self, x: Node, activation: str | None = None, residual: Node | None = None) -> Node:
        """activation(x W^T + b), plus `residual` (added in the GEMM's epilogue, after the activation)."""
        if self.weight_scale is not None:  # weight-only int8: inference only (no gradient reaches W)
            out = ops.linear_int8(as_node(x).value, self.weight.value, self.weight_scale,
                                  None if self.bias is None else self.bias.value, activation,
                                  None if residual is None else as_node(residual).value)
            return as_node(out)
        if residual is None:
            return ag.linear(x, self.weight, self.bias, activation=activation)
        if activation not in (None, "none"):
            return ag.linear(x, self.weight, self.bias, activation=activation) + residual
        return ag.linear_residual(x, self.weight, self.bias, residual)

    def quantize_int8(self) -> None:
        """Store W as int8 with one float32 scale per output channel (netcl.ops.quantize_int8): a quarter of
        float32's bytes, half of bfloat16's; forward then dequantizes on the fly. For inference: W is no
        longer trainable, and the model's state_dict holds the quantized values and their scales (a model
        loads them after its own quantize_int8())."""
        if self.weight_scale is not None:
            return
        w = self.weight.value
        q, scales = ops.quantize_int8(w.to_host())
        self.weight_scale = Tensor.from_host(w.queue, scales)
        self.weight.value = Tensor.from_host(w.queue, q)
        self.weight.requires_grad = False

    def extra_repr(self) -> str:
        int8 = ", int8" if self.weight_scale is not None else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
            f"{int8}"
        )


class LinearStack:
    """Linear layers that read one input (attention's q, k and v; SwiGLU's gate and up), their weights, biases
    and int8 scales kept as consecutive row blocks of one matrix: each layer's parameters become views of it,
    so training and state_dict see them as before, and an inference forward (no tape recording) computes
    all of them in one GEMM, one GEMV a decode step, instead of one each. A layer whose weight was replaced
    since (a new Tensor) makes the stack stale: `intact()` says so and the caller takes the layers one by
    one."""

    def __init__(self, layers: list[Linear]):
        first = layers[0]
        w0 = first.weight.value
        int8 = first.weight_scale is not None
        for layer in layers:
            w = layer.weight.value
            if (w.shape[1], w.dtype, layer.bias is None, layer.weight_scale is None) != (
                    w0.shape[1], w0.dtype, first.bias is None, not int8):
                raise ShapeError("LinearStack: the layers must share in_features, dtype, bias and int8-ness")
        self.layers = list(layers)
        self.rows: list[tuple[int, int]] = []
        start = 0
        for layer in layers:
            self.rows.append((start, start + layer.out_features))
            start += layer.out_features
        q = w0.queue

        def stacked(tensors: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
            whole = Tensor.empty(q, (start, *tensors[0].shape[1:]), tensors[0].dtype)
            views = []
            for (a, b), t in zip(self.rows, tensors):
                view = whole[a:b]
                view.copy_(t)
                views.append(view)
            return whole, views

        self.weight, views = stacked([layer.weight.value for layer in layers])
        self.bias = self.scale = None
        for layer, view in zip(layers, views):
            layer.weight.value = view
        if first.bias is not None:
            self.bias, views = stacked([layer.bias.value for layer in layers])
            for layer, view in zip(layers, views):
                layer.bias.value = view
        if int8:
            self.scale, views = stacked([layer.weight_scale for layer in layers])
            for layer, view in zip(layers, views):
                layer.weight_scale = view
        self._views = [(layer.weight.value, None if layer.bias is None else layer.bias.value,
                        layer.weight_scale) for layer in layers]

    def intact(self) -> bool:
        """Whether every layer still holds the views of this stack."""
        return all(layer.weight.value is w and (layer.bias is None or layer.bias.value is b)
                   and layer.weight_scale is s for layer, (w, b, s) in zip(self.layers, self._views))

    def product(self, x: Node, norm: RMSNorm | None = None) -> Tensor:
        """The layers' outputs side by side, (..., sum of out_features), from one GEMM (no gradient); of
        norm(x) where an RMSNorm is given (in the GEMV's prologue a decode step:
        netcl.ops.rms_norm_linear)."""
        xv = as_node(x).value
        if norm is not None:
            return ops.rms_norm_linear(xv, norm.weight.value, norm.eps, self.weight, self.bias, self.scale)
        if self.scale is not None:
            return ops.linear_int8(xv, self.weight, self.scale, self.bias)
        return ops.linear(xv, self.weight, self.bias)

    def __call__(self, x: Node) -> list[Node]:
        """Each layer's output for x (..., in_features): column blocks (views) of one product."""
        y = self.product(x)
        return [as_node(y[..., a:b]) for a, b in self.rows]

    def silu_mul(self, x: Node, norm: RMSNorm | None = None) -> Node:
        """silu(first layer) * second layer for a stack of two equal layers without biases (SwiGLU's gate
        and up): one launch a decode step (netcl.ops.linear_glu), of norm(x) where an RMSNorm is given (in
        the same launch: netcl.ops.rms_norm_linear)."""
        if len(self.layers) != 2 or self.bias is not None or self.rows[0][1] * 2 != self.rows[1][1]:
            raise ShapeError("LinearStack.silu_mul: needs two layers of equal width without biases")
        xv = as_node(x).value
        if norm is not None:
            return as_node(ops.rms_norm_linear(xv, norm.weight.value, norm.eps, self.weight, None, self.scale,
                                               glu=True))
        return as_node(ops.linear_glu(xv, self.weight, self.scale))


class Conv2d(Module):
    """NCHW convolution: x (N, C_in, H, W) -> (N, C_out, OH, OW); W (C_out, C_in/groups, KH, KW).

    Init as PyTorch: kaiming_uniform(a=sqrt(5)) for W, U(+-1/sqrt(fan_in)) for b."""

    def __init__(
        self,
        q: Any,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        dtype: Any = "float32",
        generator: random.Generator | None = None,
    ):
        super().__init__()
        q = as_queue(q)
        self.in_channels = shapes.size(in_channels, "Conv2d: in_channels")
        self.out_channels = shapes.size(out_channels, "Conv2d: out_channels")
        self.groups = shapes.size(groups, "Conv2d: groups", minimum=1)
        self.kernel_size = shapes.pair(kernel_size, "Conv2d: kernel_size", minimum=1)
        self.stride = shapes.pair(stride, "Conv2d: stride", minimum=1)
        self.padding = shapes.pair(padding, "Conv2d: padding", minimum=0)
        self.dilation = shapes.pair(dilation, "Conv2d: dilation", minimum=1)
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(
                f"Conv2d: in_channels {in_channels} and out_channels {out_channels} must be divisible "
                f"by groups {groups}"
            )
        shape = (self.out_channels, self.in_channels // self.groups, *self.kernel_size)
        self.weight = Parameter(init.kaiming_uniform(q, shape, dtype=dtype, generator=generator))
        fan_in, _ = init.fans(shape)
        self.bias = (
            Parameter(init.uniform(q, (self.out_channels,), 1.0 / math.sqrt(fan_in), dtype, generator))
            if bias
            else None
        )

    def forward(self, x: Node, activation: str | None = None) -> Node:
        return ag.conv2d(
            x,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
            activation=activation,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}"
        )


class BatchNorm2d(Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over (N, H, W) per channel of (N, C, H, W).

    Training uses batch statistics and updates running_mean/running_var (momentum, unbiased var);
    eval uses the running statistics. weight = 1, bias = 0 initially. A PyTorch state_dict loads as it is:
    its num_batches_tracked (used only by PyTorch's momentum=None) is accepted and ignored."""

    foreign_state_keys = ("num_batches_tracked",)

    def __init__(
        self,
        q: Any,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        dtype: Any = "float32",
    ):
        super().__init__()
        q = as_queue(q)
        num_features = shapes.size(num_features, "BatchNorm: num_features")
        self.num_features, self.eps, self.momentum = num_features, float(eps), float(momentum)
        self.weight = Parameter(init.ones(q, (num_features,), dtype)) if affine else None
        self.bias = Parameter(init.zeros(q, (num_features,), dtype)) if affine else None
        self.track_running_stats = track_running_stats
        if track_running_stats:
            self.register_buffer("running_mean", init.zeros(q, (num_features,), dtype))
            self.register_buffer("running_var", init.ones(q, (num_features,), dtype))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)

    def forward(self, x: Node, activation: str | None = None) -> Node:
        training = self.training or not self.track_running_stats
        return ag.batch_norm(
            x,
            self.weight,
            self.bias,
            self.running_mean,
            self.running_var,
            training,
            self.momentum,
            self.eps,
            activation=activation,
        )

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(BatchNorm2d):
    """BatchNorm2d's layer under PyTorch's name for (N, C) and (N, C, L) inputs (the op normalises axis 1
    of (N, C, *) either way); its own class so repr, profiler scopes and isinstance name it."""


class LayerNorm(Module):
    """Normalise over the trailing `normalized_shape` dims, then * weight + bias (ones, zeros)."""

    def __init__(
        self,
        q: Any,
        normalized_shape: Any,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        dtype: Any = "float32",
    ):
        super().__init__()
        q = as_queue(q)
        shape = _normalized_shape(normalized_shape)
        self.normalized_shape, self.eps = shape, float(eps)
        self.weight = Parameter(init.ones(q, shape, dtype)) if elementwise_affine else None
        self.bias = Parameter(init.zeros(q, shape, dtype)) if elementwise_affine and bias else None

    def forward(self, x: Node) -> Node:
        return ag.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight over the trailing dims."""

    def __init__(self, q: Any, normalized_shape: Any, eps: float = 1e-6, dtype: Any = "float32"):
        super().__init__()
        shape = _normalized_shape(normalized_shape)
        self.normalized_shape, self.eps = shape, float(eps)
        self.weight = Parameter(init.ones(as_queue(q), shape, dtype))

    def forward(self, x: Node) -> Node:
        return ag.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def fusable(self, x: Node) -> bool:
        """Whether the next linear layer may normalize x itself (netcl.ops.rms_norm_linear: one launch a
        decode step instead of two): over one axis, x in the weight's dtype, outside a gradient recording
        (the fused product has no backward) and outside autocast (which would cast the norm's inputs)."""
        return (len(self.normalized_shape) == 1 and not ag.is_recording() and autocast.active() is None
                and as_node(x).value.dtype == self.weight.value.dtype)


class Embedding(Module):
    """Rows of a (num_embeddings, embedding_dim) table, W ~ N(0, 1): ids (...) -> (..., embedding_dim)."""

    def __init__(
        self,
        q: Any,
        num_embeddings: int,
        embedding_dim: int,
        dtype: Any = "float32",
        generator: random.Generator | None = None,
    ):
        super().__init__()
        self.num_embeddings = shapes.size(num_embeddings, "Embedding: num_embeddings")
        self.embedding_dim = shapes.size(embedding_dim, "Embedding: embedding_dim")
        self.weight = Parameter(
            init.normal(
                as_queue(q), (self.num_embeddings, self.embedding_dim), dtype=dtype, generator=generator
            )
        )

    def forward(self, ids: Any) -> Node:
        return ag.embedding(self.weight, ids)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Dropout(Module):
    """Zero elements with probability p in training (scaling the rest by 1/(1-p)); identity in eval.
    Masks come from a Philox Generator (default: netcl.ops.random.default_generator)."""

    def __init__(self, p: float = 0.5, generator: random.Generator | None = None):
        super().__init__()
        self.p = _probability(p, "Dropout probability")
        self.generator = generator

    def forward(self, x: Node) -> Node:
        gen = self.generator if self.generator is not None else random.default_generator
        return ag.dropout(x, self.p, self.training, generator=gen)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class MaxPool2d(Module):
    """Window maxima over (N, C, H, W); stride defaults to the kernel size."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        ceil_mode: bool = False,
    ):
        super().__init__()
        self.kernel_size = shapes.pair(kernel_size, "MaxPool2d: kernel_size", minimum=1)
        self.stride = (
            self.kernel_size if stride is None else shapes.pair(stride, "MaxPool2d: stride", minimum=1)
        )
        self.padding = shapes.pair(padding, "MaxPool2d: padding", minimum=0)
        self.dilation = shapes.pair(dilation, "MaxPool2d: dilation", minimum=1)
        self.ceil_mode = ceil_mode

    def forward(self, x: Node) -> Node:
        return ag.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}"


class AvgPool2d(Module):
    """Window means over (N, C, H, W)."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ):
        super().__init__()
        self.kernel_size = shapes.pair(kernel_size, "AvgPool2d: kernel_size", minimum=1)
        self.stride = (
            self.kernel_size if stride is None else shapes.pair(stride, "AvgPool2d: stride", minimum=1)
        )
        self.padding = shapes.pair(padding, "AvgPool2d: padding", minimum=0)
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Node) -> Node:
        return ag.avg_pool2d(
            x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad
        )


class AdaptiveAvgPool2d(Module):
    """Average to a fixed (OH, OW) whatever the input size."""

    def __init__(self, output_size: Any):
        super().__init__()
        self.output_size = shapes.pair(output_size, "AdaptiveAvgPool2d: output_size", minimum=1)

    def forward(self, x: Node) -> Node:
        return ag.adaptive_avg_pool2d(x, self.output_size)


class Flatten(Module):
    """Merge dims start_dim..end_dim: (N, C, H, W) -> (N, C*H*W) by default (a view)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim = shapes.size(start_dim, "Flatten: start_dim", minimum=None)
        self.end_dim = shapes.size(end_dim, "Flatten: end_dim", minimum=None)

    def forward(self, x: Node) -> Node:
        return ag.flatten(as_node(x), self.start_dim, self.end_dim)


class Identity(Module):
    def forward(self, x: Node) -> Node:
        return x


class ReLU(Module):
    """max(x, 0). After Linear/Conv2d/BatchNorm2d in a Sequential it is fused into that op."""

    fusable = "relu"

    def forward(self, x: Node) -> Node:
        return ag.relu(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = float(negative_slope)

    def forward(self, x: Node) -> Node:
        return ag.leaky_relu(x, self.negative_slope)


class GELU(Module):
    """x Phi(x) (approximate='none') or the tanh approximation."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Node) -> Node:
        return ag.gelu(x, self.approximate)


class SiLU(Module):
    def forward(self, x: Node) -> Node:
        return ag.silu(x)


class Tanh(Module):
    def forward(self, x: Node) -> Node:
        return ag.tanh(x)


class Sigmoid(Module):
    def forward(self, x: Node) -> Node:
        return ag.sigmoid(x)


class Softmax(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Node) -> Node:
        return ag.softmax(x, self.dim)


_FUSES_RELU = (Linear, Conv2d, BatchNorm2d)


class Sequential(Module):
    """Modules applied in order; children are named '0', '1', ... (state_dict keys '0.weight').

    A ReLU right after a Linear, Conv2d or BatchNorm2d runs inside that op's kernel (one launch)."""

    def __init__(self, *modules: Module | Mapping[str, Module]):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], Mapping):  # Sequential(OrderedDict(name=module))
            for name, m in modules[0].items():
                if not isinstance(m, Module):
                    raise TypeError(f"Sequential takes Modules, entry {name!r} is {type(m).__name__}")
                self.add_module(name, m)
            return
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential takes Modules, argument {i} is {type(m).__name__}")
            self._modules[str(i)] = m
        structure_changed()

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, m: Module) -> Sequential:
        if not isinstance(m, Module):
            raise TypeError(f"Sequential.append takes a Module, got {type(m).__name__}")
        self._modules[str(len(self._modules))] = m
        structure_changed()
        return self

    def forward(self, x: Any) -> Any:
        mods = list(self._modules.values())
        i = 0
        while i < len(mods):
            m = mods[i]
            nxt = mods[i + 1] if i + 1 < len(mods) else None
            if isinstance(nxt, ReLU) and isinstance(m, _FUSES_RELU):
                x = m(x, activation="relu")
                i += 2
                continue
            x = m(x)
            i += 1
        return x


class ModuleList(Module):
    """A list of Modules registered as children '0', '1', ..."""

    def __init__(self, modules: Any = ()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m: Module) -> ModuleList:
        if not isinstance(m, Module):
            raise TypeError(f"ModuleList takes Modules, got {type(m).__name__}")
        self._modules[str(len(self._modules))] = m
        structure_changed()
        return self

    def extend(self, modules: Any) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())
