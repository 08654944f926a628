"""Generated reduction-shaped kernels with a fused elementwise prologue.

One template covers reductions (sum, prod, max, min, argmax, argmin, any, all, logsumexp), the
row-wise ops built on a reduction (softmax, log_softmax), prefix sums (cumsum) and small top-k.
The value reduced is an elementwise expression (netcl.jit.ir) over leaves read in place, so
`(x * x).sum(axis)` or `softmax(x / t)` is one launch.

The input expression has a logical shape; its axes split into kept axes (M outputs, coordinate
`o`) and reduced axes (R elements, flat coordinate `r`, row-major over the reduced axes, so argmax
over all axes is NumPy's flat index). Work layout (`plan`):
- "row", L > 1 (GPU): one work-group of L work-items per (output, part); work-items stride the
  part's range by L (W consecutive elements each with vector loads when the reduced axis is
  contiguous), then combine in local memory with a tree.
- "row", L = 1 (CPU): one work-item per (output, part), a serial loop with W accumulators
  (vector loads) combined at the end; no barriers.
- "col" (GPU, kept axis innermost): one work-item per (output, part), adjacent work-items on
  adjacent outputs so reads coalesce.
With P > 1 parts, partial states go to a scratch buffer and a second launch combines them. Each
part covers at most `MAX_CHUNK` elements, so the serial error is bounded and float16/float32
accumulate in float32 (float64 in double, integers in long).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl import kernels
from netcl.config import jit_knob
from netcl.core import capture, dtypes, launch_labels
from netcl.core.tensor import Tensor, _coalesce
from netcl.jit import codegen, ir
from netcl.jit.runner import broadcast_strides, declared_work, memo_params_args

MAX_CHUNK = 1 << 14
# The rows one work-item of a GPU "col" reduction sums before its partial goes to the second launch.
COL_CHUNK = 64
# The longest serial sum one accumulator lane may do (the error bound: the old 16384-element chunks, 4096
# per lane of a float4 in the CPU path).
MAX_SERIAL = 2048


@dataclass(frozen=True)
class ReduceKnobs:
    """The GPU knobs of reductions (NETCL_RED_*, NETCL_SOFTMAX_REG; bench/elementwise.py --sweep times them):
    work-groups per compute unit for a full reduction, vector width of the loads, loop unroll (independent
    loads in flight per work-item); softmax/log_softmax hold the row in registers (1 read + 1 write) when it
    has at most L * W * softmax_reg elements (GPU layouts; 0 keeps the online max/sum pass + a second read);
    aligned vector loads where offsets allow them."""

    groups_per_cu: int
    vec: int
    unroll: int
    softmax_reg: int
    aligned: bool


_knobs: ReduceKnobs | None = None


# the row kernels' work-groups (the reductions' and norm.cl's): halved while each work-item makes four
# loads, down to 32 work-items. H200, rows of 1024, graph-replayed, against two loads and 64: half softmax
# 5-7% faster at 2^24 and 2^26, float32 row sum 4-5%, one load a work-item 5-35% slower (eleventh session);
# the norms' forward: float32 layer_norm 16-20% faster, rms_norm 4-7%, half layer_norm 7-10%, their backward
# 1-4% (twelfth session; bench/NOTES.md)
ROW_LOADS = 4
ROW_LEAST = 32


def row_group_size(local: int, lanes: int, length: int, loads: int = ROW_LOADS,
                   least: int = ROW_LEAST) -> int:
    """The work-group of a kernel that gives a row of `length` elements to `local` work-items of `lanes`
    elements each: halved (down to `least`) while each work-item still makes `loads` loads of the row, so that
    no part of the group idles and each work-item has more loads in flight (a 1024-wide half row on 256
    work-items of 8 took float32's time; 64 of 8 runs it at twice float32's elements a second, and float32's
    1024-wide rows on 128 of 4 are 20-35% faster in the norms than on 256: bench/NOTES.md, ninth session).
    The reductions here and norm.cl's row kernels (netcl.ops.norm) size their groups by it, with ROW_LOADS
    loads a work-item down to ROW_LEAST work-items."""
    while local > least and local * lanes * loads >= 2 * length:
        local //= 2
    return local


# Several rows a work-group (G, a power of two, while a group's rows read fewer bytes than this and it has at
# most 256 work-items): at most 32 work-groups are resident on an H200 SM, so a half row sum of rows of 1024
# (2 KB a group) one row a group was bound by the groups' count and lifetime, not by the bytes (1.38-1.45x
# float32's elements a second under every work-group size tried). H200, rows of 1024, graph-replayed, fresh
# processes, against one row a group: half row sum 2^26 51 -> 39.5 us (1.74x float32's elements a second, was
# 1.37x), 2^24 16 -> 10.3 us (2.04x); half softmax 3-6% faster; float32 within 1.5%; 4096 a little slower,
# 16384 the same (bench/NOTES.md, twelfth session). 0: one row a group.
ROW_GROUP_BYTES = 8192


def knobs() -> ReduceKnobs:
    """The knobs, read from the environment on first use rather than at import (a bad value is an error of
    the first reduction, naming the variable; `import netcl` never fails on one)."""
    global _knobs
    if _knobs is None:
        _knobs = ReduceKnobs(jit_knob("NETCL_RED_GROUPS_PER_CU"), jit_knob("NETCL_RED_VEC"),
                             jit_knob("NETCL_RED_UNROLL"), jit_knob("NETCL_SOFTMAX_REG"),
                             bool(jit_knob("NETCL_RED_ALIGNED")))
    return _knobs

# Tests set this to "gpu" to run the GPU layouts (local-memory trees) on the PoCL CPU device.
FORCE_KIND: str | None = None

# reducer -> (state fields as (name, type-kind)), where type-kind 'acc' is the accumulator type
# and 'long' the index type.
_FIELDS = {
    "sum": [("a", "acc")], "prod": [("a", "acc")], "max": [("a", "acc")], "min": [("a", "acc")],
    "any": [("a", "acc")], "all": [("a", "acc")],
    "argmax": [("a", "acc"), ("i", "long")], "argmin": [("a", "acc"), ("i", "long")],
    "lse": [("m", "acc"), ("s", "acc")],
}


def acc_dtype(reducer: str, dt: np.dtype) -> np.dtype:
    """dtype the state of `reducer` over values of `dt` is kept in."""
    if reducer in ("any", "all"):
        return ir.BOOL
    if ir.is_float(dt):
        return ir.F64 if dt == ir.F64 else ir.F32
    if reducer in ("sum", "prod"):
        return ir.I64
    if reducer == "lse":
        return ir.F32
    return dt


def _lowest(dt: np.dtype, highest: bool = False) -> str:
    ct = ir.COMPUTE_TYPE[dt]
    if ir.is_float(dt):
        return f"(({ct})INFINITY)" if highest else f"(-({ct})INFINITY)"
    info = np.iinfo(dt if dt != ir.BOOL else np.uint8)
    return codegen.c_literal(info.max if highest else info.min, dt)


def _init(reducer: str, acc: np.dtype) -> dict[str, str]:
    ct = ir.COMPUTE_TYPE[acc]
    return {
        "sum": {"a": f"(({ct})0)"}, "prod": {"a": f"(({ct})1)"},
        "max": {"a": _lowest(acc)}, "min": {"a": _lowest(acc, True)},
        "any": {"a": "((uchar)0)"}, "all": {"a": "((uchar)1)"},
        "argmax": {"a": _lowest(acc), "i": "-1L"}, "argmin": {"a": _lowest(acc, True), "i": "-1L"},
        "lse": {"m": f"(-({ct})INFINITY)", "s": f"(({ct})0)"},
    }[reducer]


def _update(reducer: str, acc: np.dtype, s: str, v: str, idx: str) -> str:
    """C statement folding value `v` (already acc type) with flat reduced index `idx` into state `s`."""
    flt = ir.is_float(acc)
    nan = (lambda x: f"isnan({x})") if flt else (lambda x: "0")
    if reducer == "sum":
        return f"{s}a += {v};"
    if reducer == "prod":
        return f"{s}a *= {v};"
    if reducer in ("max", "min"):
        cmp = ">" if reducer == "max" else "<"
        if not flt:  # integers have no NaN: no constant operand for clang to warn about
            return f"if ({v} {cmp} {s}a) {s}a = {v};"
        return f"if ({v} {cmp} {s}a || {nan(v)}) {s}a = {v};"
    if reducer in ("argmax", "argmin"):
        cmp = ">" if reducer == "argmax" else "<"
        if not flt:
            return f"if ({s}i < 0 || {v} {cmp} {s}a) {{ {s}a = {v}; {s}i = {idx}; }}"
        return (f"if ({s}i < 0 || ({v} {cmp} {s}a && !{nan(s + 'a')}) || ({nan(v)} && !{nan(s + 'a')})) "
                f"{{ {s}a = {v}; {s}i = {idx}; }}")
    if reducer == "any":
        return f"{s}a = {s}a | ({v} != 0);"
    if reducer == "all":
        return f"{s}a = {s}a & ({v} != 0);"
    if reducer == "lse":
        ct = ir.COMPUTE_TYPE[acc]
        return (f"if ({v} > {s}m) {{ {s}s = {s}s * exp({s}m - {v}) + ({ct})1; {s}m = {v}; }} "
                f"else if ({s}m != -({ct})INFINITY || {v} != {v}) {{ {s}s += exp({v} - {s}m); }}")
    raise KeyError(reducer)


def _combine(reducer: str, acc: np.dtype, s: str, t: str) -> str:
    """C statement folding state `t` into state `s` (t covers later or interleaved indices)."""
    flt = ir.is_float(acc)
    nan = (lambda x: f"isnan({x})") if flt else (lambda x: "0")
    if reducer in ("sum", "prod", "max", "min", "any", "all"):
        return _update(reducer, acc, s, f"{t}a", "")
    if reducer in ("argmax", "argmin"):
        cmp = ">" if reducer == "argmax" else "<"
        if flt:
            better = (f"({t}a {cmp} {s}a && !{nan(s + 'a')}) || ({nan(t + 'a')} && !{nan(s + 'a')}) || "
                      f"(({t}a == {s}a || ({nan(t + 'a')} && {nan(s + 'a')})) && {t}i < {s}i)")
        else:
            better = f"({t}a {cmp} {s}a) || ({t}a == {s}a && {t}i < {s}i)"
        return f"if ({t}i >= 0 && ({s}i < 0 || {better})) {{ {s}a = {t}a; {s}i = {t}i; }}"
    if reducer == "lse":
        ct = ir.COMPUTE_TYPE[acc]
        return (f"if ({t}m > {s}m) {{ {s}s = {s}s * exp({s}m - {t}m) + {t}s; {s}m = {t}m; }} "
                f"else if ({t}m != -({ct})INFINITY || {t}m != {t}m || {t}s != {t}s) "
                f"{{ {s}s += {t}s * exp({t}m - {s}m); }}")
    raise KeyError(reducer)


def _finalize(reducer: str, acc: np.dtype, s: str, mode_extra: dict) -> str:
    """C expression of the reduction's result from state `s`."""
    if reducer in ("argmax", "argmin"):
        return f"{s}i"
    if reducer == "lse":
        return f"({s}m + log({s}s))"
    if mode_extra.get("mean"):
        return f"({s}a / ({ir.COMPUTE_TYPE[acc]})RT)"
    return f"{s}a"


