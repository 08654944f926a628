"""Plan, build (cached) and launch one elementwise kernel for a list of output expressions.

`run_elementwise([(expr, out_tensor), ...])` launches any list of outputs of one shape (leaves are read in
place through their own strides, broadcast to that shape); it flattens the graph per call. `run_keyed` is
the path of one pending result whose expression carries its structural key (netcl.jit.lazy): the plan is
looked up by that key, and only a new key flattens.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl import kernels
from netcl.config import jit_knob
from netcl.core import capture, launch_labels
from netcl.core import dtypes as core_dtypes
from netcl.core.tensor import Tensor, _coalesce, contiguous_strides
from netcl.errors import NetclError
from netcl.jit import codegen, ir


@dataclass(frozen=True)
class LaunchKnobs:
    """The NETCL_EW_* knobs (config.JIT_KNOBS): vec, float4 loads/stores per work-item on GPUs; GPU launches
    of work-groups of `local` items, `groups_per_cu` > 0 capping the grid at that many groups per compute
    unit (grid-stride loop; 0 = one vector step per work-item: no cap, the hardware scheduler balances many
    small groups, no tail wave when registers limit occupancy); `aligned`, aligned vector loads (pointer
    casts) when every contiguous operand's offset is a multiple of the vector width."""

    vec: int
    local: int
    groups_per_cu: int
    aligned: bool


_knobs: LaunchKnobs | None = None


def knobs() -> LaunchKnobs:
    """The launch knobs, read from the environment on first use rather than at import: a bad value is then
    an error of the first launch, naming the variable, and `import netcl` never fails on one."""
    global _knobs
    if _knobs is None:
        _knobs = LaunchKnobs(jit_knob("NETCL_EW_VEC"), jit_knob("NETCL_EW_LOCAL"),
                             jit_knob("NETCL_EW_GROUPS_PER_CU"), bool(jit_knob("NETCL_EW_ALIGNED")))
    return _knobs


VEC_CPU = 8  # wide loads for PoCL when the graph is only cheap arithmetic ...
# ... but never wider than 32 bytes (double4, long4). PoCL 3.0 (LLVM 14) on AVX-512 CPUs that LLVM 14
# does not know (AMD Zen 4, "znver3" to it) links the AVX-512 kernel library into code generated for
# a CPU without AVX-512, and every library call taking or returning a 512-bit vector (convert_double8,
# vload16, vstore16, fma on float16, ...) is miscompiled or aborts LLVM ("Do not know how to scalarize").
CPU_VECTOR_BYTES = 32
# ops that PoCL turns into scalar library calls: with them, one element per work-item lets PoCL's
# work-group vectoriser use its vector math instead (measured 2x faster than unrolled lanes)
_SCALAR_MATH = {"exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "erf", "sigmoid", "gelu",
                "gelu_tanh", "silu", "softplus", "pow", "atan2", "sqrt", "rsqrt"}
_INT_LIMIT = 2**31 - 1
_first = operator.itemgetter(0)



def broadcast_strides(t: Tensor, shape: tuple[int, ...]) -> list[int]:
    """Element strides of `t` seen as `shape` (right-aligned broadcasting: size-1 axes get 0)."""
    lead = len(shape) - t.ndim
    out = []
    for d in range(len(shape)):
        ld = d - lead
        if ld < 0 or t.shape[ld] == 1:
            out.append(0)
        else:
            out.append(t.strides[ld])
    return out


def _extent(offset: int, shape: list[int], strides: list[int]) -> int:
    return abs(offset) + sum((s - 1) * abs(st) for s, st in zip(shape, strides))


def _overlaps(a: Tensor, b: Tensor) -> bool:
    (a_lo, a_hi), (b_lo, b_hi) = a._span(), b._span()
    return a_lo <= b_hi and b_lo <= a_hi


def _kind(strides: list[int], contiguous: tuple[int, ...], shape: list[int]) -> str:
    if all(st == 0 or s == 1 for st, s in zip(strides, shape)):
        return "s"
    if all(st == c or s == 1 for st, c, s in zip(strides, contiguous, shape)):
        return "c"
    return "g"


