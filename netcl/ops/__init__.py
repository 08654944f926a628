"""Host-side op entry points: shape checks, dtype rules, kernel choice (re-exported here)."""
from netcl.ops.conv import conv2d, conv2d_relu, conv2d_backward_input, conv2d_backward_weight, conv2d_backward_bias, conv_transpose2d  # noqa: E501
