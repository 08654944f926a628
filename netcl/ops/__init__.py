"""Host-side op entry points: shape checks, dtype rules, kernel choice (re-exported here).

Importing this package also installs Tensor's methods that launch kernels (operators, copies, random
numbers: netcl.ops.operators, netcl.ops.copy, netcl.ops.random); `import netcl` does it.
"""
# ruff: noqa: F401, E501  (this module exists to re-export)
from netcl.ops import copy, operators, random
from netcl.ops.conv import (
    conv2d,
    conv2d_backward_bias,
    conv2d_backward_input,
    conv2d_backward_weight,
    conv2d_relu,
    conv_transpose2d,
)
from netcl.ops.elementwise import *  # noqa: F403
from netcl.ops.fused import linear_relu, matmul_bias_relu
from netcl.ops.gemm import linear, matmul, matmul_epilogue
from netcl.ops.movement import *  # noqa: F403
from netcl.ops.norm import (
    batch_norm,
    batch_norm_backward,
    batch_norm_relu,
    group_norm,
    group_norm_backward,
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
)
from netcl.ops.pool import (
    adaptive_avg_pool2d,
    adaptive_avg_pool2d_backward,
    avg_pool2d,
    avg_pool2d_backward,
    global_avg_pool2d,
    max_pool2d,
    max_pool2d_backward,
)
from netcl.ops.random import rand, randint, randn
from netcl.ops.reduce import *  # noqa: F403

copy.install()
operators.install()
random.install()