def launch_config(device: Any, work: int) -> tuple[int, int | None]:
    """(global size, local size) of a 1-D grid-stride launch over `work` items."""
    caps = device.capabilities
    if caps.kind == "gpu":
        k = knobs()
        local = k.local
        groups = max(1, -(-work // local))
        if k.groups_per_cu > 0:
            groups = min(groups, caps.compute_units * k.groups_per_cu)
        return groups * local, local
    # CPU (PoCL): one step per work-item; PoCL runs work-groups as vectorised loops over work-items
    # (a grid-stride loop inside the kernel defeats that: measured 10x slower)
    return max(1, work), None


def choose_vec(device: Any, desc: tuple, dtypes: list[np.dtype]) -> int:
    """Elements per vector load/store of a flat elementwise kernel over operands of `dtypes`."""
    if device.capabilities.kind == "gpu":
        # 16 bytes a lane's load for 2-byte floats too: float16/bfloat16-only kernels take twice the lanes
        # (8 halves = one 16-byte vloada_half8), as float32 takes float4
        if dtypes and all(dt in (core_dtypes.float16, core_dtypes.bfloat16) for dt in dtypes):
            return min(16, 2 * knobs().vec)
        return knobs().vec
    if any(d[0] in _SCALAR_MATH for d in desc):
        return 1
    widest = max((ir.COMPUTE_SIZE[dt] for dt in dtypes), default=4)
    return max(1, min(VEC_CPU, CPU_VECTOR_BYTES // widest))


def get_kernel(device: Any, key: tuple, leaf_dtypes: list[np.dtype], out_dtypes: list[np.dtype]) -> Any:
    """The elementwise kernel of structural `key` (netcl.kernels keeps it; the source is generated once)."""
    defines = {"USE_FP64": None} if codegen.needs_fp64(key[0][0], leaf_dtypes, out_dtypes) else {}
    return kernels.generated(device, key, lambda: codegen.elementwise_source(key), "jit_elementwise",
                             **defines).kernel("ew")


def memo_params_args(params: list[tuple[Any, np.dtype]], memo: list) -> list[Any]:
    """The kernel arguments of runtime params. They are usually the same Python objects call after call
    (literals): memo[0] keeps the last objects and their numpy scalars, reused when every value is
    the identical object of last time."""
    raw = list(map(_first, params))
    last = memo[0]
    if last is not None and len(last[0]) == len(raw) and all(map(operator.is_, raw, last[0])):
        return last[1]
    conv = _params_args(params)
    memo[0] = (raw, conv)
    return conv


def _params_args(params: list[tuple[Any, np.dtype]]) -> list[Any]:
    args = []
    for value, dt in params:
        if dt == ir.F16:
            value = np.float16(value)
        elif dt == ir.BF16:
            value = core_dtypes.bfloat16.type(value)
        with np.errstate(all="ignore"):
            args.append(ir.ARG_TYPE[dt](value))
    return args


def run_elementwise(outputs: list[tuple[ir.Node, Tensor]]) -> None:
    """Compute every `expr` into its `out` tensor (same shape for all) in one kernel launch.

    The launch plan (kernel, by-value layout arguments, geometry) is cached per structural key:
    the graph description plus every operand's shape/strides/offset/dtype. A repeat of the same
    structure only collects buffers (and converts params whose values changed) and enqueues."""
    if len(outputs) == 1:
        expr, out = outputs[0]
        out_tensors = [out]
        (desc, out_pos), leaves, params = codegen.flatten([expr])
    else:
        out_tensors = [t for _, t in outputs]
        (desc, out_pos), leaves, params = codegen.flatten([e for e, _ in outputs])
    shape = out_tensors[0].shape
    # an output sharing memory with a leaf read through another mapping must not race with it
    for i, t in enumerate(leaves):
        st = t._storage
        for o in out_tensors:
            if st is o._storage and _overlaps(t, o):
                # (the same mapping: each element read where it is written; a size-1 axis's stride is no
                # part of it, which broadcast_strides gives as 0: `p += 1` on a (1,) tensor needs no copy)
                same = t.offset == o.offset and all(
                    a == b or n == 1 for a, b, n in zip(broadcast_strides(t, shape), o.strides, shape))
                if not same:
                    leaves[i] = t.clone()
                    break
    queue = out_tensors[0].queue
    device = queue.device
    pkey = ("ew", id(device), desc, out_pos, shape,
            tuple([(o.strides, o.offset, o.dtype) for o in out_tensors]),
            tuple([(t.shape, t.strides, t.offset, t.dtype) for t in leaves]))
    plan = capture.plans.get(pkey)
    if plan is None:
        if math.prod(shape) == 0:
            return
        codegen.check_no_inputs(desc)
        plan = capture.plans.put(pkey, _plan(device, shape, desc, out_pos, out_tensors, leaves, len(params)))
    launch, memo = plan
    values: list[Any] = [o.buffer for o in out_tensors]
    values += [t._storage.buffer for t in leaves]
    if params:
        values += memo_params_args(params, memo)
    if capture.declaring():
        launch_labels.work(*declared_work(desc, math.prod(shape), leaves, sum(o.nbytes for o in out_tensors)))
    launch(queue, *values)


def run_keyed(expr: ir.Node, out: Tensor, leaves: tuple[Tensor, ...], key: tuple, params: tuple) -> None:
    """Allocate `out`, a new contiguous tensor with no storage yet, and compute `expr` into it by the plan
    of `expr`'s structural key (netcl.jit.lazy keeps it on the nodes, with the leaves and params in slot
    order): a repeat looks up one key and launches with the buffers and params; only a new key flattens the
    graph. The key covers the leaves' layouts; the output's is fixed by its shape and the expression's
    dtype."""
    queue = out.queue
    shape = out.shape
    pkey = ("ew", id(queue.device), key, shape)  # (run_elementwise's keys are longer: no clash)
    plan = capture.plans.get(pkey)
    if plan is None:
        nbytes = out.nbytes
        if math.prod(shape) == 0:
            out._storage = queue.device.pool.allocate(nbytes, queue)
            return
        (desc, out_pos), flat_leaves, flat_params = codegen.flatten([expr])
        if ([id(t) for t in flat_leaves] != [id(t) for t in leaves]
                or [(id(v), dt) for v, dt in flat_params] != [(id(v), dt) for v, dt in params]):
            raise NetclError(f"internal: the structural key of {expr!r} disagrees with codegen.flatten")
        codegen.check_no_inputs(desc)
        launch, memo = _plan(queue.device, shape, desc, out_pos, [out], flat_leaves, len(flat_params))
        plan = capture.plans.put(pkey, (launch, memo, desc, nbytes))
    launch, memo, desc, nbytes = plan
    storage = out._storage = queue.device.pool.allocate(nbytes, queue)
    values: list[Any] = [storage.buffer]  # (new storage: nothing reads it, no before_access hook to run)
    values += [t._storage.buffer for t in leaves]
    if params:
        values += memo_params_args(params, memo)
    if capture.declaring():
        launch_labels.work(*declared_work(desc, math.prod(shape), leaves, nbytes))
    launch(queue, *values)


def declared_work(desc: tuple, n: int, leaves: list[Tensor], out_bytes: int) -> tuple[float, float]:
    """(FLOPs, compulsory bytes) of a generated kernel over `n` elements, for the profiler: one operation per
    element for each node of the expression with operands, every leaf read and every output written once."""
    ops = sum(1 for d in desc if d[1])
    return float(ops * n), float(out_bytes + sum(t.nbytes for t in leaves))


def _plan(device: Any, shape: tuple[int, ...], desc: tuple, out_pos: tuple, out_tensors: list[Tensor],
          leaves: list[Tensor], n_params: int) -> tuple:
    """(the launch's Plan, the memo of its params' last values): the kernel, its layout arguments (offsets,
    strides, sizes: static), the buffers of the outputs and leaves and the `n_params` runtime params (in that
    order: the plan's dynamic arguments), the geometry."""
    n = math.prod(shape)
    has_index = any(d[0] == "index" for d in desc)
    out_strides = [list(o.strides) for o in out_tensors]
    leaf_strides = [broadcast_strides(t, shape) for t in leaves]
    if has_index:
        cshape = list(shape) or [1]
        sets = [s or [0] for s in out_strides + leaf_strides]
    else:
        cshape, sets = _coalesce(shape, *out_strides, *leaf_strides)
        if not cshape:
            cshape, sets = [1], [[1] for _ in sets]
    ndim = len(cshape)
    contig = contiguous_strides(cshape)
    out_sets, leaf_sets = sets[: len(out_tensors)], sets[len(out_tensors):]
    out_layouts = tuple((core_dtypes.token(o.dtype),
                         _kind(s, contig, cshape) if _kind(s, contig, cshape) != "s" else "g")
                        for o, s in zip(out_tensors, out_sets))
    leaf_layouts = tuple(
        (core_dtypes.token(t.dtype), _kind(s, contig, cshape)) for t, s in zip(leaves, leaf_sets)
    )
    all_flat = all(k != "g" for _, k in out_layouts + leaf_layouts) and not has_index
    vec = choose_vec(device, desc, [t.dtype for t in leaves + out_tensors]) if all_flat else 1
    if n < vec:
        vec = 1
    extents = [n] + [_extent(o.offset, cshape, s) for o, s in zip(out_tensors, out_sets)]
    extents += [_extent(t.offset, cshape, s) for t, s in zip(leaves, leaf_sets)]
    idx_t = "int" if max(extents) < _INT_LIMIT - 16 * 1024 * 1024 else "long"
    aligned = knobs().aligned and vec > 1 and all(
        t.offset % vec == 0 for t, (_, k) in zip(list(out_tensors) + list(leaves), out_layouts + leaf_layouts)
        if k == "c")
    key = ((desc, out_pos), leaf_layouts, out_layouts, ndim, vec, idx_t, aligned)
    kernel = get_kernel(device, key, [t.dtype for t in leaves], [o.dtype for o in out_tensors])
    it = np.int32 if idx_t == "int" else np.int64
    out_static = []
    for o, s, (_, kind) in zip(out_tensors, out_sets, out_layouts):
        out_static.append([it(o.offset)] + ([it(x) for x in s] if kind == "g" else []))
    leaf_static = []
    for t, s, (_, kind) in zip(leaves, leaf_sets, leaf_layouts):
        leaf_static.append([it(t.offset)] + ([it(x) for x in s] if kind == "g" else []))
    tail = [it(n)] + [it(d) for d in cshape]
    work = n // vec if vec > 1 else n
    gsize, lsize = launch_config(device, work)
    args: list[Any] = []
    buffers: list[int] = []
    for stat in out_static + leaf_static:
        buffers.append(len(args))
        args += [None, *stat]
    params = list(range(len(args), len(args) + n_params))
    args += [None] * n_params + tail
    launch = kernel.plan((gsize,), None if lsize is None else (lsize,), args, buffers + params)
    return launch, [None]
