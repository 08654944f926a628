"""2-D convolution (NCHW): conv2d with its backward passes, conv_transpose2d, and the algorithm pick.

Algorithms: 'direct' (register-blocked, barrier-free: the CPU shape), 'depthwise' (direct with one
channel per work-item row), 'winograd' (F(2x2,3x3) for 3x3 stride-1 dilation-1 groups-1),
'im2col' (im2col + the GEMM of netcl.ops.gemm). 'auto' picks by heuristic, after asking the
tuning database (netcl.kernels.tuning) when it exists. One idea per module:

- geometry: ConvParams (shapes, stride, padding, dilation, groups), the shared checks, the call caches;
- choice: the algorithm of every pass (forward, backward-input, backward-weight), tuned or by default;
- direct, winograd, im2col: the algorithms, each with the kernels of every pass it serves;
- forward: conv2d, conv2d_relu; backward: the input, weight and bias gradients;
- transposed: conv_transpose2d.
"""
# ruff: noqa: F401  (this module exists to re-export)
from netcl.ops.conv.backward import (
    conv2d_backward_bias,
    conv2d_backward_input,
    conv2d_backward_weight,
)
from netcl.ops.conv.choice import (
    PASS_ALGORITHMS,
    TUNE_FAMILIES,
    TUNE_FAMILY,
    WINOGRAD_MIN_CHANNELS_CPU,
    WINOGRAD_MIN_FLOPS,
    WINOGRAD_MIN_FLOPS_CPU,
    record_algorithm,
    select_algorithm,
    winograd_applicable,
    winograd_pays,
)
from netcl.ops.conv.forward import conv2d, conv2d_relu
from netcl.ops.conv.geometry import ACTIVATIONS, ALGORITHMS, ConvParams
from netcl.ops.conv.transposed import conv_transpose2d
from netcl.ops.conv.winograd import winograd_transform_weight

__all__ = [
    "conv2d",
    "conv2d_backward_bias",
    "conv2d_backward_input",
    "conv2d_backward_weight",
    "conv2d_relu",
    "conv_transpose2d",
]
