"""matmul, matmul_epilogue, linear and gemm: the GEMM entry points, netcl's choice of kernel, and the fast
path of repeated calls.

A training step calls gemm with the same shapes, strides and epilogue every step. The first call goes
through the whole path (checks, variant choice, tuning lookup, program, launch geometry) while a
netcl.core.capture.Recording records its launches; when they all ran on the operands in place (slots
named by netcl.ops.gemm.launch), the recording is kept as a template under the problem's signature and
later calls only allocate the output and replay it with their own tensors bound to the slots (~0.1 ms
less host time per call on PoCL). The signature holds everything the choice depended on in the call:
shapes, strides, dtype, epilogue, offsets mod 16 (aligned-load variants), the queue; the templates live in
netcl.core.capture.plans, which the tuning database empties when it changes.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from netcl.core import capture, dtypes
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.kernels import ACTIVATIONS
from netcl.ops import elementwise
from netcl.ops.declaration import OpDecl, declare
from netcl.ops.gemm import splitk
from netcl.ops.gemm.launch import launch
from netcl.ops.gemm.problem import _finish, _k_contiguous, _prepare, _Problem
from netcl.ops.gemm.variants import (
    MMA_SKINNY_ROWS,
    VARIANTS,
    choose_variant,
    gemv_usable,
    usable_params,
    uses_matrix_units,
)
from netcl.ops.reduce import sum as _sum
from netcl.ops.reduce import sum_to_shape

# rows of x up to which a half x @ W^T takes the gemv kernel (a decode step of up to 8 sequences): W is read
# once for all rows; beyond it the FLOPs per byte of W favour the tiled and matrix-unit kernels
GEMV_MAX_ROWS = 8
# ... and where matrix units take the dtype: more rows take their kernel's "skinny" tile
# (variants.mma_shape_class), which read TinyLlama's weights 1.4-2.4x faster at M = 8 on the H200
GEMV_MAX_ROWS_MATRIX_UNITS = 1


def gemv_max_rows(device: Any, dtype: Any) -> int:
    """The most rows of a half x @ W^T (W in x's dtype) that the gemv kernel takes on `device`."""
    return GEMV_MAX_ROWS_MATRIX_UNITS if uses_matrix_units(device, dtype) else GEMV_MAX_ROWS


def gemm(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    residual: Tensor | None = None,
    alpha: float = 1.0,
    *,
    variant: str | None = None,
    params: dict[str, int] | None = None,
    splits: int | None = None,
    bias_rows: bool = False,
) -> Tensor:
    """matmul_epilogue with an explicit kernel `variant`, tile `params` and (tiled, mma) K `splits`
    (tests, tuning, benchmarks); None means netcl's own choice. bias_rows=True takes a bias of shape
    (M,), one value per output row (a convolution's bias in y = W @ cols), shared by every batch."""
    bias_rows = bias_rows and bias is not None
    fast = variant is None and params is None and splits is None
    if fast:  # first: a template exists only for a problem that ran as it is (bfloat16 on its kernels too)
        key = _template_key(a, b, bias, residual, activation, alpha, bias_rows)
        hit = capture.plans.get(key) if key is not None else None
        if hit is not None:
            return _replay(hit, a, b, bias, residual)
    if isinstance(a, Tensor) and a.dtype == dtypes.bfloat16 and variant not in ("mma", "gemv") and not (
            variant is None and not _bfloat16_through_float32(a, b)):
        if variant is not None:
            raise DTypeError(f"gemm: bfloat16 runs on matrix units (variant 'mma'), the decode GEMV ('gemv') "
                             f"or through float32 (variant None), not on the {variant!r} kernel")
        return _through_float32(a, b, bias, activation, residual, alpha, bias_rows)
    if not bias_rows:  # folding the batch into rows would change which row a bias value belongs to
        folded = _fold_batch_into_rows(a, b, bias, activation, residual, alpha, variant, params, splits,
                                       key if fast else None)
        if folded is not None:
            return folded
    p = _prepare(a, b, bias, residual, activation, alpha, bias_rows)
    if p.out.size == 0:
        return _finish(p)
    if (variant in (None, "cpu") and params is None and splits is None
            and (cpu_splits := splitk.choose_cpu_splits(p, variant or _auto_variant(p)))):
        if fast and key is not None:
            _record(key, p, lambda: _cpu_split(p, cpu_splits))
        else:
            _cpu_split(p, cpu_splits)
        return _finish(p)
    if fast and key is not None:
        variant = _auto_variant(p)
        _record(key, p, lambda: launch(p, variant))
        return _finish(p)
    if variant is None:
        variant = _auto_variant(p)
    elif variant not in VARIANTS:
        raise ValueError(f"unknown GEMM variant {variant!r}; one of {VARIANTS}")
    if p.k == 0 and variant == "tiled":
        variant = "direct"
    if splits is not None and splits > 1 and (variant not in ("tiled", "mma") or math.prod(p.batch) != 1):
        raise ValueError("split-K is for the tiled and mma variants on unbatched problems")
    launch(p, variant, params, splits)
    return _finish(p)


def _bfloat16_through_float32(a: Tensor, b: Tensor) -> bool:
    """Whether netcl's own choice runs a bfloat16 a @ b through float32 (_through_float32): neither matrix
    units nor the decode GEMV take it on a's device."""
    return a.dtype == dtypes.bfloat16 and not (uses_matrix_units(a.device, a.dtype) or gemv_fits(a, b))


def _through_float32(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None,
    activation: str | None,
    residual: Tensor | None,
    alpha: float,
    bias_rows: bool,
) -> Tensor:
    """A bfloat16 GEMM where no matrix units take it: the operands widened to float32 (exact), the float32
    GEMM with its epilogue, one rounding of the result to bfloat16 (as PyTorch's CPU bfloat16 matmul)."""
    for name, t in (("b", b), ("bias", bias), ("residual", residual)):
        if t is not None and (not isinstance(t, Tensor) or t.dtype != a.dtype):
            raise DTypeError(
                f"matmul: {name} is {getattr(t, 'dtype', type(t).__name__)} but the operands are {a.dtype}"
            )
    wide = [None if t is None else elementwise.cast(t, dtypes.float32) for t in (a, b, bias, residual)]
    y = gemm(wide[0], wide[1], wide[2], activation, wide[3], alpha, bias_rows=bias_rows)
    return elementwise.cast(y, dtypes.bfloat16)


def gemv_fits(a: Any, b: Any) -> bool:
    """Whether (..., M, K) @ (K, N) is a decode step's x @ W^T that the gemv kernel takes: half storage, at
    most gemv_max_rows rows of a (its batch folded in), both operands contiguous along K, and K, the row
    strides and the offsets multiples of 8 (16-byte vectors)."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a.ndim < 2 or b.ndim != 2:
        return False
    if a.dtype != b.dtype or not dtypes.is_half(a.dtype) or a.shape[-1] != b.shape[0]:
        return False
    rows = math.prod(a.shape[:-1])
    if not 0 < rows <= gemv_max_rows(a.device, a.dtype) or b.shape[1] == 0 or a.strides[-1] != 1 \
            or b.strides[0] != 1:
        return False
    # a's rows must fold into one (rows, K) matrix of row stride `lead`
    lead = a.strides[-2] if a.shape[-2] > 1 else a.shape[-1]
    step = lead
    for i in range(a.ndim - 3, -1, -1):
        step *= a.shape[i + 1]
        if a.shape[i] > 1 and a.strides[i] != step:
            return False
    return all(v % 8 == 0 for v in (b.shape[0], lead, b.strides[1], a.offset, b.offset)) and gemv_usable(
        a.device, a.dtype)


def _auto_variant(p: _Problem) -> str:
    """The one place netcl picks a kernel for a problem (the fast path records its choice)."""
    if not p.batch and gemv_fits(p.a, p.b):
        return "gemv"
    if p.out.dtype == dtypes.bfloat16:
        return "mma"  # reached only on matrix units (gemm() takes bfloat16 through float32 elsewhere)
    variant = choose_variant(p.out.device, p.m, p.n, p.k)
    if variant == "direct" and p.out.device.capabilities.kind != "cpu" and p.k >= 256 and _k_contiguous(p):
        variant = "dot"  # GPU, thin, both operands contiguous along K: coalesce along K instead
    if p.k == 0 and variant == "tiled":
        variant = "direct"
    # decode rows past gemv_max_rows (float16 as bfloat16 above): the matrix units' "skinny" tile
    rows = variant in ("direct", "dot") and dtypes.is_half(p.out.dtype) and p.m <= MMA_SKINNY_ROWS \
        and p.n >= 16 and p.k >= 16
    if (variant == "tiled" or rows) and uses_matrix_units(p.out.device, p.out.dtype) and usable_params(
            p.out.device, "mma", p.out.dtype, required=False) is not None:
        variant = "mma"  # NVIDIA's matrix units (float16, or TF32 under set_matmul_precision("high"))
    if (
        variant in ("cpu", "tiled")
        and usable_params(p.out.device, variant, p.out.dtype, required=False) is None
    ):
        variant = "direct"  # no variant of the blocked kernel builds here (each rejection was warned)
    return variant


# -- the fast path: templates of repeated calls (module docstring) ---------------------------------------
def templates() -> dict[tuple, tuple[capture.Recording, tuple, Any]]:
    """The GEMM templates kept now (key -> (recording, output shape, workspace shape and dtype or None))."""
    return {k: v for k, v in capture.plans.items() if k[0] == "gemm" and isinstance(v, tuple)}


def _template_key(a: Any, b: Any, bias: Any, residual: Any, activation: Any, alpha: float,
                  bias_rows: bool = False) -> tuple | None:
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or len(a.shape) < 2 or len(b.shape) < 2:
        return None
    if a.queue is not b.queue or a.dtype != b.dtype or (
        activation not in ACTIVATIONS and activation not in ("rowsum", "relumask", "wide")
    ):
        return None
    extra: list[Any] = []
    for t in (bias, residual):
        if t is None:
            extra.append(None)
        elif not isinstance(t, Tensor) or t.queue is not a.queue or t.dtype != a.dtype:
            return None
        else:
            extra.append((t.shape, t.strides, t.offset % 16))
    return (
        "gemm", id(a.queue), a.dtype, a.shape, a.strides, a.offset % 16, b.shape, b.strides, b.offset % 16,
        *extra, activation, float(alpha), bias_rows,
    )


def _cpu_split(p: _Problem, splits: int) -> Tensor:
    """The CPU split-K (netcl.ops.gemm.splitk): one batched cpu GEMM over K slices of the operands (strided
    views, no copies) into a (splits, M, N) workspace, then the reduction with the epilogue. Returns the
    workspace (a recording's `work` slot)."""
    av, bv = splitk.cpu_slices(p, splits)
    inner = _prepare(av, bv, None, None, None, 1.0)  # its output is the workspace, in the operands' dtype
    launch(inner, "cpu")
    # the slices start where the operands do: slots a and b bind the operands; the workspace is `work`
    capture.name_slots(a=("A", "a_off"), b=("B", "b_off"), work=[("C", "c_off"), ("bias",), ("residual",)])
    splitk.reduce_splits(p, inner.out, splits)
    return inner.out


def _record(key: tuple, p: _Problem, run: Any) -> None:
    """Launch `p` by `run()` while recording; keep the recording as the template of `key` when a replay
    can rebind all of it (every launch on the operands in place, its slots named). `run` returns split-K's
    workspace or None."""
    work, rec = capture.record_template(run, (p.a, p.b, p.bias, p.residual))
    if rec is not None:
        capture.plans.put(key, (rec, p.out.shape, None if work is None else (work.shape, work.dtype)))


def _replay(hit: tuple, a: Tensor, b: Tensor, bias: Tensor | None, residual: Tensor | None,
            rowsum: Tensor | None = None, out_dtype: Any = None) -> Tensor:
    rec, out_shape, work_spec = hit
    out = Tensor.empty(a.queue, out_shape, out_dtype or a.dtype)
    bind = {"a": a, "b": b, "out": out,
            "bias": bias if bias is not None else (rowsum if rowsum is not None else out),
            "res": residual if residual is not None else out}
    if work_spec is not None:
        bind["work"] = Tensor.empty(a.queue, *work_spec)
    rec.replay(bind)
    return out


def _fold_batch_into_rows(a, b, bias, activation, residual, alpha, variant, params, splits,
                          key=None) -> Tensor | None:
    """(..., M, K) @ (K, N) with a's batch dims laid out like rows is one (prod(...)*M, K) GEMM: one
    launch with big tiles instead of a batch of thin ones (linear layers on (batch, tokens, features)).
    `key`: the batched call's template key, under which the rows' template is kept too (a template binds
    buffers and offsets, which the batched operands and their row views share): the next such call replays
    it without folding again."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or b.ndim != 2 or a.ndim <= 2:
        return None
    if a.shape[-1] != b.shape[0] or a.size == 0 or b.size == 0:
        return None  # the general path reports the error (naming the shapes given) or handles it
    try:
        rows = a.view(-1, a.shape[-1])
        out_shape = a.shape[:-1] + (b.shape[1],)
        res_rows = None if residual is None else residual.expand(out_shape).view(-1, b.shape[1])
    except ShapeError:
        return None  # batch strides that do not merge into rows (or a broadcast residual): batched path
    out = gemm(rows, b, bias, activation, res_rows, alpha, variant=variant, params=params, splits=splits)
    if key is not None:
        inner = _template_key(rows, b, bias, res_rows, activation, alpha)
        hit = capture.plans.get(inner) if inner is not None else None
        if isinstance(hit, tuple):
            capture.plans.put(key, (hit[0], out_shape, hit[2]))
    return out.view(out_shape)


# -- the public entry points --------------------------------------------------------------------------
def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for (..., M, K) and (..., K, N) (1-D operands as in NumPy), batch dims broadcast.

    Transposed or sliced views are read in place. float16 (float32 accumulation), float32, float64.
    """
    return gemm(a, b)


def matmul_rowsum(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor | None]:
    """(a @ b, row sums of a) for 2-D a (M, K) and b (K, N), in one launch where the CPU kernel runs
    (a linear layer's weight and bias gradients: a = g^T). Returns (a @ b, None) when the problem
    takes another kernel (GPU, tiny shapes); the caller then sums a's rows itself."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or len(a.shape) != 2 or len(b.shape) != 2:
        return matmul(a, b), None
    key = _template_key(a, b, None, None, "rowsum", 1.0)
    hit = capture.plans.get(key) if key is not None else None
    if hit is not None:  # recorded only where the checks below chose the cpu kernel
        rowsum = Tensor.empty(a.queue, (a.shape[0],), a.dtype)
        return _replay(hit, a, b, None, None, rowsum), rowsum
    if (a.device.capabilities.kind != "cpu" or a.dtype == dtypes.bfloat16
            or choose_variant(a.device, a.shape[0], b.shape[1], a.shape[1]) != "cpu"):
        return gemm(a, b), None
    p = _prepare(a, b, None, None, None, 1.0)
    if p.out.size == 0:
        return _finish(p), None
    rowsum = Tensor.empty(p.out.queue, (p.m,), p.out.dtype)
    if key is not None:
        _record(key, p, lambda: launch(p, "cpu", rowsum=rowsum))
    else:
        launch(p, "cpu", rowsum=rowsum)
    return _finish(p), rowsum


def matmul_wide(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for 2-D float16/bfloat16 a (M, K) and b (K, N) as float32: the sums as accumulated, not rounded
    to half (autocast's weight gradient g^T x of a float32 parameter, which its cast would only widen again).
    Where the GPU splits K and sums the slices in a reduction launch (a weight gradient: K the batch's
    tokens), that launch writes float32 and no half product is made; bfloat16 through float32 (no matrix
    units) returns the float32 product; elsewhere the half product widened (one launch more). Other
    operands: matmul's result as float32."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor) and len(a.shape) == 2 and len(b.shape) == 2
            and a.dtype == b.dtype and dtypes.is_half(a.dtype)):
        y = matmul(a, b)
        return y if y.dtype == dtypes.float32 else elementwise.cast(y, dtypes.float32)
    key = _template_key(a, b, None, None, "wide", 1.0)
    hit = capture.plans.get(key) if key is not None else None
    if hit == "narrow":  # the problem takes no split reduction here (found on its first call)
        return elementwise.cast(gemm(a, b), dtypes.float32)
    if hit is not None:
        return _replay(hit, a, b, None, None, out_dtype=dtypes.float32)
    if _bfloat16_through_float32(a, b):
        return gemm(elementwise.cast(a, dtypes.float32), elementwise.cast(b, dtypes.float32))
    p = _prepare(a, b, None, None, None, 1.0)
    if p.out.size == 0 or _auto_variant(p) != "mma":
        if key is not None:
            capture.plans.put(key, "narrow")
        return elementwise.cast(gemm(a, b), dtypes.float32)
    p.wide = Tensor.empty(p.out.queue, p.out.shape, dtypes.float32)
    if key is not None:
        _record(key, p, lambda: launch(p, "mma"))
        if p.out is not p.wide:  # not split here: the half product is kept (and its template is matmul's)
            capture.plans.pop(key, None)
            capture.plans.put(key, "narrow")
    else:
        launch(p, "mma")
    out = _finish(p)
    return out if out.dtype == dtypes.float32 else elementwise.cast(out, dtypes.float32)


def matmul_relu_mask(a: Tensor, b: Tensor, mask: Tensor) -> tuple[Tensor, bool]:
    """where(mask > 0, a @ b, 0) for 2-D a, b and mask shaped like the product (a ReLU's backward
    folded into the GEMM that makes the incoming gradient), in the GEMM's epilogue (MASK_RESIDUAL; split-K's
    reduction applies it): on a GPU whatever kernel the problem takes, on a CPU where the cpu kernel runs.
    Returns (result, True), or (a @ b, False) where the mask is not folded (a CPU problem of another kernel,
    bfloat16 through float32): the caller then applies the mask itself."""
    if (
        not (isinstance(a, Tensor) and isinstance(b, Tensor) and isinstance(mask, Tensor))
        or len(a.shape) != 2 or len(b.shape) != 2 or mask.shape != (a.shape[0], b.shape[1])
    ):
        return gemm(a, b), False
    key = _template_key(a, b, None, mask, "relumask", 1.0)
    hit = capture.plans.get(key) if key is not None else None
    if hit is not None:  # recorded only where the checks below folded the mask
        return _replay(hit, a, b, None, mask), True
    cpu = a.device.capabilities.kind == "cpu"
    if (cpu and (a.dtype == dtypes.bfloat16 or choose_variant(a.device, a.shape[0], b.shape[1], a.shape[1])
                 != "cpu")) or (not cpu and _bfloat16_through_float32(a, b)):
        return gemm(a, b), False
    p = _prepare(a, b, None, mask, None, 1.0)
    if p.out.size == 0:
        return _finish(p), True
    variant = "cpu" if cpu else _auto_variant(p)
    if key is not None:
        _record(key, p, lambda: launch(p, variant, mask_residual=True))
    else:
        launch(p, variant, mask_residual=True)
    return _finish(p), True


def matmul_epilogue(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    residual: Tensor | None = None,
    alpha: float = 1.0,
) -> Tensor:
    """activation(alpha * (a @ b) + bias) + residual in one launch.

    bias has shape (N,) (added per column); activation is None, 'relu', 'gelu', 'gelu_tanh' or
    'silu'; residual broadcasts to the output shape and is added after the activation.
    """
    return gemm(a, b, bias, activation, residual, alpha)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """x @ weight.T + bias (then activation), weight shaped (out_features, in_features) like PyTorch.

    The weight is read transposed in place (no copy). x is (..., in_features).
    """
    if not isinstance(weight, Tensor) or len(weight.shape) != 2:
        shape = getattr(weight, "shape", None)
        raise ShapeError(f"linear: weight must be 2-D (out_features, in_features), got shape {shape}")
    if not isinstance(x, Tensor) or not x.shape or x.shape[-1] != weight.shape[1]:
        raise ShapeError(
            f"linear: x of shape {getattr(x, 'shape', None)} does not end in in_features={weight.shape[1]} "
            f"of weight {weight.shape}"
        )
    return gemm(x, weight.transpose(0, 1), bias, activation)


def _matmul_backward(grad_out: Tensor, a: Tensor, b: Tensor, needs: tuple[bool, ...],
                     a_into: Tensor | None = None) -> tuple:
    """(g b^T, a^T g) of matmul, summed over broadcast batch axes; a 1-D operand as the GEMM sees it (a row
    for a, a column for b), its gradient reshaped back. a_into (a's shape and dtype: a's gradient from its
    other readers) is added to g b^T in the GEMM's epilogue where a is not broadcast."""
    a_row, b_column = len(a.shape) == 1, len(b.shape) == 1
    a2 = a.reshape(1, a.shape[0]) if a_row else a
    b2 = b.reshape(b.shape[0], 1) if b_column else b
    g = grad_out
    if a_row or b_column:  # the result's shape before the 1-D operands' axes were dropped
        shape = g.shape
        if a_row:
            shape = shape + (1,) if b_column else shape[:-1] + (1,) + shape[-1:]
        if b_column:
            shape = shape + (1,)
        g = g.reshape(shape)
    ga = None
    if needs[0]:
        bt = b2.transpose(-2, -1)
        if a_into is not None and not a_row and g.shape[:-1] + bt.shape[-1:] == a2.shape:
            ga = gemm(g, bt, residual=a_into)
        else:
            ga = sum_to_shape(matmul(g, bt), a2.shape)
            if a_into is not None:
                ga = elementwise.add(ga.reshape(a.shape), a_into)   # (a's shape: a2's but for a row)
    gb = sum_to_shape(matmul(a2.transpose(-2, -1), g), b2.shape) if needs[1] else None
    if a_row and ga is not None:
        ga = ga.reshape(a.shape)
    if b_column and gb is not None:
        gb = gb.reshape(b.shape)
    return ga, gb


def linear_residual(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor) -> Tensor:
    """x @ weight.T + bias + residual with the residual added in the GEMM's epilogue (one launch)."""
    return gemm(x, weight.transpose(0, 1), bias, None, residual)


def _linear_residual_backward(grad_out: Tensor, x: Tensor, weight: Tensor, residual_shape: tuple[int, ...],
                              needs: tuple[bool, ...], wide: tuple[bool, ...] = ()) -> tuple:
    """(g W, g^T x, g, column sums of g) of linear_residual (x, weight, residual, bias); the residual's
    gradient is g itself. A weight or bias autocast cast from float32 (`wide`) gets float32 sums."""
    in_features, out_features = weight.shape[1], weight.shape[0]
    g2 = grad_out.reshape(-1, out_features)
    x2 = x.reshape(-1, in_features)
    gx = matmul(g2, weight).reshape(x.shape) if needs[0] else None
    gw, gb = linear_param_grads(g2, x2, needs[1], needs[3], *((wide[1], wide[3]) if wide else ()))
    gr = sum_to_shape(grad_out, residual_shape) if needs[2] else None
    return gx, gw, gr, gb


def linear_param_grads(g2: Tensor, x2: Tensor, want_w: bool, want_b: bool, wide_w: bool = False,
                       wide_b: bool = False) -> tuple[Tensor | None, Tensor | None]:
    """(g^T x, column sums of g) of a linear layer's 2-D output gradient g2 and input x2, None where not
    wanted: in one launch where the CPU GEMM runs; float32 sums for a weight or bias autocast cast from
    float32 (`wide_w`, `wide_b`: matmul_wide, float32 column sums)."""
    gw = gb = None
    if want_w and wide_w:
        gw = matmul_wide(g2.transpose(0, 1), x2)
    elif want_w and want_b:
        gw, gb = matmul_rowsum(g2.transpose(0, 1), x2)
    elif want_w:
        gw = matmul(g2.transpose(0, 1), x2)
    if want_b and gb is None:
        gb = _sum(g2, axis=0, dtype=dtypes.float32 if wide_b else None)
    return gw, gb


# the ops on Nodes, made from these (netcl.ops.declaration): float16 and bfloat16 under autocast. linear's
# differentiable op is written by hand (netcl.autograd.nnops: it folds its producer's relu into its input
# gradient, and composes silu and gelu); linear_residual's residual stream is stored half (PyTorch keeps it
# float32 by type promotion; here the stream is what the next norm saves until its rule runs, so a float32
# stream would be held beside the half copies the norms read: 0.70x float32's activation memory instead of
# 0.5x, bench/amp.py)
declare(OpDecl("matmul", matmul, _matmul_backward, inputs=("a", "b"), autocast="half", methods=("matmul",),
               doc="a @ b with NumPy's rules (1-D operands, batch broadcasting); grads g b^T and a^T g."))
declare(OpDecl("linear", linear, inputs=("x", "weight", "bias"), autocast="half", functional=("linear",),
               autograd="manual"))
declare(OpDecl("linear_residual", linear_residual, _linear_residual_backward,
               inputs=("x", "weight", "residual", "bias"), cast=("x", "weight", "bias", "residual"),
               autocast="half"))


# -- the probe of a risky variant (netcl.core.variants runs it in a child process) -----------------------
def probe_variant(device: Any, variant: str, dtype_name: str, tile: dict[str, int]) -> None:
    """Run GEMM `variant` with `tile` on small odd problems in every layout and epilogue it is compiled
    differently for, and raise AssertionError where a result is not NumPy's. The probe of a risky
    variant (netcl.core.variants runs it in a child process: a compiler crash ends only the child)."""
    dt = np.dtype(dtype_name)
    q = device.queue
    rng = np.random.default_rng(0)
    tol = {"float16": 2e-2, "float32": 2e-4, "float64": 1e-10}[dt.name]
    m, n, k = 133, 70, 600  # ragged row and column blocks, more than one k chunk for KC < 600

    def dev(a: np.ndarray) -> Tensor:
        return Tensor.from_host(q, a.astype(dt))

    def near(got: Tensor, want: np.ndarray, what: str) -> None:
        got_h = got.to_host().astype(np.float64)
        scale = max(1.0, float(np.abs(want).max()))
        err = float(np.abs(got_h - want).max())
        if not err <= tol * scale * np.sqrt(k):
            raise AssertionError(f"gemm_{variant} {dtype_name} {tile}: {what} is off by {err:.3g}")

    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    a64, b64 = a.astype(dt).astype(np.float64), b.astype(dt).astype(np.float64)
    bias, res = rng.standard_normal(n), rng.standard_normal((m, n))
    bias64, res64 = bias.astype(dt).astype(np.float64), res.astype(dt).astype(np.float64)
    run = functools.partial(gemm, variant=variant, params=tile)
    near(run(dev(a), dev(b)), a64 @ b64, "a @ b")
    near(run(dev(a), dev(b.T.copy()).transpose(0, 1)), a64 @ b64, "a @ b (b transposed in place)")
    near(run(dev(a.T.copy()).transpose(0, 1), dev(b)), a64 @ b64, "a @ b (a transposed in place)")
    wide = dev(np.repeat(b, 2, axis=1))[:, ::2]
    near(run(dev(a), wide), a64 @ b64, "a @ b (b strided)")
    near(run(dev(a), dev(b), dev(bias), "relu", dev(res), 0.5),
         np.maximum(0.5 * (a64 @ b64) + bias64, 0) + res64, "relu(0.5 a @ b + bias) + residual")
    near(run(dev(np.stack([a, a[::-1]])), dev(b)), np.stack([a64, a64[::-1]]) @ b64, "batched a @ b")
    if variant == "cpu":
        p = _prepare(dev(a), dev(b), None, None, None, 1.0)
        rowsum = Tensor.empty(q, (m,), dt)
        launch(p, variant, tile, rowsum=rowsum)
        near(p.out, a64 @ b64, "a @ b with row sums")
        near(rowsum, a64.sum(axis=1), "row sums of a")
        p = _prepare(dev(a), dev(b), None, dev(res), None, 1.0)
        launch(p, variant, tile, mask_residual=True)
        near(p.out, np.where(res64 > 0, a64 @ b64, 0), "a @ b masked by residual > 0")