# -- layout ---------------------------------------------------------------------------------
def split_layout(shape: tuple[int, ...], axes: tuple[int, ...], stride_sets: list[list[int]]):
    """Coalesced (kept sizes, [kept strides per set]), (reduced sizes, [reduced strides per set])."""
    kept_axes = [d for d in range(len(shape)) if d not in axes]
    k_shape, k_sets = _coalesce(
        [shape[d] for d in kept_axes], *[[s[d] for d in kept_axes] for s in stride_sets]
    )
    r_shape, r_sets = _coalesce([shape[d] for d in axes], *[[s[d] for d in axes] for s in stride_sets])
    if not k_shape:
        k_shape, k_sets = [1], [[0] for _ in stride_sets]
    if not r_shape:
        r_shape, r_sets = [1], [[0] for _ in stride_sets]
    return (k_shape, k_sets), (r_shape, r_sets)


def _rkind(r_strides: list[int], r_shape: list[int]) -> str:
    if all(s == 0 or n == 1 for s, n in zip(r_strides, r_shape)):
        return "s"
    if len(r_shape) == 1 and r_strides[0] == 1:
        return "c"
    return "g"


def source(key: tuple) -> str:
    (mode, reducer, (desc, out_pos), leaf_dts, leaf_rkinds, knd, rnd, L, W, order, acc_str, out_str,
     stage2, topk_k, idx_t, mean, out_rkind, aligned, unroll, kreg, G) = key
    load_v = codegen.load_vector_aligned if aligned else codegen.load_vector
    acc = dtypes.from_token(acc_str)
    out_dt = dtypes.from_token(out_str)
    act = ir.COMPUTE_TYPE[acc]
    fields = _FIELDS[reducer] if reducer else []
    ftype = {"acc": act, "long": "long"}
    ps: list[str] = []
    if mode in ("reduce",):
        ps.append(f"__global {dtypes.cl_storage_type(out_dt)} *out")
    else:
        ps.append(f"__global {dtypes.cl_storage_type(out_dt)} *out")
        ps.append(f"const {idx_t} out_off")
        ps += [f"const {idx_t} out_k{d}" for d in range(knd)] + [
            f"const {idx_t} out_r{d}" for d in range(rnd)
        ]
        if mode == "topk":
            ps.append("__global long *out_idx")
    for name, kind in fields:
        ps.append(f"__global {ftype[kind]} *part_{name}")
    if stage2:
        for name, kind in fields:
            ps.append(f"__global const {ftype[kind]} *in_{name}")
    else:
        for s, dt_str in enumerate(leaf_dts):
            ps.append(f"__global const {dtypes.cl_storage_type(dtypes.from_token(dt_str))} *in{s}")
            ps.append(f"const {idx_t} in{s}_off")
            ps += [f"const {idx_t} in{s}_k{d}" for d in range(knd)]
            ps += [f"const {idx_t} in{s}_r{d}" for d in range(rnd)]
        n_params = sum(1 for d in desc if d[0] == "param")
        ptypes = {d[3]: ir.COMPUTE_TYPE[dtypes.from_token(d[2])] for d in desc if d[0] == "param"}
        ps += [f"const {ptypes[p]} p{p}" for p in range(n_params)]
    ps += [
        f"const {idx_t} M",
        f"const {idx_t} R",
        f"const {idx_t} P",
        f"const {idx_t} chunk",
        f"const {idx_t} RT",
    ]
    ps += [f"const {idx_t} kd{d}" for d in range(knd)] + [f"const {idx_t} rd{d}" for d in range(rnd)]
    b: list[str] = []
    if G > 1:  # G rows a work-group: rows (g) of L work-items each at tb = (local id / L) * L; a row past the
        # last (the last group's) computes the last row again and stores nothing (`live`), so every work-item
        # reaches the barriers
        b.append(f"const {idx_t} tb = (get_local_id(0) / {L}) * {L};")
        b.append(f"const {idx_t} lid = get_local_id(0) % {L};")
        b.append(f"const {idx_t} g_ = get_group_id(0) * {G} + get_local_id(0) / {L};")
        b.append(f"const int live = g_ < M * P; const {idx_t} g = live ? g_ : M * P - 1;")
    elif L > 1:
        b.append(f"const {idx_t} g = get_group_id(0); const {idx_t} lid = get_local_id(0);")
    else:
        b.append(f"const {idx_t} g = get_global_id(0); const {idx_t} lid = 0;")
    if kreg:
        b += local_array(act, "shr", L, G)
    if not kreg and G == 1:  # (the register softmax launches exactly M groups; PoCL corrupted its heap with
        b.append("if (g >= M * P) return;")  # this early return ahead of the barriers)
    if order == "col":
        b.append(f"const {idx_t} o = g % M; const {idx_t} part = g / M;")
    else:
        b.append(f"const {idx_t} o = g / P; const {idx_t} part = g % P;")
    b.append(f"const {idx_t} start = part * chunk; const {idx_t} end = min(R, start + chunk);")
    # kept coordinates -> base offsets
    b.append(f"{idx_t} ko = o;")
    for d in range(knd - 1, 0, -1):
        b.append(f"const {idx_t} k{d} = ko % kd{d}; ko /= kd{d};")
    b.append(f"const {idx_t} k0 = ko;")
    if not stage2:
        for s in range(len(leaf_dts)):
            b.append(f"const {idx_t} base{s} = in{s}_off + "
                     + " + ".join(f"k{d} * in{s}_k{d}" for d in range(knd)) + ";")
    if mode != "reduce":
        b.append(
            f"const {idx_t} obase = out_off + " + " + ".join(f"k{d} * out_k{d}" for d in range(knd)) + ";"
        )

    def leaf_value_at(r: str, lane: int | None = None):
        def fn(slot: int) -> str:
            dt = dtypes.from_token(leaf_dts[slot])
            kind = leaf_rkinds[slot]
            if kind == "s":
                return f"S{slot}"
            if lane is not None:
                v = f"V{slot}.s{codegen.LANES[lane]}"
                return f"(uchar)({v} != 0)" if dt == dtypes.bool_ else v
            if kind == "c":
                return codegen.load_scalar(dt, f"in{slot}", f"base{slot} + {r}")
            return codegen.load_scalar(dt, f"in{slot}", f"base{slot} + " +
                                       " + ".join(f"rc{d} * in{slot}_r{d}" for d in range(rnd)))
        return fn

    def r_coords(r: str) -> list[str]:
        if rnd == 1 or all(k != "g" for k in leaf_rkinds) and out_rkind != "g":
            if rnd == 1:
                return [f"const {idx_t} rc0 = {r};"]
            return []
        lines = [f"{idx_t} rr = {r};"]
        for d in range(rnd - 1, 0, -1):
            lines.append(f"const {idx_t} rc{d} = rr % rd{d}; rr /= rd{d};")
        lines.append(f"const {idx_t} rc0 = rr;")
        return lines

    def value_lines(r: str, suffix: str = "") -> tuple[list[str], str]:
        """Statements computing the prologue value at reduced index r; returns (lines, var)."""
        if stage2:
            return [], ""
        lines = r_coords(r)
        body, names = codegen.emit_nodes(desc, leaf_value_at(r), lambda ax: "0", suffix=suffix)
        return lines + body, names[out_pos[0]]

    if not stage2:
        for s, dt_str in enumerate(leaf_dts):
            if leaf_rkinds[s] == "s":
                b.append(f"const {ir.COMPUTE_TYPE[dtypes.from_token(dt_str)]} S{s} = "
                         f"{codegen.load_scalar(dtypes.from_token(dt_str), f'in{s}', f'base{s}')};")

    def declare_state(prefix: str) -> list[str]:
        init = _init(reducer, acc)
        return [f"{ftype[k]} {prefix}{n} = {init[n]};" for n, k in fields]

    def fold_main(prefix: str) -> list[str]:
        """Loop over this work-item's share of [start, end) folding into state `prefix`."""
        lines: list[str] = []
        if stage2:
            lines.append(f"for ({idx_t} r = start + lid; r < end; r += {L}) {{")
            lines += ["  " + ln for ln in declare_state("t_")]
            for n, _ in fields:
                lines.append(f"  t_{n} = in_{n}[o * R + r];")
            lines.append("  " + _combine(reducer, acc, prefix, "t_"))
            lines.append("}")
            return lines
        tail_start = "start"
        if W > 1:
            lanes = [f"l{j}_" for j in range(W)]
            for ln in lanes:
                lines += declare_state(ln)
            lines.append(f"const {idx_t} nfull = (end - start) / {W};")
            if unroll > 1:
                lines.append(f"#pragma unroll {unroll}")
            lines.append(f"for ({idx_t} it = lid; it < nfull; it += {L}) {{")
            lines.append(f"  const {idx_t} r = start + it * {W};")
            for s, dt_str in enumerate(leaf_dts):
                if leaf_rkinds[s] == "c":
                    dt = dtypes.from_token(dt_str)
                    lines.append(f"  const {codegen.vector_type(dt, W)} V{s} = "
                                 f"{load_v(dt, f'in{s}', f'base{s} + r', W)};")
            for j in range(W):
                body, names = codegen.emit_nodes(
                    desc, leaf_value_at("r", lane=j), lambda ax: "0", suffix=f"_{j}"
                )
                lines += ["  " + x for x in body]
                v = f"(({act}){names[out_pos[0]]})"
                lines.append("  " + _update(reducer, acc, lanes[j], v, f"(r + {j})"))
            lines.append("}")
            for j in range(W):
                lines.append(_combine(reducer, acc, prefix, lanes[j]))
            tail_start = f"start + nfull * {W}"
        lines.append(f"for ({idx_t} r = {tail_start} + lid; r < end; r += {L}) {{")
        vl, var = value_lines("r")
        lines += ["  " + x for x in vl]
        lines.append("  " + _update(reducer, acc, prefix, f"(({act}){var})", "r"))
        lines.append("}")
        return lines

    def local_tree(prefix: str) -> list[str]:
        if L == 1:
            return []
        lines = [x for n, k in fields for x in local_array(ftype[k], f"sh_{n}", L, G)]
        lines += [f"sh_{n}[lid] = {prefix}{n};" for n, _ in fields]
        lines.append("barrier(CLK_LOCAL_MEM_FENCE);")
        lines.append(f"for (int s = {L // 2}; s > 0; s >>= 1) {{")
        lines.append("  if (lid < s) {")
        lines += [
            f"    {ftype[k]} x_{n} = sh_{n}[lid]; {ftype[k]} y_{n} = sh_{n}[lid + s];" for n, k in fields
        ]
        lines.append("    " + _combine(reducer, acc, "x_", "y_"))
        lines += [f"    sh_{n}[lid] = x_{n};" for n, _ in fields]
        lines.append("  }")
        lines.append("  barrier(CLK_LOCAL_MEM_FENCE);")
        lines.append("}")
        lines += [f"{prefix}{n} = sh_{n}[0];" for n, _ in fields]
        return lines

    if mode == "reduce":
        b += declare_state("st_")
        b += fold_main("st_")
        b += local_tree("st_")
        b.append("if (lid == 0 && live) {" if G > 1 else "if (lid == 0) {")
        b.append("  if (P > 1) {")
        b += [f"    part_{n}[o * P + part] = st_{n};" for n, _ in fields]
        b.append("  } else {")
        res = _finalize(reducer, acc, "st_", {"mean": mean})
        b.append("    " + codegen.store_scalar(out_dt, "out", "o", f"(({ir.COMPUTE_TYPE[out_dt]}){res})"))
        b.append("  }")
        b.append("}")
    elif mode in ("softmax", "log_softmax") and kreg:
        b += _softmax_registers(mode, desc, out_pos, leaf_dts, leaf_rkinds, L, W, kreg, act, out_dt, idx_t,
                                load_v, aligned, leaf_value_at, G)
    elif mode in ("softmax", "log_softmax"):
        b += declare_state("st_")
        b += fold_main("st_")
        b += local_tree("st_")
        b.append(f"for ({idx_t} r = start + lid; r < (live ? end : start); r += {L}) {{" if G > 1 else
                 f"for ({idx_t} r = start + lid; r < end; r += {L}) {{")
        vl, var = value_lines("r")
        b += ["  " + x for x in vl]
        oc = ("obase + r * out_r0" if out_rkind != "g"
              else "obase + " + " + ".join(f"rc{d} * out_r{d}" for d in range(rnd)))
        if mode == "softmax":
            val = f"exp(({act}){var} - st_m) / st_s"
        else:
            val = f"(({act}){var} - st_m - log(st_s))"
        b.append("  " + codegen.store_scalar(out_dt, "out", oc, f"(({ir.COMPUTE_TYPE[out_dt]})({val}))"))
        b.append("}")
    elif mode == "scan":
        b += declare_state("st_")
        b.append(f"for ({idx_t} r = start; r < end; r += 1) {{")
        vl, var = value_lines("r")
        b += ["  " + x for x in vl]
        b.append("  " + _update(reducer, acc, "st_", f"(({act}){var})", "r"))
        oc = ("obase + r * out_r0" if out_rkind != "g"
              else "obase + " + " + ".join(f"rc{d} * out_r{d}" for d in range(rnd)))
        b.append("  " + codegen.store_scalar(out_dt, "out", oc, f"(({ir.COMPUTE_TYPE[out_dt]})st_a)"))
        b.append("}")
    elif mode == "topk":
        k = topk_k
        b.append(f"{act} tv[{k}]; long ti[{k}];")
        b.append(f"for (int j = 0; j < {k}; ++j) {{ tv[j] = {_lowest(acc)}; ti[j] = -1; }}")
        b.append(f"for ({idx_t} r = start; r < end; r += 1) {{")
        vl, var = value_lines("r")
        b += ["  " + x for x in vl]
        b.append(f"  const {act} v = ({act}){var};")
        nanv = "isnan(v)" if ir.is_float(acc) else "0"
        nant = "isnan(tv[j - 1])" if ir.is_float(acc) else "0"
        # insert v keeping tv sorted descending (NaN first, ties by lower index first)
        b.append(f"  if (ti[{k - 1}] >= 0 && !({nanv} && !{nant.replace('j - 1', str(k - 1))}) && "
                 f"!(v > tv[{k - 1}])) continue;")
        b.append(f"  int j = {k - 1};")
        b.append(f"  while (j > 0 && (ti[j - 1] < 0 || ({nanv} && !{nant}) || (!{nanv} && v > tv[j - 1]))) "
                 "{ tv[j] = tv[j - 1]; ti[j] = ti[j - 1]; --j; }")
        b.append("  tv[j] = v; ti[j] = r;")
        b.append("}")
        b.append(f"for (int j = 0; j < {k}; ++j) {{")
        b.append("  " + codegen.store_scalar(out_dt, "out", "obase + j * out_r0",
                                             f"(({ir.COMPUTE_TYPE[out_dt]})tv[j])"))
        b.append("  out_idx[(obase - out_off) + j * out_r0] = ti[j];")
        b.append("}")
    fp64 = acc == ir.F64 or out_dt == ir.F64 or any(d == "float64" for d in leaf_dts) or \
        any(d[2] == "float64" for d in desc)
    head = "#define USE_FP64\n" if fp64 else ""
    helpers = codegen.helpers_for(list(leaf_dts) + [out_str], W)
    return head + codegen.PREAMBLE + helpers + "\n__kernel void red(" + ",\n    ".join(ps) + ")\n{\n    " + \
        "\n    ".join(b) + "\n}\n"


