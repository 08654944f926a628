"""Rotary position embeddings (kernels/rope.cl): the cos/sin tables and the rotation of (B, H, S, D) heads.

Rotation is not a same-index elementwise map (each output reads its pair partner) and the position offset
of cached decoding comes from a device tensor, so it is a small kernel; its backward is the same kernel
rotating by -theta (`inverse=True`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import pyopencl.cltypes as cltypes

from netcl import kernels
from netcl.core import capture, dtypes, shapes
from netcl.core.backend import as_queue, device_check
from netcl.core.memory import format_bytes
from netcl.core.tensor import Tensor, check_same_queue, empty_in_order
from netcl.errors import DTypeError, OutOfMemoryError, ShapeError
from netcl.ops.declaration import Layout, OpDecl, declare

__all__ = ["rope", "rope_inv_freq", "rope_qkv_cache", "rope_scaling", "rope_tables", "rope_tables_host_bytes"]

ROPE_PAIRINGS = {"half": "ROPE_HALF", "interleaved": "ROPE_INTERLEAVED"}
# frequency scalings (Hugging Face's rope_type names) and the keys each needs: static rescalings of the
# inverse frequencies, so the tables stay one (max_len, D/2) pair and nothing changes in the kernel
ROPE_SCALINGS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}

_POSITION_CHECK = device_check("rope: position {value} (row {row} of (B*H*S)) is outside [0, {limit}), the "
                               "positions the rotary table (max_len) or the output holds")

_tables: dict[tuple, tuple[Tensor, Tensor]] = {}
_zeros: dict[int, Tensor] = {}


def _table_dtype(dtype: np.dtype) -> np.dtype:
    """Tables hold the kernel's arithmetic type: float64 for float64 heads, else float32."""
    return dtypes.float64 if dtype == dtypes.float64 else dtypes.float32


