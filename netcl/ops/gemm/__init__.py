"""Matrix multiplication on the GEMM kernels of kernels/gemm_*.cl: matmul, matmul_epilogue, linear.

Operands are read in place whatever their layout (transposed views included); batch dimensions
broadcast like NumPy's matmul. One idea per module:

- api: the entry points, netcl's choice of kernel, and the replay of repeated calls;
- problem: operands, layouts and epilogue, checked before anything is enqueued;
- variants: the four kernels, their tile parameters per device class, tuning, fallback chains;
- launch: one problem onto one kernel (defines, geometry, named arguments and replay slots);
- splitk: K split across work-groups when M x N alone cannot fill the device;
- int8: weight-only int8 (per-channel scales) linear layers, dequantized on the fly; the decode-step
  linear layers on the gemv kernel (SwiGLU's gate and up, an RMSNorm in the prologue);
- chain: dependent GEMVs of a decode step in one launch, phase after phase (gemv_chain);
- matrix units: the mma variant (NVIDIA mma.sync through inline PTX), set_matmul_precision.
"""
# ruff: noqa: F401  (this module exists to re-export)
from netcl.ops.gemm.api import (
    gemm,
    linear,
    linear_param_grads,
    matmul,
    matmul_epilogue,
    matmul_relu_mask,
    matmul_rowsum,
    matmul_wide,
)
from netcl.ops.gemm.chain import ChainStep, gemv_chain
from netcl.ops.gemm.int8 import dequantize_int8, linear_glu, linear_int8, quantize_int8, rms_norm_linear
from netcl.ops.gemm.problem import flops
from netcl.ops.gemm.variants import (
    ACTIVATIONS,
    DEFAULTS,
    VARIANTS,
    choose_variant,
    default_params,
    device_class,
    get_matmul_precision,
    matrix_units,
    set_matmul_precision,
    tiled_block,
    tiled_shape_class,
    tuned_params,
    usable_params,
)

__all__ = [
    "ACTIVATIONS",
    "DEFAULTS",
    "VARIANTS",
    "choose_variant",
    "default_params",
    "device_class",
    "flops",
    "get_matmul_precision",
    "gemm",
    "linear",
    "linear_param_grads",
    "matmul",
    "matmul_epilogue",
    "matmul_relu_mask",
    "matmul_rowsum",
    "matmul_wide",
    "matrix_units",
    "set_matmul_precision",
    "tiled_block",
    "tiled_shape_class",
    "tuned_params",
    "usable_params",
]
