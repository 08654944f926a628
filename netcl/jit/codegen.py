"""OpenCL C code generation for elementwise graphs: node -> C statement, and whole kernels.

A graph is first flattened (`flatten`) into a hashable description: nodes in topological order,
each (op, operand positions, dtype name, attr) with leaves and params replaced by slot numbers.
That description is the structural key of the kernel cache, and the only input of the generator,
so one description always yields one source text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import dtypes
from netcl.jit import ir

PREAMBLE = kernels.source("half.cl") + r"""
/* no a*b+c -> fma contraction: a fused graph must round exactly like the same ops run one by one
   (NETCL_FUSION=0) and like NumPy; NVIDIA's compiler contracts by default */
#pragma OPENCL FP_CONTRACT OFF
#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
/* nc_rh rounds a float to the nearest half and back: float16 intermediates behave as stored ones (the
   N-wide half loads and stores, nc_ldhN / nc_sthN, are half.cl's) */
inline float nc_rh(float x) { return nc_h2f(nc_f2h(x)); }
/* bfloat16 intermediates round as stored ones (half.cl's nc_bf2f / nc_f2bf; vector forms:
   bf16_vector_helpers) */
inline float nc_rb(float x) { return nc_bf2f(nc_f2bf(x)); }
inline int nc_ipow_int(int a, int b) {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    int r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
inline long nc_ipow_long(long a, long b) {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    long r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
inline uchar nc_ipow_uchar(uchar a, uchar b) {
    uchar r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
"""


def bf16_vector_helpers(vec: int) -> str:
    """nc_bf2f{vec} / nc_f2bf{vec}, the vector loads and stores of bfloat16 lanes, added to a kernel's source
    only when it has bfloat16 operands and that vector width: a CPU compiler can abort on library calls with
    512-bit vectors (convert_uint16) even in a function no kernel calls (PoCL 3.0 on AVX-512, see runner)."""
    n = vec
    portable = (f"inline ushort{n} nc_f2bf{n}(float{n} f) {{ uint{n} u = as_uint{n}(f);\n"
                f"    uint{n} r = (u + (uint{n})0x7fffu + ((u >> 16) & (uint{n})1u)) >> 16;\n"
                f"    return convert_ushort{n}(select(r, (u >> 16) | (uint{n})0x0040u,\n"
                f"        (u & (uint{n})0x7fffffffu) > (uint{n})0x7f800000u)); }}\n")
    load = f"inline float{n} nc_bf2f{n}(ushort{n} h) {{ return as_float{n}(convert_uint{n}(h) << 16); }}\n"
    if n not in (2, 4, 8, 16):
        return load + portable
    # NVIDIA sm_80+: pairs through cvt.rn.bf16x2.f32 (half.cl's nc_f2bf2u), one instruction per two lanes
    pairs = ", ".join(f"nc_f2bf2u(f.s{LANES[i]}{LANES[i + 1]})" for i in range(0, n, 2))
    words = f"(uint{n // 2})({pairs})" if n > 2 else pairs
    cvt = f"inline ushort{n} nc_f2bf{n}(float{n} f) {{ return as_ushort{n}({words}); }}\n"
    return load + "#ifdef NC_BF16_CVT\n" + cvt + "#else\n" + portable + "#endif\n"


def helpers_for(tokens: list[str], vec: int) -> str:
    """The vector helpers a kernel over dtypes `tokens` with `vec`-wide lanes needs (see
    bf16_vector_helpers)."""
    return bf16_vector_helpers(vec) if vec > 1 and "bfloat16" in tokens else ""


_DTYPE_STR: dict[np.dtype, str] = {}  # dtypes.token per dtype, memoised (~0.4 us a string otherwise)


def _dtype_str(dt: np.dtype) -> str:
    s = _DTYPE_STR.get(dt)
    if s is None:
        s = _DTYPE_STR[dt] = dtypes.token(dt)
    return s


def dtype_of(token: str) -> np.dtype:
    """The dtype a description field names (the inverse of the tokens flatten writes)."""
    return dtypes.from_token(token)


def flatten(outputs: list[ir.Node]) -> tuple[tuple, list[Any], list[tuple[Any, np.dtype]]]:
    """(description, leaf tensors in slot order, params (value, dtype) in slot order).

    Nodes are numbered in ir.walk's order (operands before users, first visit first). Leaves that
    are the same Tensor object share one slot."""
    pos: dict[int, int] = {}
    leaves: list[Any] = []
    leaf_slot: dict[int, int] = {}
    params: list[tuple[Any, np.dtype]] = []
    desc: list[tuple] = []
    dstrs = _DTYPE_STR

    def visit(node: ir.Node) -> int:
        p = pos.get(id(node))
        if p is not None:
            return p
        op = node.op
        if node.args:
            argpos = tuple([visit(x) for x in node.args])
            attr: Any = node.attr
        else:
            argpos = ()
            if op == "leaf":
                key = id(node.attr)
                attr = leaf_slot.get(key)
                if attr is None:
                    attr = leaf_slot[key] = len(leaves)
                    leaves.append(node.attr)
            elif op == "param":
                attr = len(params)
                params.append((node.attr, node.dtype))
            else:
                attr = node.attr
        p = pos[id(node)] = len(desc)
        dt = node.dtype
        dstr = dstrs.get(dt)
        if dstr is None:
            dstr = _dtype_str(dt)
        desc.append((op, argpos, dstr, attr))
        return p

    try:
        out_pos = tuple([visit(o) for o in outputs])
    except RecursionError:
        return _flatten_iterative(outputs)
    finally:
        # visit refers to itself through its closure cell: a reference cycle that kept `leaves` (the fused
        # kernel's input tensors: a step's activations) alive until the garbage collector ran (a GPT
        # step's device memory peak nearly doubled). Emptying the cell breaks it.
        visit = None  # type: ignore[assignment]  # noqa: F841
    return (tuple(desc), out_pos), leaves, params


def _flatten_iterative(outputs: list[ir.Node]) -> tuple[tuple, list[Any], list[tuple[Any, np.dtype]]]:
    """flatten for graphs deeper than Python's recursion limit (same result)."""
    order = ir.walk(outputs)
    pos: dict[int, int] = {}
    leaves: list[Any] = []
    leaf_slot: dict[int, int] = {}
    params: list[tuple[Any, np.dtype]] = []
    desc = []
    for i, node in enumerate(order):
        pos[id(node)] = i
        if node.op == "leaf":
            key = id(node.attr)
            if key not in leaf_slot:
                leaf_slot[key] = len(leaves)
                leaves.append(node.attr)
            attr: Any = leaf_slot[key]
        elif node.op == "param":
            attr = len(params)
            params.append((node.attr, node.dtype))
        else:
            attr = node.attr
        desc.append((node.op, tuple(pos[id(a)] for a in node.args), _dtype_str(node.dtype), attr))
    out_pos = tuple(pos[id(o)] for o in outputs)
    return (tuple(desc), out_pos), leaves, params


def check_no_inputs(desc: tuple) -> None:
    """A traced placeholder reaching a kernel means a fused function did non-elementwise work."""
    if any(d[0] == "input" for d in desc):
        raise ir.TraceError(
            "a function traced by netcl.jit.fuse used a traced tensor in a non-elementwise op (a "
            "reduction, view or host read); fuse only elementwise work and call the rest outside"
        )


def c_literal(value: Any, dt: np.dtype) -> str:
    ct = ir.COMPUTE_TYPE[dt]
    if dt in dtypes.FLOATING:
        v = float(value)
        if np.isnan(v):
            return f"(({ct})NAN)"
        if np.isinf(v):
            return f"(({ct})INFINITY)" if v > 0 else f"(-({ct})INFINITY)"
        text = repr(v)
        return f"(({ct}){text})" if ct == "double" else f"(({ct}){text}f)"
    if dt == dtypes.bool_:
        return "((uchar)1)" if value else "((uchar)0)"
    return f"(({ct}){int(value)}{'L' if ct == 'long' else ''})"


def _op_expr(op: str, a: list[str], dt: np.dtype, in_dt: list[np.dtype]) -> str:
    """C expression for one op on operands `a` (already in their compute types)."""
    ct = ir.COMPUTE_TYPE[dt]
    flt = dt in dtypes.FLOATING
    one, zero = f"(({ct})1)", f"(({ct})0)"
    x = a[0] if a else ""
    template = ir.C_EXPRESSIONS.get(op)
    if template is not None:
        return template.format(*a)
    if op == "abs":
        if flt:
            return f"fabs({x})"
        return x if dt in (dtypes.uint8, dtypes.bool_) else f"({x} < 0 ? -{x} : {x})"
    if op == "pow":
        return f"pow({a[0]}, {a[1]})" if flt else f"nc_ipow_{ct}({a[0]}, {a[1]})"
    if op == "sigmoid":
        return f"({one} / ({one} + exp(-{x})))"
    if op == "silu":
        return f"({x} / ({one} + exp(-{x})))"
    if op == "relu":
        return f"({x} < {zero} ? {zero} : {x})"
    if op == "leaky_relu":
        return f"({a[0]} < {zero} ? {a[0]} * {a[1]} : {a[0]})"
    if op == "gelu":
        return f"(({ct})0.5 * {x} * ({one} + erf({x} * ({ct})0.7071067811865476)))"
    if op == "gelu_tanh":
        return (f"(({ct})0.5 * {x} * ({one} + tanh(({ct})0.7978845608028654 * "
                f"({x} + ({ct})0.044715 * {x} * {x} * {x}))))")
    if op == "softplus":
        return f"(fmax({x}, {zero}) + log1p(exp(-fabs({x}))))"
    if op == "reciprocal":
        return f"({one} / {x})"
    if op == "sign":
        if flt:
            return f"({x} > {zero} ? {one} : ({x} < {zero} ? -{one} : {x}))"
        return f"({x} > {zero} ? {one} : ({x} < {zero} ? -{one} : {zero}))"
    if op in ("maximum", "minimum"):
        cmp = ">" if op == "maximum" else "<"
        if flt:
            return f"(({a[0]} {cmp} {a[1]} || isnan({a[0]})) ? {a[0]} : {a[1]})"
        return f"({a[0]} {cmp} {a[1]} ? {a[0]} : {a[1]})"
    if op == "floor_divide":
        if flt:
            return f"floor({a[0]} / {a[1]})"
        # b == 0 gives 0 (NumPy's result); b == -1 negates in unsigned arithmetic, so MIN // -1 wraps as
        # in NumPy instead of trapping (x86 division faults on it, killing a CPU device's process)
        return (
            f"({a[1]} == 0 ? {zero} : ({a[1]} == ({ct})-1 ? ({ct})(({_unsigned(ct)})0 - "
            f"({_unsigned(ct)}){a[0]}) : "
            f"({a[0]} / {a[1]} - ((({a[0]} % {a[1]}) != 0) && (({a[0]} < 0) != ({a[1]} < 0))))))"
        )
    if op == "remainder":
        if flt:
            return f"({a[0]} - floor({a[0]} / {a[1]}) * {a[1]})"
        return (
            f"(({a[1]} == 0 || {a[1]} == ({ct})-1) ? {zero} : ((({a[0]} % {a[1]}) != 0 && "
            f"(({a[0]} % {a[1]}) < 0) != ({a[1]} < 0)) ? ({a[0]} % {a[1]}) + {a[1]} : ({a[0]} % {a[1]})))"
        )
    if op in ("left_shift", "right_shift"):
        # NumPy's results past the width (OpenCL would take the count modulo the width): 0, and -1 for a
        # negative value shifted right; shifted in the unsigned type, so a negative value shifts left as
        # two's complement
        ut, bits = _unsigned(ct), 8 * ir.COMPUTE_SIZE[dt]
        if op == "left_shift":
            return f"((({ut}){a[1]} < {bits}) ? ({ct})(({ut}){a[0]} << {a[1]}) : {zero})"
        past = f"({a[0]} < 0 ? ({ct})-1 : {zero})" if ct != "uchar" else zero
        return f"((({ut}){a[1]} < {bits}) ? ({ct})({a[0]} >> {a[1]}) : {past})"
    if op in ("isnan", "isinf", "isfinite"):
        return (
            f"{op}({x})"
            if in_dt[0] in dtypes.FLOATING
            else ("((uchar)1)" if op == "isfinite" else "((uchar)0)")
        )
    if op == "cast":
        if dt == dtypes.bool_:
            return f"({x} != 0)"
        return f"(({ct}){x})"
    raise KeyError(op)


def _unsigned(ct: str) -> str:
    return {"int": "uint", "long": "ulong", "uchar": "uchar"}[ct]


def emit_nodes(desc: tuple, leaf_value, index_value, suffix: str = "",
               stored_only: frozenset[int] = frozenset()) -> tuple[list[str], list[str]]:
    """C statements computing every node of `desc`; returns (lines, variable name per node).

    `leaf_value(slot)` and `index_value(axis_from_right)` give C expressions (in compute type). Half
    results are rounded to their format (nc_rh, nc_rb) so that later ops see stored values, except the
    nodes in `stored_only` (see stored_only_nodes): their one use is a store that rounds the same way."""
    lines: list[str] = []
    names: list[str] = []
    for i, (op, args, dt_str, attr) in enumerate(desc):
        dt = dtypes.from_token(dt_str)
        ct = ir.COMPUTE_TYPE[dt]
        name = f"v{i}{suffix}"
        if op == "leaf":
            expr = leaf_value(attr)
        elif op == "param":
            expr = f"p{attr}"
        elif op == "const":
            expr = c_literal(attr, dt)
        elif op == "index":
            expr = f"(({ct}){index_value(attr)})"
        else:
            in_dt = [dtypes.from_token(desc[j][2]) for j in args]
            expr = _op_expr(op, [names[j] for j in args], dt, in_dt)
            if i in stored_only:
                pass
            elif dt == dtypes.float16:
                expr = f"nc_rh({expr})"
            elif dt == dtypes.bfloat16:
                expr = f"nc_rb({expr})"
        lines.append(f"const {ct} {name} = {expr};")
        names.append(name)
    return lines, names


def stored_only_nodes(desc: tuple, out_pos: tuple, out_dtypes: list[str]) -> frozenset[int]:
    """Half-typed nodes used only as outputs of their own dtype: rounding them to half before the store
    rounds to nearest even twice, which gives the store's bits, so the first rounding is left out (on
    NVIDIA each is two conversion instructions per element, as many as the loads and stores)."""
    used = {j for (_, args, _, _) in desc for j in args}
    out_dt: dict[int, set[str]] = {}
    for p, dt_str in zip(out_pos, out_dtypes):
        out_dt.setdefault(p, set()).add(dt_str)
    return frozenset(p for p, dts in out_dt.items()
                     if p not in used and dts == {desc[p][2]} and desc[p][2] in ("float16", "bfloat16"))


# -- memory access helpers -------------------------------------------------------------------
def load_scalar(dt: np.dtype, ptr: str, idx: str) -> str:
    """C expression reading element `idx` of buffer `ptr` (storage of `dt`) in compute type."""
    if dt == dtypes.float16:
        return f"NC_LDH({ptr}, {idx})"
    if dt == dtypes.bfloat16:
        return f"nc_bf2f({ptr}[{idx}])"
    if dt == dtypes.bool_:
        return f"(uchar)({ptr}[{idx}] != 0)"
    return f"{ptr}[{idx}]"


def store_scalar(dt: np.dtype, ptr: str, idx: str, value: str) -> str:
    if dt == dtypes.float16:
        return f"NC_STH({ptr}, {idx}, {value});"
    if dt == dtypes.bfloat16:
        return f"{ptr}[{idx}] = nc_f2bf({value});"
    return f"{ptr}[{idx}] = {value};"


def load_vector(dt: np.dtype, ptr: str, idx: str, vec: int) -> str:
    """Vector load of `vec` consecutive elements starting at element `idx` (any alignment)."""
    if dt == dtypes.float16:
        return f"vload_half{vec}(0, {ptr} + {idx})"
    if dt == dtypes.bfloat16:
        return f"nc_bf2f{vec}(vload{vec}(0, {ptr} + {idx}))"
    return f"vload{vec}(0, {ptr} + {idx})"


def load_vector_aligned(dt: np.dtype, ptr: str, idx: str, vec: int) -> str:
    """Vector load through a vector pointer: `idx` must be a multiple of `vec` from an aligned base.

    NVIDIA's compiler turns vloadN at an unknown alignment into N scalar loads; the cast gives one
    16-byte load per work-item (float4), which is what reaches copy bandwidth."""
    if dt == dtypes.float16:  # aligned: one wide load (nc_ldhN: raw bits on NVIDIA, else vloada_halfN)
        return f"nc_ldh{vec}({ptr} + {idx})"
    if dt == dtypes.bfloat16:
        return f"nc_bf2f{vec}(*((__global const ushort{vec} *)({ptr} + {idx})))"
    return f"(*((__global const {dtypes.cl_storage_type(dt)}{vec} *)({ptr} + {idx})))"


def store_vector_aligned(dt: np.dtype, ptr: str, idx: str, value: str, vec: int) -> str:
    if dt == dtypes.float16:  # round to nearest even (nc_sthN: the conversion instructions on NVIDIA)
        return f"nc_sth{vec}({value}, {ptr} + {idx});"
    if dt == dtypes.bfloat16:
        return f"*((__global ushort{vec} *)({ptr} + {idx})) = nc_f2bf{vec}({value});"
    st = dtypes.cl_storage_type(dt)
    return f"*((__global {st}{vec} *)({ptr} + {idx})) = convert_{st}{vec}({value});"


def vector_type(dt: np.dtype, vec: int) -> str:
    return f"{ir.COMPUTE_TYPE[dt]}{vec}"


def store_vector(dt: np.dtype, ptr: str, idx: str, value: str, vec: int) -> str:
    if dt == dtypes.float16:
        return f"vstore_half{vec}({value}, 0, {ptr} + {idx});"
    if dt == dtypes.bfloat16:
        return f"vstore{vec}(nc_f2bf{vec}({value}), 0, {ptr} + {idx});"
    return f"vstore{vec}({value}, 0, {ptr} + {idx});"


LANES = "0123456789abcdef"


def needs_fp64(desc: tuple, leaf_dtypes: list[np.dtype], out_dtypes: list[np.dtype]) -> bool:
    return any(d[2] == "float64" for d in desc) or dtypes.float64 in leaf_dtypes + out_dtypes


def elementwise_source(key: tuple) -> str:
    """Kernel `ew` for one elementwise key (see runner.plan for the fields).

    Work layout: 1-D grid-stride loop. With VEC > 1 (every operand contiguous or a broadcast
    scalar) a work-item handles VEC consecutive elements per step with vector loads/stores, and
    the tail (n % VEC) is done one element per work-item; otherwise each step decomposes the
    flat output index into an NDIM-dimensional coordinate and reads every strided operand through
    its own strides."""
    (desc, out_pos), leaf_layouts, out_layouts, ndim, vec, idx_t, aligned = key
    stored_only = stored_only_nodes(desc, out_pos, [t for t, _ in out_layouts])
    load_v = load_vector_aligned if aligned else load_vector
    store_v = store_vector_aligned if aligned else store_vector
    ps = []
    for s, (dt_str, kind) in enumerate(out_layouts):
        dt = dtypes.from_token(dt_str)
        ps.append(f"__global {dtypes.cl_storage_type(dt)} *out{s}")
        ps.append(f"const {idx_t} out{s}_off")
        if kind == "g":
            ps += [f"const {idx_t} out{s}_s{d}" for d in range(ndim)]
    for s, (dt_str, kind) in enumerate(leaf_layouts):
        dt = dtypes.from_token(dt_str)
        ps.append(f"__global const {dtypes.cl_storage_type(dt)} *in{s}")
        ps.append(f"const {idx_t} in{s}_off")
        if kind == "g":
            ps += [f"const {idx_t} in{s}_s{d}" for d in range(ndim)]
    n_params = sum(1 for d in desc if d[0] == "param")
    param_types = {d[3]: ir.COMPUTE_TYPE[dtypes.from_token(d[2])] for d in desc if d[0] == "param"}
    ps += [f"const {param_types[p]} p{p}" for p in range(n_params)]
    ps.append(f"const {idx_t} n")
    ps += [f"const {idx_t} d{k}" for k in range(ndim)]
    body: list[str] = []
    body.append(f"const {idx_t} gsize = get_global_size(0);")
    body.append(f"const {idx_t} gid = get_global_id(0);")
    # broadcast scalars: read once, by the work-items that have elements (an output may be the scalar's own
    # memory: `p += 1` on a one-element tensor; the idle work-items of a rounded-up grid read nothing)
    for s, (dt_str, kind) in enumerate(leaf_layouts):
        if kind == "s":
            ct = ir.COMPUTE_TYPE[dtypes.from_token(dt_str)]
            body.append(f"const {ct} S{s} = gid < n ? "
                        f"{load_scalar(dtypes.from_token(dt_str), f'in{s}', f'in{s}_off')} : ({ct})0;")

    def scalar_step(index_var: str) -> list[str]:
        lines = []
        has_index = any(d[0] == "index" for d in desc)
        general = any(k == "g" for _, k in leaf_layouts + out_layouts) or has_index
        if general:
            lines.append(f"{idx_t} r = {index_var};")
            for k in range(ndim - 1, 0, -1):
                lines.append(f"const {idx_t} c{k} = r % d{k}; r /= d{k};")
            lines.append(f"const {idx_t} c0 = r;")

        def off(prefix: str, s: int, kind: str) -> str:
            if kind == "c":
                return f"{prefix}{s}_off + {index_var}"
            if kind == "s":
                return f"{prefix}{s}_off"
            return f"{prefix}{s}_off + " + " + ".join(f"c{k} * {prefix}{s}_s{k}" for k in range(ndim))

        def leaf_value(slot: int) -> str:
            dt_str, kind = leaf_layouts[slot]
            if kind == "s":
                return f"S{slot}"
            return load_scalar(dtypes.from_token(dt_str), f"in{slot}", off("in", slot, kind))

        lines_e, names = emit_nodes(desc, leaf_value, lambda ax: f"c{ndim - ax}", stored_only=stored_only)
        lines += lines_e
        for s, (dt_str, kind) in enumerate(out_layouts):
            lines.append(
                store_scalar(dtypes.from_token(dt_str), f"out{s}", off("out", s, kind), names[out_pos[s]])
            )
        return lines

    if vec > 1:
        body.append(f"const {idx_t} nvec = n / {vec};")
        body.append(f"for ({idx_t} iv = gid; iv < nvec; iv += gsize) {{")
        body.append(f"  const {idx_t} i = iv * {vec};")
        for s, (dt_str, kind) in enumerate(leaf_layouts):
            if kind == "c":
                dt = dtypes.from_token(dt_str)
                body.append(f"  const {vector_type(dt, vec)} V{s} = "
                            f"{load_v(dt, f'in{s}', f'in{s}_off + i', vec)};")
        lane_names = []
        for lane in range(vec):
            def leaf_value(slot: int, lane: int = lane) -> str:
                dt_str, kind = leaf_layouts[slot]
                if kind == "s":
                    return f"S{slot}"
                v = f"V{slot}.s{LANES[lane]}"
                return f"(uchar)({v} != 0)" if dtypes.from_token(dt_str) == dtypes.bool_ else v

            lines_e, names = emit_nodes(desc, leaf_value, lambda ax: "0", suffix=f"_{lane}",
                                        stored_only=stored_only)
            body += ["  " + ln for ln in lines_e]
            lane_names.append(names)
        for s, (dt_str, _) in enumerate(out_layouts):
            dt = dtypes.from_token(dt_str)
            vals = ", ".join(lane_names[lane][out_pos[s]] for lane in range(vec))
            body.append(
                f"  {store_v(dt, f'out{s}', f'out{s}_off + i', f'({vector_type(dt, vec)})({vals})', vec)}"
            )
        body.append("}")
        body.append(f"for ({idx_t} i = nvec * {vec} + gid; i < n; i += gsize) {{")
    else:
        body.append(f"for ({idx_t} i = gid; i < n; i += gsize) {{")
    body += ["  " + ln for ln in scalar_step("i")]
    body.append("}")
    tokens = [t for t, _ in leaf_layouts + out_layouts]
    src = (PREAMBLE + helpers_for(tokens, vec) + "\n__kernel void ew(" + ",\n    ".join(ps) + ")\n{\n    "
           + "\n    ".join(body) + "\n}\n")
    return src