def _softmax_registers(mode, desc, out_pos, leaf_dts, leaf_rkinds, L, W, K, act, out_dt, idx_t, load_v,
                       aligned, leaf_value_at, G=1) -> list[str]:
    """Row held in registers: work-item `lid` keeps vectors k * L + lid (k < K) of W elements; max
    and sum of exp through two local-memory trees; one read and one write of the row."""
    oct_ = ir.COMPUTE_TYPE[out_dt]
    b: list[str] = [f"{act} mx = -INFINITY;"]
    for k in range(K):
        b.append(f"const {idx_t} r{k} = ({k} * {L} + lid) * {W};")
        b.append(" ".join(f"{act} x{k}_{j} = -INFINITY;" for j in range(W)))
        b.append(f"if (r{k} + {W} <= R) {{")
        for s, dt_str in enumerate(leaf_dts):
            if leaf_rkinds[s] == "c":
                dt = dtypes.from_token(dt_str)
                b.append(
                    f"  const {codegen.vector_type(dt, W)} V{s} = "
                    f"{load_v(dt, f'in{s}', f'base{s} + r{k}', W)};"
                )
        for j in range(W):
            body, names = codegen.emit_nodes(
                desc, leaf_value_at(f"r{k}", lane=j), lambda ax: "0", suffix=f"_{k}_{j}"
            )
            b += ["  " + x for x in body]
            b.append(f"  x{k}_{j} = ({act}){names[out_pos[0]]};")
        b.append("} else {")
        for j in range(W):
            b.append(f"  if (r{k} + {j} < R) {{")
            body, names = codegen.emit_nodes(
                desc, leaf_value_at(f"(r{k} + {j})"), lambda ax: "0", suffix=f"_{k}_{j}t"
            )
            b += ["    " + x for x in body]
            b.append(f"    x{k}_{j} = ({act}){names[out_pos[0]]};")
            b.append("  }")
        b.append("}")
        b += [f"mx = fmax(mx, x{k}_{j});" for j in range(W)]

    def tree(var: str, op: str) -> list[str]:
        return [f"shr[lid] = {var};", "barrier(CLK_LOCAL_MEM_FENCE);",
                f"for (int s = {L // 2}; s > 0; s >>= 1) {{",
                f"  if (lid < s) shr[lid] = {op.format('shr[lid]', 'shr[lid + s]')};",
                "  barrier(CLK_LOCAL_MEM_FENCE);", "}", f"{var} = shr[0];", "barrier(CLK_LOCAL_MEM_FENCE);"]

    b += tree("mx", "fmax({0}, {1})")
    b.append(f"{act} sm = 0;")
    for k in range(K):
        for j in range(W):
            if mode == "softmax":
                b.append(f"x{k}_{j} = exp(x{k}_{j} - mx); sm += x{k}_{j};")
            else:
                b.append(f"sm += exp(x{k}_{j} - mx);")
    b += tree("sm", "({0} + {1})")
    if mode == "softmax":
        b.append(f"const {act} inv = ({act})1 / sm;")
        val = "(x{k}_{j} * inv)"
    else:
        # (x - max) - log(sum), as the other path and PyTorch: x - (max + log(sum)) rounds the large
        # logsumexp first (ulp 2.4e-4 at 3000), which exp(out) in the backward multiplies by sum(g)
        b.append(f"const {act} lsum = log(sm);")
        val = "((x{k}_{j} - mx) - lsum)"
    store_v = codegen.store_vector_aligned if aligned else codegen.store_vector
    if G > 1:
        b.append("if (live) {")   # a repeated last row (several rows a work-group) stores nothing
    for k in range(K):
        vals = ", ".join(f"(({oct_}){val.format(k=k, j=j)})" for j in range(W))
        b.append(f"if (r{k} + {W} <= R) {{")
        b.append(
            "  " + store_v(out_dt, "out", f"obase + r{k}", f"({codegen.vector_type(out_dt, W)})({vals})", W)
        )
        b.append("} else {")
        for j in range(W):
            b.append(f"  if (r{k} + {j} < R) " + codegen.store_scalar(
                out_dt, "out", f"obase + r{k} + {j}", f"(({oct_}){val.format(k=k, j=j)})"))
        b.append("}")
    if G > 1:
        b.append("}")
    return b


