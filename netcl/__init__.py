"""netcl: deep learning from first principles on PyOpenCL, on any OpenCL device."""

# importing ops installs Tensor's operators and kernel-backed methods; profiling hands the launch path its
# process-wide profile (NETCL_PROFILE, queues made with event timing)
from netcl import errors, ops, profiling  # noqa: F401
from netcl.core.device import manager
from netcl.core.memory import memory_summary
from netcl.core.tensor import Tensor
from netcl.ops.determinism import get_deterministic, set_deterministic
from netcl.ops.gemm import get_matmul_precision, set_matmul_precision
from netcl.ops.random import manual_seed

__version__ = "0.1.0"
__all__ = ["Tensor", "errors", "get_deterministic", "get_matmul_precision", "manager", "manual_seed",
           "memory_summary", "set_deterministic", "set_matmul_precision", "__version__"]
