"""netcl.jit: the elementwise expression IR, its OpenCL C generator, kernel cache and fusion."""

from netcl.jit import ir
from netcl.jit.lazy import Pending, TraceError, trace_mode
from netcl.jit.runner import run_elementwise

__all__ = ["Pending", "TraceError", "ir", "run_elementwise", "trace_mode"]