def local_array(ctype: str, name: str, L: int, G: int) -> list[str]:
    """A work-group tree's local array of L values a row: with G rows a work-group, `name` points at this
    row's L (offset tb), so the tree's indices are the one-row kernel's."""
    if G == 1:
        return [f"__local {ctype} {name}[{L}];"]
    return [f"__local {ctype} {name}_all[{L * G}];", f"__local {ctype} *{name} = {name}_all + tb;"]


def _aligned_at(w: int, leaves: list[Tensor], k_sets: list, leaf_rk: tuple, out: tuple | None) -> bool:
    """Whether every contiguous leaf (and `out`, (tensor, its kept strides), when given) starts each kept
    position at a multiple of `w` elements: the condition of the aligned vector loads and stores."""
    if out is not None and (out[0].offset % w or any(x % w for x in out[1])):
        return False
    return all(t.offset % w == 0 and all(x % w == 0 for x in ks)
               for t, ks, rk in zip(leaves, k_sets, leaf_rk) if rk == "c")


def _kernel(device: Any, key: tuple) -> Any:
    """The reduction kernel of structural `key` (netcl.kernels keeps it; the source is generated once)."""
    return kernels.generated(device, key, lambda: source(key), f"jit_{key[0]}_{key[1]}").kernel("red")


