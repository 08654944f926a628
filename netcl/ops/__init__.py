"""Host-side op entry points: shape checks, dtype rules, kernel choice (each module's __all__ is
re-exported here).

Importing this package also installs Tensor's methods that launch kernels (operators, copies, random
numbers: netcl.ops.operators, netcl.ops.copy, netcl.ops.random); `import netcl` does it.
"""
# ruff: noqa: F401  (this module exists to re-export)
from netcl.core import launch_labels
from netcl.ops import copy, loss, operators, random  # (loss: its declarations, netcl.ops.declaration)
from netcl.ops.attention import *  # noqa: F403
from netcl.ops.conv import *  # noqa: F403
from netcl.ops.determinism import *  # noqa: F403
from netcl.ops.elementwise import *  # noqa: F403
from netcl.ops.fused import *  # noqa: F403
from netcl.ops.gemm import (  # (the package stays netcl.ops.gemm: no star)
    dequantize_int8,
    linear,
    linear_glu,
    linear_int8,
    matmul,
    matmul_epilogue,
    quantize_int8,
    rms_norm_linear,
)
from netcl.ops.kmeans import *  # noqa: F403
from netcl.ops.kvcache import *  # noqa: F403
from netcl.ops.movement import *  # noqa: F403
from netcl.ops.norm import *  # noqa: F403
from netcl.ops.pool import *  # noqa: F403
from netcl.ops.random import rand, randint, randn
from netcl.ops.reduce import *  # noqa: F403
from netcl.ops.rope import *  # noqa: F403
from netcl.ops.sampling import *  # noqa: F403
from netcl.ops.sorting import *  # noqa: F403

copy.install()
operators.install()
random.install()

launch_labels.names_ops(__name__)  # netcl.profiling: the outermost ops frame on a launch's stack names its op