def rope_scaling(scaling: Any) -> dict[str, Any] | None:
    """A checked copy of a frequency scaling: None, {"rope_type": "linear", "factor": f} (positions divided
    by f) or {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"} (Llama 3.1's: long wavelengths divided by factor, short ones kept,
    a smooth blend between). Keys beyond the type's are an error naming them."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise TypeError(
            f"rope scaling must be a dict with a 'rope_type' or None, got {type(scaling).__name__}"
        )
    kind = scaling.get("rope_type")
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"rope scaling: rope_type must be one of {sorted(ROPE_SCALINGS)}, got {kind!r}")
    want = ROPE_SCALINGS[kind]
    missing = [k for k in want if k not in scaling]
    unknown = sorted(set(scaling) - set(want) - {"rope_type"})
    if missing or unknown:
        raise ValueError(
            f"rope scaling {kind!r} takes the keys {list(want)}; missing {missing}, unknown {unknown}"
        )
    out: dict[str, Any] = {"rope_type": kind}
    for k in want:
        v = scaling[k]
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float, np.integer, np.floating))
            or not math.isfinite(v)
            or v <= 0
        ):
            raise ValueError(f"rope scaling {kind!r}: {k} must be a positive finite number, got {v!r}")
        out[k] = int(v) if k == "original_max_position_embeddings" else float(v)
    if kind == "linear" and out["factor"] < 1:
        raise ValueError(f"rope scaling 'linear': factor must be >= 1, got {out['factor']}")
    if kind == "llama3" and not (out["factor"] >= 1 and out["high_freq_factor"] > out["low_freq_factor"]):
        raise ValueError(
            f"rope scaling 'llama3': needs factor >= 1 and high_freq_factor > low_freq_factor, got {out}"
        )
    return out


def rope_inv_freq(
    dim: int, base: float, scaling: dict[str, Any] | None = None, dtype: Any = np.float32
) -> np.ndarray:
    """The inverse frequencies (dim // 2,) base^(-2i / dim), rescaled by `scaling` (see rope_scaling), in
    `dtype`'s arithmetic step by step as Hugging Face computes them (float32 for float32 models)."""
    dt = np.dtype(dtype)
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(dt) / dt.type(dim)
    powers = (float(base) ** exponents.astype(np.float64)).astype(
        dt
    )  # rounded once (torch's pow: within an ulp)
    inv_freq = (dt.type(1.0) / powers).astype(dt)
    scaling = rope_scaling(scaling)
    if scaling is None:
        return inv_freq
    factor = dt.type(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return (inv_freq / factor).astype(dt)
    # llama3: transformers' _compute_llama3_parameters operation for operation (torch's scalar / tensor is
    # the tensor's reciprocal times the scalar)
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = dt.type(old_len / low), dt.type(old_len / high)
    wavelen = ((dt.type(1) / inv_freq) * dt.type(2 * math.pi)).astype(dt)
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq).astype(dt)
    smooth = (((dt.type(1) / wavelen) * dt.type(old_len) - dt.type(low)) / dt.type(high - low)).astype(dt)
    smoothed = ((dt.type(1) - smooth) * scaled / factor + smooth * scaled).astype(dt)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(dt)


def rope_tables_host_bytes(max_len: int, dim: int, dtype: Any = np.float32) -> int:
    """Host bytes rope_tables takes at its peak to make the tables of heads of `dtype`: the angles, their
    float64 copy and cos/sin in float64, then the two tables in the kernel's type."""
    entries = max_len * (dim // 2)
    return entries * (2 * _table_dtype(dtypes.normalize(dtype)).itemsize + 16)


def rope_tables(q: Any, max_len: int, dim: int, base: float = 10000.0,
                dtype: Any = np.float32, scaling: dict[str, Any] | None = None) -> tuple[Tensor, Tensor]:
    """(cos, sin), each (max_len, dim // 2): angle[p, i] = p * inv_freq[i] (base^(-2i / dim), rescaled by
    `scaling`: see rope_scaling), for heads of `dtype`.

    Computed once per (queue, max_len, dim, base, dtype, scaling) and shared. For float32 heads the angles
    are float32 products of float32 inverse frequencies (as Hugging Face computes them), so logits match."""
    max_len = shapes.size(max_len, "rope_tables: max_len", minimum=1)
    dim = shapes.size(dim, "rope_tables: dim", minimum=2)
    if dim % 2:
        raise ShapeError(f"rope_tables: the rotated dimension must be even, got {dim}")
    if not (isinstance(base, (int, float, np.integer, np.floating)) and math.isfinite(base) and base > 1):
        raise ValueError(f"rope_tables: base must be a finite number above 1, got {base!r}")
    scaling = rope_scaling(scaling)
    table_dt = _table_dtype(dtypes.normalize(dtype))
    q = as_queue(q)
    key = (id(q), max_len, dim, float(base), table_dt, tuple(sorted(scaling.items())) if scaling else None)
    hit = _tables.get(key)
    if hit is not None and hit[0].queue is q:
        return hit
    inv_freq = rope_inv_freq(dim, base, scaling, table_dt)
    try:
        angles = np.arange(max_len, dtype=table_dt)[:, None] * inv_freq[None, :]
        cos = np.cos(angles.astype(np.float64)).astype(table_dt)
        sin = np.sin(angles.astype(np.float64)).astype(table_dt)
    except MemoryError:  # (numpy's _ArrayMemoryError): a context far past what the host holds
        raise OutOfMemoryError(
            f"rope_tables: the rotary tables of {max_len:,} positions x {dim // 2} pairs take "
            f"{format_bytes(rope_tables_host_bytes(max_len, dim, dtype))} of host memory to make, more than "
            f"it has; a model's max_seq_len sets the positions: give a smaller one") from None
    cos, sin = Tensor.from_host(q, cos), Tensor.from_host(q, sin)
    if len(_tables) >= 64:
        _tables.clear()
    _tables[key] = (cos, sin)
    return cos, sin


def _zero_offset(queue: Any) -> Tensor:
    t = _zeros.get(id(queue))
    if t is None or t.queue is not queue:
        t = _zeros[id(queue)] = Tensor.zeros(queue, (1,), np.int32)
    return t


def offset_args(op: str, offset: Tensor | None, batch: int, queue: Any) -> dict[str, Any]:
    """The kernel arguments (offsets, offset_off, offset_stride) of a position offset: None (0), or an
    int32 device Tensor of shape (1,) (one offset) or (B,) (one per batch row)."""
    if offset is None:
        zero = _zero_offset(queue)
        return dict(offsets=zero.buffer, offset_off=np.int64(0), offset_stride=np.int32(0))
    if not isinstance(offset, Tensor):
        raise DTypeError(f"{op}: offset must be an int32 device Tensor of shape (1,) or ({batch},), got "
                         f"{type(offset).__name__} (a Python int would be baked into a recorded step)")
    if offset.queue is not queue:
        raise ShapeError(f"{op}: offset lives on {offset.queue!r}, the tensors on {queue!r}")
    if offset.dtype != dtypes.int32 or offset.shape not in ((1,), (batch,)):
        raise ShapeError(f"{op}: offset must be an int32 Tensor of shape (1,) or ({batch},), got "
                         f"{offset.dtype} {offset.shape}")
    stride = offset.strides[0] if offset.shape[0] > 1 else 0
    return dict(offsets=offset.buffer, offset_off=np.int64(offset.offset), offset_stride=np.int32(stride))


def table_rows(t: Tensor) -> Tensor:
    """A rope table as the kernels read it, from its storage's first element: itself, or a copy of a view
    that starts elsewhere or is not contiguous."""
    return t if t.offset == 0 and t.is_contiguous() else t.clone()


def strides4(t: Tensor) -> np.ndarray:
    """A 4-D tensor's strides as the long4 kernel argument."""
    return _long4(tuple(t.strides))


@functools.lru_cache(maxsize=1024)
def _long4(values: tuple[int, ...]) -> np.ndarray:
    return cltypes.make_long4(*values)  # (a constructor eval, ~50 us: cached, the arrays are only read)


def rope(x: Tensor, cos: Tensor, sin: Tensor, offset: Tensor | None = None, pairing: str = "half",
         inverse: bool = False, out: Tensor | None = None, out_at_offset: bool = False) -> Tensor:
    """Rotate the pairs of x (B, H, S, D) (any strides) by the angles of their positions s + offset.

    cos, sin: rope_tables (max_len, D / 2). offset: None or an int32 device Tensor (1,) or (B,) (a KV
    cache's length, so a recorded decode step replays at the next position). pairing: "half" (x[i] with
    x[i + D/2]: GPT-NeoX, Hugging Face Llama) or "interleaved" (x[2i] with x[2i+1]: Meta's Llama, GPT-J).
    inverse: rotate by -theta (the backward). out: where to write (any strides; by default a new tensor in x's
    memory order, core.tensor.empty_in_order); out_at_offset: out is a KV cache (B, H, capacity, D) and row s
    goes to position s + offset.
    A position beyond the table (or the cache) raises ShapeError at the next host read."""
    key = capture.call_key("rope", (x, cos, sin, offset, out), pairing, bool(inverse), bool(out_at_offset),
                           align=None)  # the tables' offsets whole (the kernel reads them from element 0)
    fast = capture.plans.get(key) if key is not None else None
    if fast is not None:  # a call seen before: its launch, without the checks again
        return fast(x, cos, sin, offset, out)
    if pairing not in ROPE_PAIRINGS:
        raise ValueError(f"rope: pairing must be one of {sorted(ROPE_PAIRINGS)}, got {pairing!r}")
    if not isinstance(x, Tensor) or x.ndim != 4:
        raise ShapeError(f"rope: x must be a 4-D Tensor (batch, heads, positions, head_dim), got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if not dtypes.is_floating(x.dtype):
        raise DTypeError(
            f"rope: x must be floating point (float16, bfloat16, float32, float64), got {x.dtype}"
        )
    b, h, s, d = x.shape
    if d % 2:
        raise ShapeError(f"rope: head_dim must be even to form pairs, got x of shape {x.shape}")
    table_dt = _table_dtype(x.dtype)
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor) or t.ndim != 2 or t.shape[1] != d // 2 or t.dtype != table_dt:
            raise ShapeError(
                f"rope: {name} must be a {table_dt} table (max_len, {d // 2}) for x of shape "
                f"{x.shape} ({x.dtype}), got {getattr(t, 'dtype', None)} {getattr(t, 'shape', None)}"
            )
    if cos.shape != sin.shape:
        raise ShapeError(f"rope: cos {cos.shape} and sin {sin.shape} tables differ")
    queue = check_same_queue(x, cos, sin)
    position = offset_args("rope", offset, b, queue)
    limit = cos.shape[0]
    if out is None:
        if out_at_offset:
            raise ValueError("rope: out_at_offset needs out= (the cache to write into)")
        out = empty_in_order(x)  # x's memory order: a projection's heads stay a view of it
    else:
        check_same_queue(out, x)
        want = (b, h, out.shape[2], d) if out_at_offset else x.shape
        if not isinstance(out, Tensor) or out.ndim != 4 or out.shape != want or out.dtype != x.dtype:
            raise ShapeError(f"rope: out must be {x.dtype} of shape {want}" +
                             (" (a cache: any capacity along axis 2)" if out_at_offset else "") +
                             f", got {out.dtype} {out.shape}")
        if out_at_offset:
            limit = min(limit, out.shape[2])
    # the kernel reads the tables from their first element: a view elsewhere is copied (not kept as given)
    tables_as_given = all(t.is_contiguous() and t.offset == 0 for t in (cos, sin))
    cos, sin = table_rows(cos), table_rows(sin)
    if x.size == 0:
        return out
    defines: dict[str, Any] = {"PAIRING": ROPE_PAIRINGS[pairing]}
    if out_at_offset:
        defines["OUT_AT_POSITION"] = None
    prg = kernels.program(queue.device, "rope.cl", dtype=x.dtype, **defines)
    rows = b * h * s
    # its Plan: the sizes and strides fixed (they are the call's signature), the buffers and offsets per call
    static = dict(x_strides=strides4(x), out_strides=strides4(out), offset_stride=position["offset_stride"],
                  heads=np.int32(h), seq=np.int32(s), rows=np.int64(rows), half_dim=np.int32(d // 2),
                  max_len=np.int32(limit), direction=kernels.scalar_type(x.dtype)(-1.0 if inverse else 1.0),
                  err_code=_POSITION_CHECK)
    per_call = dict(x=x.buffer, x_off=np.int64(0), out=out.buffer, out_off=np.int64(0), cos_table=cos.buffer,
                    sin_table=sin.buffer, offsets=position["offsets"], offset_off=np.int64(0),
                    err=queue.check_buffer())
    fast = _rope_launch(prg.rope_rotate.plan_named((d // 2, rows), None, static, per_call))
    if key is not None and tables_as_given:
        capture.plans.put(key, fast)
    return fast(x, cos, sin, offset, out)


def _rope_launch(plan: Any) -> Any:
    """rope's call through its Plan (rope_rotate with the call's sizes and strides): the output made in x's
    memory order unless given, the buffers and offsets passed."""

    def run(x: Tensor, cos: Tensor, sin: Tensor, offset: Tensor | None, out: Tensor | None) -> Tensor:
        q = x.queue
        if out is None:
            out = empty_in_order(x)
        position = _zero_offset(q) if offset is None else offset
        plan(q, x.buffer, x.offset, out.buffer, out.offset, cos.buffer, sin.buffer, position.buffer,
             0 if offset is None else offset.offset, q.check_buffer())
        return out

    return run


def rope_qkv_cache(x: Tensor, q_heads: int, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                   offset: Tensor, pairing: str = "half") -> Tensor:
    """A decode step's attention inputs in one launch: x (B, q_heads + 2 kv_heads, S, D) (any strides: the
    heads of one stacked q/k/v projection) gives q rotated at positions s + offset (returned, (B, q_heads,
    S, D)), k rotated into k_cache and v copied into v_cache (B, kv_heads, capacity, D) at those positions
    (what rope(q), rope(k, out=k_cache, out_at_offset=True) and cache_write(v_cache, v) do in three)."""
    queue, kv, position = check_qkv_cache("rope_qkv_cache", x, q_heads, cos, sin, k_cache, v_cache, offset,
                                          pairing)
    b, heads, s, d = x.shape
    q = Tensor.empty(queue, (b, q_heads, s, d), x.dtype)
    if x.size == 0:
        return q
    limit = min(cos.shape[0], k_cache.shape[2], v_cache.shape[2])
    prg = kernels.program(queue.device, "rope.cl", dtype=x.dtype, PAIRING=ROPE_PAIRINGS[pairing])
    rows = b * heads * s
    prg.rope_qkv_cache(
        queue, (d // 2, rows), None,
        x=x.buffer, x_off=np.int64(x.offset), x_strides=strides4(x),
        q_out=q.buffer, q_off=np.int64(q.offset), q_strides=strides4(q),
        k_cache=k_cache.buffer, k_off=np.int64(k_cache.offset), k_strides=strides4(k_cache),
        v_cache=v_cache.buffer, v_off=np.int64(v_cache.offset), v_strides=strides4(v_cache),
        cos_table=table_rows(cos).buffer, sin_table=table_rows(sin).buffer, **position,
        q_heads=np.int32(q_heads), kv_heads=np.int32(kv), seq=np.int32(s), rows=np.int64(rows),
        half_dim=np.int32(d // 2), max_len=np.int32(limit), err=queue.check_buffer(),
        err_code=_POSITION_CHECK,
    )
    return q


def check_qkv_cache(op: str, x: Tensor, q_heads: int, cos: Tensor, sin: Tensor, k_cache: Tensor,
                    v_cache: Tensor, offset: Tensor, pairing: str) -> tuple[Any, int, dict[str, Any]]:
    """(queue, kv_heads, the offset's kernel arguments) of rope_qkv_cache's inputs (its docstring), checked;
    `op` names the caller in the errors."""
    if pairing not in ROPE_PAIRINGS:
        raise ValueError(f"{op}: pairing must be one of {sorted(ROPE_PAIRINGS)}, got {pairing!r}")
    for name, t in (("x", x), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, Tensor) or t.ndim != 4:
            got = getattr(t, "shape", type(t).__name__)
            raise ShapeError(f"{op}: {name} must be a 4-D Tensor, got {got}")
    b, heads, s, d = x.shape
    kv = (heads - q_heads) // 2
    if q_heads < 1 or kv < 1 or q_heads + 2 * kv != heads or d % 2:
        raise ShapeError(f"{op}: x of shape {x.shape} is not q_heads={q_heads} plus two equal groups of kv "
                         "heads of an even head_dim")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.shape[:2] != (b, kv) or t.shape[3] != d or t.dtype != x.dtype:
            raise ShapeError(f"{op}: {name} must be {x.dtype} ({b}, {kv}, capacity, {d}), got "
                             f"{t.dtype} {t.shape}")
    table_dt = _table_dtype(x.dtype)
    tables = (cos, sin)
    if not all(isinstance(t, Tensor) and t.shape[1:] == (d // 2,) and t.dtype == table_dt for t in tables):
        raise ShapeError(f"{op}: cos and sin must be {table_dt} tables (max_len, {d // 2})")
    queue = check_same_queue(x, cos, sin, k_cache, v_cache)
    return queue, kv, offset_args(op, offset, b, queue)


# -- the op on Nodes (netcl.ops.declaration): cos, sin and offset are constants ---------------------------
def _rope_backward(grad_out: Tensor, x_layout: Layout, cos: Tensor, sin: Tensor, offset: Tensor | None,
                   pairing: str) -> Tensor:
    """The rotation of grad_out by -theta, written in x's own memory order (x's layout is all it keeps of x:
    the input's memory goes back to the pool once the forward lets go of it)."""
    return rope(grad_out, cos, sin, offset, pairing, inverse=True, out=empty_in_order(x_layout))


declare(OpDecl("rope", rope, _rope_backward, inputs=("x",), constants=("cos", "sin", "offset"),
               hide=("inverse", "out", "out_at_offset"),
               doc="Rotary embedding of x (B, H, S, D) at positions s + offset (netcl.ops.rope); the "
                   "gradient is the rotation of g by -theta, written in x's own memory order."))