def run(
    mode: str,
    reducer: str,
    expr: ir.Node,
    in_shape: tuple[int, ...],
    axes: tuple[int, ...],
    out: Tensor,
    queue: Any,
    *,
    mean: bool = False,
    out_idx: Tensor | None = None,
    topk_k: int = 0,
) -> None:
    """Launch `mode` ('reduce', 'softmax', 'log_softmax', 'scan', 'topk') of `expr` (logical
    shape `in_shape`) over `axes` into `out` (contiguous: M values for 'reduce'; in_shape for
    softmax/scan; in_shape with the axis cut to k for topk)."""
    device = queue.device
    (desc, out_pos), leaves, params = codegen.flatten([expr])
    pkey = ("reduce", id(device), FORCE_KIND, mode, reducer, desc, out_pos, expr.dtype, in_shape, axes, mean,
            topk_k, out_idx is None, out.strides, out.offset, out.dtype,
            tuple([(t.shape, t.strides, t.offset, t.dtype) for t in leaves]))
    plan = capture.plans.get(pkey)
    if plan is None:
        codegen.check_no_inputs(desc)
        plan = capture.plans.put(pkey, _plan(mode, reducer, expr, in_shape, axes, out, device, mean, topk_k,
                                             desc, out_pos, leaves))
    if plan is _NOTHING:
        return
    kernel, P, part_dts, M, R, head, leaf_static, tail, gsize, lsize, acc, memo, stage2, launch = plan
    parts = [Tensor.empty(queue, (M * P,), dt) for dt in part_dts] if P > 1 else []
    # the launch's dynamic arguments, in the kernel's order (see _launch_plan)
    values: list[Any] = [out.buffer if mode != "reduce" or P == 1 else parts[0].buffer]
    if mode == "topk":
        values.append(out_idx.buffer)
    values += [p.buffer for p in parts] if P > 1 else [out.buffer] * len(part_dts)
    values += [t._storage.buffer for t in leaves]
    if params:
        values += memo_params_args(params, memo)
    if launch[0] is None:
        launch[0] = _launch_plan(kernel, mode, values, len(part_dts), leaf_static, head, tail, gsize, lsize)
    if capture.declaring():  # the expression's work plus one combining operation per input element
        n = math.prod(in_shape)
        flops, nbytes = declared_work(
            desc, n, leaves, out.nbytes + (out_idx.nbytes if out_idx is not None else 0)
        )
        launch_labels.work(flops + n, nbytes)
    launch[0](queue, *values)
    if P > 1:   # the partials' combination: its Plan made once, with the launch's
        if stage2[0] is None:
            stage2[0] = _stage2_plan(device, reducer, acc, len(parts), out, M, P, mean, R)
        stage2[0](queue, *[out.buffer] * (1 + len(parts)), *[p.buffer for p in parts])


