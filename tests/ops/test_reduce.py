"""Reductions, softmax, cumsum, topk against float64 NumPy, on CPU and on the GPU layouts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from netcl import ops
from netcl.core import capture, dtypes
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.jit import reduce as jreduce
from netcl.profiling import count_launches
from tests.reference import assert_close


@pytest.fixture(params=["device", pytest.param("gpu-layout", marks=pytest.mark.gpu_shaped)])
def layout(request, monkeypatch):
    """Run each test with the device's own layout and with the GPU (work-group tree) layout."""
    if request.param == "gpu-layout":
        monkeypatch.setattr(jreduce, "FORCE_KIND", "gpu")
    return request.param


AXES = [None, 0, 1, 2, (0, 2), -1]


# every reduction on the device's layout; on the GPU's work-group tree (emulated, one compiler only) the three
# whose code differs there: sum (identity 0), mean (the division after the tree), max (identity -inf, which
# pads partial work-groups); min and prod are max's and sum's code with another operator
@pytest.mark.parametrize(
    "layout,name",
    [("device", n) for n in ("sum", "mean", "max", "min", "prod")]
    + [pytest.param("gpu-layout", n, marks=pytest.mark.gpu_shaped) for n in ("sum", "mean", "max")],
    indirect=["layout"],
)
def test_reductions_float32(queue, rng, layout, name):
    a = rng.uniform(0.5, 1.5, size=(7, 33, 5)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    ref = getattr(np, name)
    for ax in AXES:
        for keep in (False, True):
            out = getattr(ops, name)(x, axis=ax, keepdims=keep)
            assert_close(out, ref(a.astype(np.float64), axis=ax, keepdims=keep), np.float32, rtol=2e-6,
                         err_msg=f"axis={ax} keepdims={keep}")


def test_sum_noncontiguous_and_dtypes(queue, rng, layout):
    a = rng.standard_normal((17, 130)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    assert_close(ops.sum(x.T[::2], axis=1), a.T[::2].astype(np.float64).sum(1), np.float32, atol=1e-5)
    h = a.astype(np.float16)
    assert_close(ops.sum(Tensor.from_host(queue, h), axis=1), h.astype(np.float64).sum(1), np.float16,
                 rtol=2e-3, atol=2e-2)
    d = a.astype(np.float64)
    assert_close(ops.sum(Tensor.from_host(queue, d), axis=0), d.sum(0), np.float64)
    i = rng.integers(-100, 100, size=(17, 130)).astype(np.int32)
    s = ops.sum(Tensor.from_host(queue, i), axis=0)
    assert s.dtype == np.int64
    np.testing.assert_array_equal(s.to_host(), i.sum(0))
    m = ops.max(Tensor.from_host(queue, i), axis=1)
    np.testing.assert_array_equal(m.to_host(), i.max(1))
    assert ops.mean(Tensor.from_host(queue, i)).dtype == np.float32


def test_large_sum_accuracy(queue, rng, layout):
    a = rng.uniform(0, 1, size=(300_007,)).astype(np.float32)
    got = float(ops.sum(Tensor.from_host(queue, a)).to_host())
    want = a.astype(np.float64).sum()
    # a serial float32 sum is off by ~1e-4 relative here; pairwise/blocked order stays far below
    assert abs(got - want) / want < 2e-6


def test_arg_reductions(queue, rng, layout):
    a = rng.integers(0, 5, size=(9, 31)).astype(np.float32)  # many ties: first occurrence wins
    x = Tensor.from_host(queue, a)
    for ax in (None, 0, 1):
        np.testing.assert_array_equal(ops.argmax(x, ax).to_host(), np.argmax(a, ax))
        np.testing.assert_array_equal(ops.argmin(x, ax).to_host(), np.argmin(a, ax))
    a[3, 7] = np.nan
    x = Tensor.from_host(queue, a)
    np.testing.assert_array_equal(ops.argmax(x, 1).to_host(), np.argmax(a, 1))
    assert np.isnan(ops.max(x).to_host())
    assert ops.argmax(x, 1, keepdims=True).shape == (9, 1)


def test_any_all_var_std_lse(queue, rng, layout):
    a = rng.standard_normal((13, 6)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    np.testing.assert_array_equal(ops.any(x > 1, 1).to_host(), (a > 1).any(1))
    np.testing.assert_array_equal(ops.all(x > -1, 0).to_host(), (a > -1).all(0))
    d = a.astype(np.float64)
    assert_close(ops.var(x, axis=0), d.var(0), np.float32, rtol=1e-5)
    assert_close(ops.std(x, 1, ddof=1), d.std(1, ddof=1), np.float32, rtol=1e-5)
    assert_close(ops.logsumexp(x * 30, 1), np.log(np.exp(d * 30).sum(1)), np.float32, rtol=1e-5)
    ninf = Tensor.from_host(queue, np.full((2, 3), -np.inf, np.float32))
    assert np.all(ops.logsumexp(ninf, 1).to_host() == -np.inf)


def test_softmax_log_softmax(queue, rng, layout):
    a = (rng.standard_normal((5, 7, 33)) * 4).astype(np.float32)
    x = Tensor.from_host(queue, a)
    d = a.astype(np.float64)
    for ax in (-1, 1, 0):
        e = np.exp(d - d.max(ax, keepdims=True))
        assert_close(ops.softmax(x, ax), e / e.sum(ax, keepdims=True), np.float32, rtol=1e-5, atol=1e-7)
        lse = np.log(np.exp(d - d.max(ax, keepdims=True)).sum(ax, keepdims=True)) + d.max(ax, keepdims=True)
        assert_close(ops.log_softmax(x, ax), d - lse, np.float32, rtol=1e-5, atol=1e-5)
    h = a.astype(np.float16)
    e = np.exp(h.astype(np.float64) - h.max(-1, keepdims=True))
    assert_close(ops.softmax(Tensor.from_host(queue, h)), e / e.sum(-1, keepdims=True), np.float16)


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("dt", [np.float16, dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_half_rows_on_the_gpu_layout_load_16_bytes_where_aligned(queue, rng, monkeypatch, dt):
    """Half rows on the GPU's work-group tree: 8 lanes a load (16 bytes) where every operand is aligned to 8
    elements, 4 where one is not (a view one element in, rows of 1003: a partial vector); the work-group
    halved while each work-item still makes four loads of a row (jreduce.ROW_LOADS; 256 would leave half of
    them idle), down to one warp: 32 work-items of 8 lanes for a row of 1000, 64 of 4."""
    monkeypatch.setattr(jreduce, "FORCE_KIND", "gpu")
    lanes, groups = [], []

    def kernel(device, key, real=jreduce._kernel):
        groups.append(key[7])  # L: work-items a row
        lanes.append(key[8])   # W: elements a lane loads at once
        return real(device, key)

    monkeypatch.setattr(jreduce, "_kernel", kernel)
    seen = set()
    for shape, start in (((3, 1000), 0), ((3, 1001), 1), ((3, 1003), 0)):
        a = (rng.standard_normal(shape) * 3).astype(np.float32).astype(dt)
        x, host = Tensor.from_host(queue, a)[:, start:], a[:, start:]
        d = host.astype(np.float64)
        tol = {} if dt == np.float16 else {"rtol": 8e-3, "atol": 1e-3}   # bfloat16: the result's rounding
        assert_close(ops.sum(x, axis=1), d.sum(1), dt, **tol)
        e = np.exp(d - d.max(-1, keepdims=True))
        assert_close(ops.softmax(x, -1), e / e.sum(-1, keepdims=True), dt, **tol)
        lse = np.log(e.sum(-1, keepdims=True)) + d.max(-1, keepdims=True)
        assert_close(ops.log_softmax(x, -1), d - lse, dt, rtol=8e-3, atol=0.02)
        aligned = x.offset % 8 == 0 and x.strides[0] % 8 == 0
        seen.add(aligned)
        assert set(lanes) == {2 * jreduce.knobs().vec if aligned else jreduce.knobs().vec}, lanes
        if jreduce.knobs().vec == 4:   # the default width
            assert set(groups) == {32 if aligned else 64}, groups
        lanes.clear()
        groups.clear()
    assert seen == {True, False}


@pytest.mark.gpu_shaped
def test_several_rows_a_work_group_give_one_rows_bits(queue, rng, monkeypatch):
    """ROW_GROUP_BYTES: G rows a work-group of G x L work-items (each row its own tree in its slice of the
    local arrays; the last group's rows past M repeat the last row and store nothing) give the bits of one
    row a group, for every row-shaped reduction and both softmax forms (registers and two-pass), M not a
    multiple of G."""
    monkeypatch.setattr(jreduce, "FORCE_KIND", "gpu")
    seen: list[tuple[int, int]] = []

    def kernel(device, key, real=jreduce._kernel):
        seen.append((key[7], key[20]))  # (L, G)
        return real(device, key)

    monkeypatch.setattr(jreduce, "_kernel", kernel)
    # rows along the last axis (16-byte loads; the softmax in registers), and along the first of a (100, 6)
    # tensor (scalar loads of strided rows: the two-pass softmax)
    every = ("sum", "argmax", "logsumexp", "softmax", "log_softmax")  # one, two and the lse state; both forms
    cases = [((7, 300), np.float32, 1, every), ((5, 1000), np.float16, 1, every),
             ((100, 6), np.float32, 0, ("softmax", "log_softmax"))]
    for shape, dt, ax, names in cases:
        x = Tensor.from_host(queue, (rng.standard_normal(shape) * 3).astype(dt))
        for name in names:
            def fn(name=name, x=x, ax=ax):
                return getattr(ops, name)(x, ax)

            monkeypatch.setattr(jreduce, "ROW_GROUP_BYTES", 0)
            capture.plans.invalidate()  # a plan keeps its group's rows
            one = fn().to_host()
            monkeypatch.setattr(jreduce, "ROW_GROUP_BYTES", 1 << 20)
            capture.plans.invalidate()
            seen.clear()
            several = fn().to_host()
            assert any(g > 1 for _, g in seen), (name, shape, seen)
            np.testing.assert_array_equal(several.view(np.uint8), one.view(np.uint8), err_msg=name)
        d = x.to_host().astype(np.float64)
        assert_close(ops.sum(x, axis=ax), d.sum(ax), dt)


def test_cumsum_topk(queue, rng, layout):
    a = rng.standard_normal((6, 45)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    assert_close(ops.cumsum(x, 1), np.cumsum(a.astype(np.float64), 1), np.float32, atol=1e-5)
    assert_close(ops.cumsum(x, 0), np.cumsum(a.astype(np.float64), 0), np.float32, atol=1e-5)
    i = Tensor.from_host(queue, np.arange(10, dtype=np.int32))
    np.testing.assert_array_equal(ops.cumsum(i, 0).to_host(), np.cumsum(np.arange(10)))
    v, idx = ops.topk(x, 4, axis=1)
    order = np.argsort(-a, axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(idx.to_host(), order)
    np.testing.assert_array_equal(v.to_host(), np.take_along_axis(a, order, 1))
    v0, i0 = ops.topk(x, 2, axis=0)
    order0 = np.argsort(-a, axis=0, kind="stable")[:2]
    np.testing.assert_array_equal(i0.to_host(), order0)


def test_prologue_fusion_one_launch(queue, rng):
    a = rng.standard_normal((33, 17)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    with count_launches() as c:
        s = (x * x + 1).sum(axis=1)
    assert c.count == 1
    assert_close(s, (a.astype(np.float64) ** 2 + 1).sum(1), np.float32, rtol=1e-5)
    with count_launches() as c:
        sm = ops.softmax(x / 2.0, axis=-1)
    assert c.count == 1
    e = np.exp(a / 2.0 - (a / 2.0).max(1, keepdims=True))
    assert_close(sm, e / e.sum(1, keepdims=True), np.float32, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["reduce", "softmax", "topk", "whole", "argmax"])
def test_a_repeated_reduction_launches_its_plan_with_new_buffers_and_params(queue, rng, layout, mode):
    """One Plan a reduction's layout (its offsets, strides and sizes set once): repeats with other inputs,
    outputs and a prologue's scalar give NumPy's values, from the same plan (a whole tensor's sum and argmax:
    on the GPU's layout in two stages, the second's Plan kept beside the first's)."""
    def run(x, c):
        if mode == "reduce":
            return (x * c).sum(axis=1)
        if mode == "whole":
            return (x * c).sum()
        if mode == "argmax":
            return (x * c).argmax()
        if mode == "softmax":
            return ops.softmax(x * c, axis=-1)
        return ops.topk(x * c, 3, axis=1)[0]

    def want(a, c):
        y = a.astype(np.float64) * c
        if mode == "reduce":
            return y.sum(1)
        if mode == "whole":
            return y.sum()
        if mode == "argmax":
            return np.argmax(y)
        if mode == "softmax":
            e = np.exp(y - y.max(1, keepdims=True))
            return e / e.sum(1, keepdims=True)
        return -np.sort(-y, axis=1)[:, :3]

    plans = []
    for c in (0.5, -1.5, 2.0):
        a = rng.standard_normal((19, 700)).astype(np.float32)
        got = run(Tensor.from_host(queue, a), c)
        if mode == "argmax":
            assert int(got.item()) == want(a, c)
        else:
            assert_close(got, want(a, c), np.float32, rtol=1e-5, atol=1e-4 if mode == "whole" else 1e-5)
        kind = "reduce" if mode in ("whole", "argmax") else mode
        plans.append([(p[-1][0], p[-2][0]) for k, p in capture.plans.items()
                      if type(k) is tuple and k[:1] == ("reduce",) and k[3] == kind and p[-1][0] is not None])
    assert plans[0] and all(len(p) == len(plans[0]) for p in plans)   # no new plan after the first call
    assert all(a is b for pa, pb in zip(plans[0], plans[-1]) for a, b in zip(pa, pb))
    if layout == "gpu-layout" and mode in ("whole", "argmax"):   # the second stage's Plan, made once
        assert any(stage2 is not None for _, stage2 in plans[-1])


def test_empty_and_errors(queue):
    z = Tensor.from_host(queue, np.zeros((0, 4), np.float32))
    np.testing.assert_array_equal(ops.sum(z, 0).to_host(), np.zeros(4))
    np.testing.assert_array_equal(ops.prod(z, 0).to_host(), np.ones(4))
    with pytest.raises(ShapeError, match="zero-size"):
        ops.max(z, axis=0)
    x = Tensor.from_host(queue, np.zeros((3, 4), np.float32))
    with pytest.raises(ShapeError, match=r"axis 2 is out of range.*\(3, 4\)"):
        ops.sum(x, 2)
    with pytest.raises(ShapeError, match="repeats"):
        ops.sum(x, (1, -1))
    with pytest.raises(ShapeError, match="k=5"):
        ops.topk(x, 5)


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "max", "min", "argmax", "logsumexp", "var", "std",
                                  "softmax", "cumsum"])
def test_a_reduction_of_what_is_not_a_tensor_names_itself(name):
    """sum, mean, prod, max, min, logsumexp, var and std read x.dtype or x.shape first: AttributeError for
    None or a list; the others said 'expected a Tensor' without the op."""
    op = getattr(ops, name)
    for bad, hint in ((None, ""), (np.ones(3), "; move it to the device first"), ([1.0, 2.0], "; move it")):
        with pytest.raises(DTypeError, match=rf"^{name}: expected a Tensor, got {type(bad).__name__}{hint}"):
            op(bad, 0) if name == "cumsum" else op(bad)


@pytest.mark.parametrize("softmax_reg", [8, 0])
def test_softmax_long_rows(queue, rng, layout, monkeypatch, softmax_reg):
    """Rows long enough for the GPU work-group layouts (row in registers, and the two-pass path),
    with tails that are not a multiple of the vector width, and unaligned views."""
    monkeypatch.setattr(jreduce, "_knobs", replace(jreduce.knobs(), softmax_reg=softmax_reg))
    for shape in ((3, 130), (2, 2100)):
        a = (rng.standard_normal(shape) * 3).astype(np.float32)
        full = Tensor.from_host(queue, a)
        for x, arr in ((full, a), (full[:, 1:], a[:, 1:])):
            d = arr.astype(np.float64)
            with np.errstate(invalid="ignore"):
                m = d.max(-1, keepdims=True)
                e = np.exp(d - m)
                ref = e / e.sum(-1, keepdims=True)
                lref = d - m - np.log(e.sum(-1, keepdims=True))
            assert_close(ops.softmax(x, -1), ref, np.float32, rtol=1e-5, atol=1e-7)
            assert_close(ops.log_softmax(x, -1), lref, np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vec", [4, 8])
def test_sum_vector_widths_unaligned(queue, rng, layout, monkeypatch, vec):
    monkeypatch.setattr(jreduce, "_knobs", replace(jreduce.knobs(), vec=vec))
    a = rng.uniform(-1, 1, size=(70_001,)).astype(np.float32)
    x = Tensor.from_host(queue, a)
    for view, arr in ((x, a), (x[1:], a[1:]), (x[3:-2], a[3:-2])):
        assert_close(ops.sum(view), arr.astype(np.float64).sum(), np.float32, rtol=2e-6, atol=1e-4)
        assert_close(ops.max(view), arr.max(), np.float32)
    m = rng.standard_normal((5, 1001)).astype(np.float32)
    assert_close(ops.sum(Tensor.from_host(queue, m), 1), m.astype(np.float64).sum(1), np.float32, rtol=1e-5,
                 atol=1e-5)


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("registers", [8, 0], ids=["row-in-registers", "online"])
def test_softmax_nan_row(queue, monkeypatch, registers):
    """A NaN poisons its whole row (as in NumPy/PyTorch) in both GPU variants: the row held in registers,
    and the online max/sum pass, where the NaN is the only value of its vector lane on its work-item (the
    lane's state keeps max -inf with a NaN sum, which the merge of states once skipped)."""
    monkeypatch.setattr(jreduce, "FORCE_KIND", "gpu")
    monkeypatch.setattr(jreduce, "_knobs", replace(jreduce.knobs(), softmax_reg=registers))
    a = np.linspace(-3, 3, 3 * 130, dtype=np.float32).reshape(3, 130)
    a[1, 5] = np.nan
    x = Tensor.from_host(queue, a)
    y = ops.softmax(x, -1).to_host()
    assert np.isnan(y[1]).all() and not np.isnan(y[[0, 2]]).any()
    np.testing.assert_allclose(y[[0, 2]].sum(1), 1.0, rtol=1e-5)
    z = ops.log_softmax(x, -1).to_host()
    assert np.isnan(z[1]).all() and not np.isnan(z[[0, 2]]).any()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's "Degrees of freedom <= 0"
@pytest.mark.parametrize("ddof", [3, 4])
def test_var_with_ddof_at_or_past_the_count_is_numpys(queue, ddof):
    """n - ddof <= 0 divides by 0 as NumPy does: inf, or nan where every value equals the mean."""
    a = np.array([[1.0, 2.0, 4.0], [5.0, 5.0, 5.0]], np.float32)
    x = Tensor.from_host(queue, a)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(ops.var(x, axis=1, ddof=ddof).to_host(), np.var(a, axis=1, ddof=ddof))
        np.testing.assert_array_equal(ops.std(x, axis=1, ddof=ddof).to_host(), np.std(a, axis=1, ddof=ddof))


@pytest.mark.parametrize("name", ["sum", "mean", "max", "argmax", "argmin"])
def test_column_reductions_over_many_rows(queue, rng, layout, name):
    """A reduction over the leading axis with the kept axis innermost (a norm's weight gradient): the GPU
    layout splits the rows into parts (of COL_CHUNK rows at least: 14 here) and combines the partial states,
    indices included, in a second launch."""
    a = rng.standard_normal((1000, 300)).astype(np.float32)
    a[700, 5] = a[:, 5].max() + 1  # a late maximum: the index must come from a later part
    got = getattr(ops, name)(Tensor.from_host(queue, a), axis=0).to_host()
    want = getattr(np, name)(a.astype(np.float64), axis=0)
    if name.startswith("arg"):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 * np.abs(a).sum(0).max())  # float32 sums
