"""Host-side op entry points: shape checks, dtype rules, kernel choice (re-exported here)."""
# ruff: noqa: F401  (this module exists to re-export)
from netcl.ops.conv import conv2d, conv2d_relu, conv2d_backward_input, conv2d_backward_weight, conv2d_backward_bias, conv_transpose2d  # noqa: E501
from netcl.ops.pool import max_pool2d, max_pool2d_backward, avg_pool2d, avg_pool2d_backward, adaptive_avg_pool2d, adaptive_avg_pool2d_backward, global_avg_pool2d  # noqa: E501
from netcl.ops.elementwise import *  # noqa: F401,F403,E402  (JIT/elementwise engineer)
from netcl.ops.movement import *  # noqa: F401,F403,E402  (JIT/elementwise engineer)
from netcl.ops.norm import batch_norm, batch_norm_relu, batch_norm_backward, layer_norm, layer_norm_backward, rms_norm, rms_norm_backward, group_norm, group_norm_backward  # noqa: E501
from netcl.ops.matmul import matmul, matmul_epilogue, linear  # noqa: E402  (GEMM engineer)
from netcl.ops.fused import linear_relu, matmul_bias_relu  # noqa: E402  (GEMM engineer)
from netcl.ops.reduce import *  # noqa: F401,F403,E402  (JIT/elementwise engineer)