def _launch_plan(kernel: Any, mode: str, values: list[Any], n_parts: int, leaf_static: list[list[Any]],
                 head: list[Any], tail: list[Any], gsize: tuple, lsize: tuple | None) -> Any:
    """The Plan of a reduction launch: its layout arguments (head, each leaf's offset and strides, the
    tail's sizes) fixed, `values` (the output or first partial buffer, topk's index output, the partials'
    buffers, the leaves' buffers, the params) at their positions in the kernel's order: first the output,
    then head, the index output, the partials, each leaf's buffer before its layout, the params, the tail."""
    values = list(values)
    args: list[Any] = [values.pop(0)] + head
    dynamic = [0]
    if mode == "topk":
        dynamic.append(len(args))
        args.append(values.pop(0))
    for _ in range(n_parts):
        dynamic.append(len(args))
        args.append(values.pop(0))
    for stat in leaf_static:
        dynamic.append(len(args))
        args += [values.pop(0)] + stat
    dynamic += range(len(args), len(args) + len(values))   # the params
    args += values + tail
    return kernel.plan(gsize, lsize, args, dynamic)


_NOTHING = ("nothing to compute",)


def _plan(
    mode: str,
    reducer: str,
    expr: ir.Node,
    in_shape: tuple[int, ...],
    axes: tuple[int, ...],
    out: Tensor,
    device: Any,
    mean: bool,
    topk_k: int,
    desc: tuple,
    out_pos: tuple,
    leaves: list[Tensor],
) -> Any:
    """Everything of a launch that depends only on structure and layouts (see `run`)."""
    caps = device.capabilities
    stride_sets = [broadcast_strides(t, in_shape) for t in leaves]
    if mode != "reduce":
        stride_sets.append(list(out.strides))
    (k_shape, k_sets), (r_shape, r_sets) = split_layout(in_shape, axes, stride_sets)
    M = math.prod(k_shape)
    R = math.prod(r_shape)
    if M == 0:
        return _NOTHING
    leaf_rk = tuple(_rkind(s, r_shape) for s in r_sets[: len(leaves)])
    out_rkind = _rkind(r_sets[-1], r_shape) if mode != "reduce" else "c"
    if mode != "reduce" and out_rkind == "s":
        out_rkind = "g"
    acc = acc_dtype(reducer or "sum", expr.dtype)
    gpu = (FORCE_KIND or caps.kind) == "gpu"
    knob = knobs()
    vec_ok = all(k in "sc" for k in leaf_rk) and not any(d[0] == "index" for d in desc)
    inner_kept = bool(in_shape) and (len(in_shape) - 1) not in axes and in_shape[-1] > 1
    if mode in ("scan", "topk"):
        L, W, order = 1, 1, "col" if gpu else "row"
    elif gpu and inner_kept and M >= 256:
        L, W, order = 1, 1, "col"
    elif gpu:
        L, W, order = 256 if R >= 256 else (64 if R >= 64 else 1), (knob.vec if vec_ok else 1), "row"
        if L == 1:
            order = "col"
        # half operands: twice the lanes, so a lane's load is 16 bytes as float32's (the elementwise JIT's
        # rule); only where every operand allows the aligned form (the unaligned 8-wide half load is the
        # slow path on NVIDIA's OpenCL, see codegen.load_vector_aligned)
        halves = [t.dtype for t in leaves] + ([] if mode == "reduce" else [out.dtype])
        if W > 1 and order == "row" and 2 * W <= 16 and all(dtypes.is_half(dt) for dt in halves) and \
                _aligned_at(2 * W, leaves, k_sets, leaf_rk, None if mode == "reduce" else (out, k_sets[-1])):
            W *= 2
        if order == "row":
            # the work-group halved while each work-item still makes ROW_LOADS loads of a row (H200, float32
            # rows of 1024 and 512: two loads 1.3-2.8x faster than 256 items; four: half softmax 4-7%)
            L = row_group_size(L, W, R)
    else:
        L, W, order = 1, (8 if vec_ok and R >= 16 else 1), "row"
    # parts: enough parallel work, and a bounded serial chunk
    if mode == "reduce" and gpu and order == "row" and L > 1:
        # a few work-groups per compute unit, each a long run of vector loads (MAX_SERIAL bounds
        # what one accumulator lane adds serially), then a tiny second launch over the partials
        want = max(1, -(-caps.compute_units * knob.groups_per_cu // M))
        P = max(1, min(want, -(-R // (L * W * 8))))
        P = max(P, -(-R // (MAX_SERIAL * L * W)))
    elif mode == "reduce":
        target = caps.compute_units * (8 if gpu else 4)
        if order == "col":
            target = caps.compute_units * 2048 if gpu else target
        want = max(1, -(-target // M))
        # "col" on a GPU: parts of COL_CHUNK rows, so that few outputs still fill the device (a GPT's norm
        # weight gradient, 512 columns over 16,384 rows, ran 2,048 work-items of 4,096 rows: 385 us on
        # the H200); otherwise parts of 4096 elements at least
        P = max(1, min(want, -(-R // (COL_CHUNK if gpu and order == "col" else 4096))))
        P = max(P, -(-R // MAX_CHUNK))
    else:
        P = 1
    chunk = -(-R // P) if R else 0
    if W > 1:
        chunk = -(-chunk // W) * W
        P = max(1, -(-R // chunk)) if R else 1
    extents = [M * R * 2, M * P]
    for t, ks, rs in zip(leaves, k_sets, r_sets):
        extents.append(abs(t.offset) + sum((n - 1) * abs(s) for n, s in zip(k_shape, ks))
                       + sum((n - 1) * abs(s) for n, s in zip(r_shape, rs)))
    idx_t = "int" if max(extents) < 2**31 - 2**24 else "long"
    it = np.int32 if idx_t == "int" else np.int64
    fields = _FIELDS[reducer] if reducer else []
    out_dt = out.dtype
    aligned = knob.aligned and W > 1 and chunk % W == 0 and _aligned_at(W, leaves, k_sets, leaf_rk, None)
    kreg = 0
    if mode in ("softmax", "log_softmax") and gpu and L > 1 and W > 1 and len(r_shape) == 1 and \
            out_rkind == "c" and R <= L * W * knob.softmax_reg:
        kreg = -(-R // (L * W))
        aligned = aligned and out.offset % W == 0 and all(x % W == 0 for x in k_sets[-1])
    unroll = knob.unroll if gpu and L > 1 else 1
    G = 1  # rows a work-group (ROW_GROUP_BYTES)
    if ROW_GROUP_BYTES and gpu and order == "row" and L > 1 and mode in ("reduce", "softmax", "log_softmax"):
        row_bytes = chunk * max((t.dtype.itemsize for t in leaves), default=4)
        most = min(256, caps.max_work_group_size)
        while G * row_bytes < ROW_GROUP_BYTES and 2 * G * L <= most and G < M * P:
            G *= 2
    key = (
        mode,
        reducer,
        (desc, out_pos),
        tuple(dtypes.token(t.dtype) for t in leaves),
        leaf_rk,
        len(k_shape),
        len(r_shape),
        L,
        W,
        order,
        dtypes.token(acc),
        dtypes.token(out_dt),
        False,
        topk_k,
        idx_t,
        mean,
        out_rkind,
        aligned,
        unroll,
        kreg,
        G,
    )
    kernel = _kernel(device, key)
    part_dts = [ir.I64 if kind == "long" else acc for _, kind in fields]
    head = (
        [it(out.offset)] + [it(s) for s in k_sets[-1]] + [it(s) for s in r_sets[-1]]
        if mode != "reduce"
        else []
    )
    leaf_static = [[it(t.offset)] + [it(s) for s in ks] + [it(s) for s in rs]
                   for t, ks, rs in zip(leaves, k_sets, r_sets)]
    tail = [it(M), it(R), it(P), it(chunk), it(R)] + [it(s) for s in k_shape] + [it(s) for s in r_shape]
    groups = -(-M * P // G)
    gsize, lsize = ((groups * L * G,), (L * G,)) if L > 1 else ((groups,), None)
    return kernel, P, part_dts, M, R, head, leaf_static, tail, gsize, lsize, acc, [None], [None], [None]


def _stage2_plan(device: Any, reducer: str, acc: np.dtype, n_parts: int, out: Tensor, M: int, P: int,
                 mean: bool, R_total: int) -> Any:
    """The Plan of a reduction's second stage, which combines the P partials of each of the M outputs (the
    n_parts state arrays) into `out`: the output, the unused partial outputs (P == 1 here) and the partials'
    buffers given per launch, in that order; sizes fixed."""
    gpu = (FORCE_KIND or device.capabilities.kind) == "gpu"
    L = (256 if P >= 256 else 64) if gpu and P >= 64 else 1
    idx_t = "int" if M * P < 2**31 - 2**24 else "long"
    it = np.int32 if idx_t == "int" else np.int64
    key = (
        "reduce",
        reducer,
        ((), (0,)),
        (),
        (),
        1,
        1,
        L,
        1,
        "row",
        dtypes.token(acc),
        dtypes.token(out.dtype),
        True,
        0,
        idx_t,
        mean,
        "c",
        False,
        1,
        0,
        1,
    )
    k = kernels.generated(device, key, lambda: source(key), f"jit_reduce2_{reducer}").kernel("red")
    buffers = [out.buffer] * (1 + 2 * n_parts)  # the output, unused partial outputs, the partials (samples)
    args = buffers + [it(M), it(P), it(1), it(P), it(R_total), it(M), it(P)]
    return k.plan((M * L,) if L > 1 else (M,), (L,) if L > 1 else None, args, list(range(len(buffers))))
