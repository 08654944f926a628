"""netcl: deep learning from first principles on PyOpenCL, on any OpenCL device."""

from netcl import errors, ops  # noqa: F401  (importing ops installs Tensor's operators and kernel-backed methods)
from netcl.core.device import manager
from netcl.core.memory import memory_summary
from netcl.core.tensor import Tensor
from netcl.ops.determinism import get_deterministic, set_deterministic
from netcl.ops.gemm import get_matmul_precision, set_matmul_precision
from netcl.ops.random import manual_seed

__version__ = "0.1.0"
__all__ = ["Tensor", "errors", "get_deterministic", "get_matmul_precision", "manager", "manual_seed",
           "memory_summary", "set_deterministic", "set_matmul_precision", "__version__"]
