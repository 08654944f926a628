"""netcl.jit: the elementwise expression IR, its OpenCL C generator, kernel cache and fusion.

- `netcl.jit.ir`: IR nodes and builders (dtype promotion); `codegen`: IR -> OpenCL C;
  `run_elementwise([(expr, out), ...])`: one launch for several same-shape outputs.
- `fuse`: decorator tracing an elementwise function into one kernel, with `.backward(inputs,
  grad_outputs)` computed by one more kernel (symbolic differentiation, `autodiff.vjp`).
- Automatic fusion (netcl.jit.lazy): elementwise ops return pending tensors; a chain runs as one
  launch when its result is needed, its plan found by the structural key the nodes carry.
  NETCL_FUSION=0 turns it off.
"""

from netcl.core import launch_labels
from netcl.jit import autodiff, codegen, ir
from netcl.jit.autodiff import vjp
from netcl.jit.fuse import FusedFunction, fuse, substitute
from netcl.jit.ir import TraceError
from netcl.jit.lazy import Pending, trace_mode
from netcl.jit.runner import run_elementwise

__all__ = ["FusedFunction", "Pending", "TraceError", "autodiff", "codegen", "fuse", "ir", "run_elementwise",
           "substitute", "trace_mode", "vjp"]

launch_labels.walks_through(__name__)  # netcl.profiling: the JIT's launches are the ops' that call it
