"""ops.gemm.gemv_chain (gemm_gemv.cl's gemv_chain): a decode layer's MLP half in one launch, against float64
NumPy on the stored inputs and each step's own inputs, over repeated calls (the counts reset by the launch's
last tile), a graph replay, and its refusals."""

import numpy as np
import pytest

from netcl import graph
from netcl.core import dtypes
from netcl.core.tensor import Tensor
from netcl.errors import NetclError, ShapeError
from netcl.ops.gemm import ChainStep, gemv_chain

# max |error| / max |reference| of each step: float32's sums, a half output's rounding (and its input's)
TOL = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def _f64(t: Tensor) -> np.ndarray:
    return t.to_host().astype(np.float64)


def _layer(queue, rng, dt, m, d=64, hidden=176):
    """The tensors of a decode layer's MLP half: the attention's rows, the residual stream, o-proj, the norm
    weight, gate/up stacked, down."""
    def t(shape, scale=1.0):
        return Tensor.from_host(queue, (rng.standard_normal(shape) * scale).astype(dt))
    return (t((m, d)), t((m, d)), t((d, d), 0.125), t((d,)), t((2 * hidden, d), 0.125), t((d, hidden), 0.08))


def _check(y, h, z, attn, x, wo, ln, wgu, wd, eps, tol):
    """Each step against float64 NumPy on what it read (the earlier steps' stored outputs)."""
    hidden = wd.shape[1]
    y_ref = _f64(attn) @ _f64(wo).T + _f64(x)
    yy = _f64(y)
    normed = yy / np.sqrt((yy ** 2).mean(-1, keepdims=True) + eps) * _f64(ln)
    gate, up = normed @ _f64(wgu)[:hidden].T, normed @ _f64(wgu)[hidden:].T
    h_ref = gate / (1 + np.exp(-gate)) * up
    z_ref = _f64(h) @ _f64(wd).T + yy
    for name, got, ref in (("o + residual", y, y_ref), ("norm + swiglu", h, h_ref),
                           ("down + residual", z, z_ref)):
        err = np.abs(_f64(got) - ref).max() / np.abs(ref).max()
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol}"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("m", [1, 3])
def test_mlp_half_of_a_decode_layer_in_one_launch(queue, dtype, m):
    rng = np.random.default_rng(m)
    dt = dtypes.normalize(dtype)
    attn, x, wo, ln, wgu, wd = _layer(queue, rng, dt, m)
    steps = [ChainStep(attn, wo, residual=x), ChainStep(0, wgu, norm=(ln, 1e-5), glu=True),
             ChainStep(1, wd, residual=0)]
    first = gemv_chain(steps)
    _check(*first, attn, x, wo, ln, wgu, wd, 1e-5, TOL[dtype])
    for _ in range(3):  # the counts were reset: the same bits every call
        again = gemv_chain(steps)
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a.to_host(), b.to_host())


def test_each_step_alone_and_two_steps_equal_the_chain(queue):
    """A step's result does not depend on what else shares its launch."""
    rng = np.random.default_rng(5)
    attn, x, wo, ln, wgu, wd = _layer(queue, rng, np.float32, 2)
    y, h, z = gemv_chain([ChainStep(attn, wo, residual=x), ChainStep(0, wgu, norm=(ln, 1e-5), glu=True),
                          ChainStep(1, wd, residual=0)])
    (y1,) = gemv_chain([ChainStep(attn, wo, residual=x)])
    (h1,) = gemv_chain([ChainStep(y1, wgu, norm=(ln, 1e-5), glu=True)])
    y2, h2 = gemv_chain([ChainStep(attn, wo, residual=x), ChainStep(0, wgu, norm=(ln, 1e-5), glu=True)])
    (z1,) = gemv_chain([ChainStep(h1, wd, residual=y1)])
    for a, b in ((y, y1), (h, h1), (z, z1), (y, y2), (h, h2)):
        np.testing.assert_array_equal(a.to_host(), b.to_host())


def test_four_steps_and_a_step_reading_two_steps_back(queue):
    rng = np.random.default_rng(6)
    d = 32
    x = Tensor.from_host(queue, rng.standard_normal((1, d)).astype(np.float32))
    ws = [Tensor.from_host(queue, (rng.standard_normal((d, d)) / 4).astype(np.float32)) for _ in range(4)]
    outs = gemv_chain([ChainStep(x, ws[0]), ChainStep(0, ws[1]), ChainStep(1, ws[2], residual=0),
                       ChainStep(2, ws[3], residual=1)])
    a = x.to_host().astype(np.float64)
    o0 = a @ _f64(ws[0]).T
    o1 = _f64(outs[0]) @ _f64(ws[1]).T
    o2 = _f64(outs[1]) @ _f64(ws[2]).T + _f64(outs[0])
    o3 = _f64(outs[2]) @ _f64(ws[3]).T + _f64(outs[1])
    for got, ref in zip(outs, (o0, o1, o2, o3)):
        np.testing.assert_allclose(_f64(got), ref, rtol=1e-5, atol=1e-5)


def test_graph_replay_reads_the_new_inputs(queue):
    rng = np.random.default_rng(7)
    attn, x, wo, ln, wgu, wd = _layer(queue, rng, np.float32, 1)
    steps = [ChainStep(attn, wo, residual=x), ChainStep(0, wgu, norm=(ln, 1e-5), glu=True),
             ChainStep(1, wd, residual=0)]
    g = graph.Graph()
    with g.capture(queue):
        outs = gemv_chain(steps)
    for _ in range(2):
        attn.copy_from_host(rng.standard_normal(attn.shape).astype(np.float32))
        g.replay()
        _check(*outs, attn, x, wo, ln, wgu, wd, 1e-5, TOL["float32"])


def test_refusals_name_the_step(queue):
    rng = np.random.default_rng(8)
    attn, x, wo, ln, wgu, wd = _layer(queue, rng, np.float32, 1)
    with pytest.raises(NetclError, match="step 0's input names step 1"):
        gemv_chain([ChainStep(1, wo)])
    with pytest.raises(ShapeError, match="step 1's weight"):
        gemv_chain([ChainStep(attn, wo), ChainStep(0, wd)])
    with pytest.raises(ShapeError, match="K = 12"):
        gemv_chain([ChainStep(Tensor.zeros(queue, (1, 12)), Tensor.zeros(queue, (4, 12)))])
    with pytest.raises(ShapeError, match="1 <= M <= 8"):
        gemv_chain([ChainStep(Tensor.zeros(queue, (9, 64)), wo)])
    with pytest.raises(NetclError, match="float16"):
        gemv_chain([ChainStep(attn, wo, residual=Tensor.zeros(queue, (1, 64), np.float16))])
    with pytest.raises(ShapeError, match="contiguous"):
        gemv_chain([ChainStep(attn, wo.transpose(0, 1))])
    with pytest.raises(ValueError, match="1 to 4"):
        gemv_chain([ChainStep(attn, wo)] * 5)
    with pytest.raises(TypeError, match="not a ChainStep"):
        gemv_chain([(attn, wo)])


# -- a decode step's attention as the chain's first tiles (gemm_gemv.cl's CHAIN_ATTN) ---------------------
def gpu_shaped_chain(monkeypatch, keys_a_tile=None, tile=(32, 8), items=None, preload=0):
    """The GPU kernels on any device: the decode attention (split over the keys: a tile of them a split, or
    with `preload`, DECODE_PRELOAD_KEYS, at most that many a split held in local memory; `items` work-items,
    default 256) and the GPUs' gemv tile (GEMV_WG, GEMV_ROWS = `tile`: 32 x 8 work-items, which the
    attention's 256 fill) with the norm in its prologue."""
    from netcl.ops import attention as attn_mod
    from netcl.ops.gemm import variants

    monkeypatch.setattr(attn_mod, "variant_override", "gpu")
    monkeypatch.setattr(attn_mod, "DECODE_GROUPS_PER_CU", 1000)
    monkeypatch.setattr(attn_mod, "DECODE_PRELOAD_KEYS", preload)
    if keys_a_tile is not None:
        monkeypatch.setattr(attn_mod, "DECODE_TILE_KEYS", (keys_a_tile,))
    if items is not None:
        monkeypatch.setattr(attn_mod, "DECODE_ITEMS", items)
    for name in ("float32", "float16", "bfloat16"):
        knobs = dict(variants.CLASS_DEFAULTS["cpu"]["gemv"][name], GEMV_WG=tile[0], GEMV_ROWS=tile[1],
                     GEMV_NORM=1)
        monkeypatch.setitem(variants.CLASS_DEFAULTS["cpu"]["gemv"], name, knobs)


def attention_layer(queue, dt, position, heads=(8, 2), head_dim=16, cap=40, hidden=48, seed=0):
    """A decode layer of one row: its stacked q/k/v product y (1, HQ + 2 HKV, 1, D), rope tables, the caches'
    contents (host), the residual stream and the MLP half's weights."""
    from netcl import ops

    rng = np.random.default_rng(seed)
    hq, hkv = heads
    dim = hq * head_dim

    def t(shape, scale=1.0):
        return Tensor.from_host(queue, (rng.standard_normal(shape) * scale).astype(dt))
    y = t((1, hq + 2 * hkv, 1, head_dim))
    caches = [rng.standard_normal((1, hkv, cap, head_dim)).astype(dt) for _ in range(2)]
    return dict(y=y, hq=hq, tables=ops.rope_tables(queue, cap, head_dim), caches=caches,
                position=Tensor.from_host(queue, np.array([position], np.int32)), x=t((1, dim)),
                wo=t((dim, dim), 0.1), ln=t((dim,)), wgu=t((2 * hidden, dim), 0.1), wd=t((dim, hidden), 0.1))


def run_attention_layer(queue, layer, joined):
    """The layer's attention and MLP half, the attention joined to the chain's launch or launched alone
    first: (the attention's out and lse, the caches, the chain's outputs), on the host."""
    from netcl import ops
    from netcl.ops.gemm import chain

    kc, vc = (Tensor.from_host(queue, c.copy()) for c in layer["caches"])
    phase = ops.rope_cache_decode_phase(layer["y"], layer["hq"], *layer["tables"], kc, vc, layer["position"])
    assert phase is not None
    o = phase.out.reshape(1, -1)
    steps = [ChainStep(o, layer["wo"], residual=layer["x"]),
             ChainStep(0, layer["wgu"], norm=(layer["ln"], 1e-5), glu=True),
             ChainStep(1, layer["wd"], residual=0)]
    if joined:
        assert chain.attention_fits(phase, o, max(o.shape[1], layer["wd"].shape[1]))
        outs = gemv_chain(steps, attention=phase)
    else:
        phase.launch()
        outs = gemv_chain(steps)
    return [t.to_host() for t in (phase.out, phase.lse, kc, vc, *outs)], phase.grid[0]


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("dtype,position,keys,cap,splits,items,preload", [
    ("bfloat16", 21, 64, 64, 1, None, 0),       # one split
    ("float16", 250, 64, 300, 5, None, 0),
    ("float32", 99, 16, 128, 8, 96, 0),       # the chain's work-items past the attention's 96 only wait
    # the splits' keys held in local memory: one split of 8 tiles; two of three splits live; one of two
    ("bfloat16", 99, 16, 128, 1, None, 128),
    ("float16", 250, 64, 300, 3, None, 128),
    ("float32", 20, 16, 128, 2, 96, 64),
])
def test_a_decode_attention_joins_the_chain(queue, monkeypatch, dtype, position, keys, cap, splits, items,
                                            preload):
    """rope_cache_decode_phase's launch as the chain's first tiles: the attention (q rotated, the new k and v
    rows into the caches, the keys in one split or several merged by the last) and the three steps after it
    (the first reads the attention's rows) with the bits of the attention's own launch and then the chain,
    call after call (the chain's counts and the merge's arrival counts reset), float32 and half storage."""
    gpu_shaped_chain(monkeypatch, keys, items=items, preload=preload)
    layer = attention_layer(queue, dtypes.normalize(dtype), position, cap=cap)
    want, made = run_attention_layer(queue, layer, joined=False)
    assert made == splits
    for _ in range(3):
        got, _ = run_attention_layer(queue, layer, joined=True)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.gpu_shaped
def test_a_joined_attention_replays_with_a_new_position(queue, monkeypatch):
    """A graph of the joined launch replayed after the position moved: the attention reads the new length
    and writes the new rows where the separate launches do."""
    gpu_shaped_chain(monkeypatch, 16)
    layer = attention_layer(queue, dtypes.bfloat16, 30, cap=64)
    from netcl import ops

    results = []
    for joined in (True, False):
        kc, vc = (Tensor.from_host(queue, c.copy()) for c in layer["caches"])
        layer["position"].copy_from_host(np.array([30], np.int32))
        g = graph.Graph()
        with g.capture(queue):
            phase = ops.rope_cache_decode_phase(layer["y"], layer["hq"], *layer["tables"], kc, vc,
                                                layer["position"])
            o = phase.out.reshape(1, -1)
            steps = [ChainStep(o, layer["wo"], residual=layer["x"]),
                     ChainStep(0, layer["wgu"], norm=(layer["ln"], 1e-5), glu=True)]
            if joined:
                outs = gemv_chain(steps, attention=phase)
            else:
                phase.launch()
                outs = gemv_chain(steps)
        seen = []
        for p in (31, 47, 48):
            layer["position"].copy_from_host(np.array([p], np.int32))
            g.replay()
            seen.append([t.to_host() for t in (phase.out, phase.lse, *outs)])
        results.append((seen, kc.to_host(), vc.to_host()))
    (seen, kc, vc), (want_seen, wkc, wvc) = results
    for got, want in zip(seen, want_seen, strict=True):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    np.testing.assert_array_equal(kc.view(np.uint8), wkc.view(np.uint8))
    np.testing.assert_array_equal(vc.view(np.uint8), wvc.view(np.uint8))


@pytest.mark.gpu_shaped
def test_an_attention_that_does_not_fit_is_refused(queue, monkeypatch):
    """More work-items than the chain's work-group, or another dtype: attention_fits says no and gemv_chain
    refuses it (the caller then launches it alone)."""
    from netcl import ops
    from netcl.ops import attention as attn_mod
    from netcl.ops.gemm import chain

    gpu_shaped_chain(monkeypatch)
    layer = attention_layer(queue, dtypes.bfloat16, 5)
    kc, vc = (Tensor.from_host(queue, c.copy()) for c in layer["caches"])
    monkeypatch.setattr(attn_mod, "DECODE_ITEMS", 512)
    phase = ops.rope_cache_decode_phase(layer["y"], layer["hq"], *layer["tables"], kc, vc, layer["position"])
    o = phase.out.reshape(1, -1)
    assert not chain.attention_fits(phase, o, o.shape[1])
    with pytest.raises(NetclError, match="cannot join the chain"):
        gemv_chain([ChainStep(o, layer["wo"], residual=layer["x"])], attention=phase)
    other = Tensor.zeros(queue, o.shape, np.float32)
    assert not chain.attention_fits(phase, other, o.shape[1])


# -- whole decode layers in one launch (gemm_gemv.cl's gemv_layers) ------------------------------------------
def random_decode_layers(queue, dt, n, position, heads=(8, 2), head_dim=16, cap=40, hidden=48, seed=0):
    """n decode layers of one row (their weights, the caches' contents on the host), the input row, the rope
    tables and the position."""
    from netcl import ops

    rng = np.random.default_rng(seed)
    hq, hkv = heads
    dim, nq = hq * head_dim, (hq + 2 * hkv) * head_dim

    def t(shape, scale=1.0, offset=0.0):
        return Tensor.from_host(queue, (rng.standard_normal(shape) * scale + offset).astype(dt))
    layers = [dict(wq=t((nq, dim), 0.2), nwa=t((dim,), 0.1, 1.0), wo=t((dim, dim), 0.1),
                   nwm=t((dim,), 0.1, 1.0), wgu=t((2 * hidden, dim), 0.1), wd=t((dim, hidden), 0.1),
                   caches=[rng.standard_normal((1, hkv, cap, head_dim)).astype(dt) for _ in range(2)])
              for _ in range(n)]
    return dict(layers=layers, hq=hq, hkv=hkv, head_dim=head_dim, x=t((1, dim)),
                tables=ops.rope_tables(queue, cap, head_dim),
                position=Tensor.from_host(queue, np.array([position], np.int32)))


def run_decode_layers(queue, model, layered, eps=(1e-5, 1e-6)):
    """The layers' last output and every cache on the host: through gemv_layers, or each phase's own launch
    (the q/k/v product as a one-step chain, the attention's launch, the MLP half's chain)."""
    from netcl import ops
    from netcl.ops.gemm import chain

    caches = [[Tensor.from_host(queue, c.copy()) for c in layer["caches"]] for layer in model["layers"]]
    hq, hkv, hd = model["hq"], model["hkv"], model["head_dim"]

    def phase(qkv, kc, vc, n=1):
        y = qkv.reshape(1, 1, hq + 2 * hkv, hd).permute(0, 2, 1, 3)
        return ops.rope_cache_decode_phase(y, hq, *model["tables"], kc, vc, model["position"], layers=n)
    x = model["x"]
    if layered:
        layers = [chain.DecodeLayer(lay["wq"], lay["nwa"], kc, vc, lay["wo"], lay["nwm"], lay["wgu"],
                                    lay["wd"]) for lay, (kc, vc) in zip(model["layers"], caches, strict=True)]
        out = chain.gemv_layers(x, layers, eps, lambda qkv, n: phase(qkv, caches[0][0], caches[0][1], n))
        assert out is not None
    else:
        for lay, (kc, vc) in zip(model["layers"], caches, strict=True):
            (qkv,) = gemv_chain([ChainStep(x, lay["wq"], norm=(lay["nwa"], eps[0]))])
            p = phase(qkv, kc, vc)
            p.launch()
            x = gemv_chain([ChainStep(p.out.reshape(1, -1), lay["wo"], residual=x),
                            ChainStep(0, lay["wgu"], norm=(lay["nwm"], eps[1]), glu=True),
                            ChainStep(1, lay["wd"], residual=0)])[2]
        out = x
    return [out.to_host()] + [c.to_host() for pair in caches for c in pair]


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("dtype,n,per,position,keys,cap,preload", [
    ("bfloat16", 3, None, 21, None, 64, 0),     # one launch, one split of the keys
    ("float16", 5, 2, 250, 64, 300, 0),         # three launches (2 + 2 + 1 layers), five splits
    ("float32", 4, 3, 99, 16, 128, 0),          # two launches, eight splits
    ("bfloat16", 3, None, 99, 16, 300, 128),    # the keys held in local memory: one of three splits live
])
def test_decode_layers_in_one_launch(queue, monkeypatch, dtype, n, per, position, keys, cap, preload):
    """Whole decode layers (RMSNorm + q/k/v, the attention with its caches, o-projection + residual, RMSNorm +
    gate/up + SwiGLU, down + residual) through gemv_layers, in one launch or several (the device's argument
    space; forced smaller here): the last output and every layer's caches with the bits of each phase's own
    launch, call after call (the counts reset)."""
    from netcl.ops.gemm import chain

    gpu_shaped_chain(monkeypatch, keys, preload=preload)
    if per is not None:
        monkeypatch.setattr(chain, "layers_per_launch", lambda device: per)
    model = random_decode_layers(queue, dtypes.normalize(dtype), n, position, cap=cap)
    want = run_decode_layers(queue, model, layered=False)
    for _ in range(2):
        got = run_decode_layers(queue, model, layered=True)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.gpu_shaped
def test_layers_trace_records_every_tile_in_phase_order(queue, monkeypatch):
    """chain.TRACE: every tile of a gemv_layers launch leaves one record (its phase and tile, four stamps in
    order), no tile of a phase is released before the last tile of the phase it waits for has ended, and
    the outputs and caches keep their bits."""
    from netcl.ops.gemm import chain

    gpu_shaped_chain(monkeypatch, 16)   # several splits of the keys
    model = random_decode_layers(queue, dtypes.bfloat16, 3, 17)
    want = run_decode_layers(queue, model, layered=True)
    monkeypatch.setattr(chain, "TRACE", True)
    monkeypatch.setattr(chain, "_last_trace", {})
    assert chain.read_trace() is None
    got = run_decode_layers(queue, model, layered=True)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    tr = chain.read_trace()
    per = tr["phase_tiles"]
    assert tr["layers"] == 3 and per[1] > 1 and len(tr["start"]) == 3 * sum(per)
    assert per[1] == int(np.prod(tr["attention_grid"])) and tr["attention_grid"][0] > 1   # several splits
    for g in range(15):
        mine = tr["phase"] == g
        assert sorted(tr["tile"][mine]) == list(range(per[g % 5]))
    stamps = np.stack([tr[k] for k in ("start", "release", "end", "arrived")], axis=1)
    later = (lambda a, b: a >= b) if tr["ns"] else (lambda a, b: a > b)   # a timer's tick holds two stamps
    assert later(np.diff(stamps, axis=1), 0).all()
    if not tr["ns"]:   # ticks of one counter: every stamp its own
        assert len(np.unique(stamps)) == stamps.size
    for g in range(1, 15):
        assert later(tr["release"][tr["phase"] == g].min(), tr["end"][tr["phase"] == g - 1].max())


@pytest.mark.parametrize("spin", [0, 64])
def test_polled_waits_keep_the_bits(queue, monkeypatch, spin):
    """chain.SPIN_NS (a chain tile polls its phase's count with loads, sleeping between them, instead of
    atomics) leaves every output and cache bit as it was, whole layers in one launch; a bad value is named."""
    from netcl.ops.gemm import chain

    monkeypatch.setattr(chain, "SPIN_NS", -5)
    with pytest.raises(ValueError, match="SPIN_NS"):
        chain._spin_defines()
    if "cl_nv_compiler_options" not in queue.device.capabilities.extensions:
        pytest.skip("the polled wait is NVIDIA's PTX; elsewhere the atomic read stays")
    monkeypatch.setattr(chain, "SPIN_NS", None)
    gpu_shaped_chain(monkeypatch, 16)   # several splits of the keys: the attention's tiles wait too
    model = random_decode_layers(queue, dtypes.bfloat16, 3, 17)
    want = run_decode_layers(queue, model, layered=True)
    monkeypatch.setattr(chain, "SPIN_NS", spin)
    got = run_decode_layers(queue, model, layered=True)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("ahead", [(16, 4), (96, 0b11101, 0b01101)])
def test_read_ahead_keeps_the_bits(queue, monkeypatch, ahead):
    """chain.AHEAD (a tile asks L2 for the rest of its weight rows once the phase before its own is
    released: the o-projection's only; every GEMV phase's, all but down's from two phases ahead) leaves every
    output and cache bit as it was, call after call; a bad value is named."""
    from netcl.ops.gemm import chain

    for bad in [(0, 4), (16, 2), (16, 32), [16, 4], (16.0, 4), (16, 4, 8), (16, 4, 4, 4)]:
        monkeypatch.setattr(chain, "AHEAD", bad)
        with pytest.raises(ValueError, match="AHEAD"):
            chain._ahead_defines()
    monkeypatch.setattr(chain, "AHEAD", None)
    gpu_shaped_chain(monkeypatch, 16)
    model = random_decode_layers(queue, dtypes.bfloat16, 3, 17)
    want = run_decode_layers(queue, model, layered=True)
    monkeypatch.setattr(chain, "AHEAD", ahead)
    for _ in range(2):
        got = run_decode_layers(queue, model, layered=True)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_decode_layers_refusals(queue, monkeypatch):
    """gemv_layers names what is wrong (no list, a layer of another kind or shape, a cache unlike layer 0's,
    bad eps), and gives None without launching where the attention does not come or the device's argument
    space holds no layer."""
    from netcl.ops.gemm import chain
    from netcl.profiling import count_launches

    model = random_decode_layers(queue, dtypes.bfloat16, 2, 5)
    caches = [[Tensor.from_host(queue, c) for c in lay["caches"]] for lay in model["layers"]]
    layers = [chain.DecodeLayer(lay["wq"], lay["nwa"], kc, vc, lay["wo"], lay["nwm"], lay["wgu"], lay["wd"])
              for lay, (kc, vc) in zip(model["layers"], caches, strict=True)]
    x, eps = model["x"], (1e-5, 1e-5)
    with pytest.raises(ValueError, match="non-empty list"):
        chain.gemv_layers(x, [], eps, lambda qkv, n: None)
    with pytest.raises(TypeError, match="layer 1 is a tuple"):
        chain.gemv_layers(x, [layers[0], tuple(layers[1].__dict__.values())], eps, lambda qkv, n: None)
    bad = chain.DecodeLayer(*[t if i != 6 else model["layers"][0]["wo"] for i, t in
                              enumerate(layers[1].__dict__.values())])
    with pytest.raises(ShapeError, match="layer 1's gate_up"):
        chain.gemv_layers(x, [layers[0], bad], eps, lambda qkv, n: None)
    short = Tensor.from_host(queue, np.zeros((1, 2, 8, 16), dtypes.bfloat16))
    with pytest.raises(ShapeError, match="layer 1's k_cache"):
        chain.gemv_layers(x, [layers[0], chain.DecodeLayer(*[short if i == 2 else t for i, t in
                                                             enumerate(layers[1].__dict__.values())])],
                          eps, lambda qkv, n: None)
    with pytest.raises(ShapeError, match="2-D Tensor"):
        chain.gemv_layers(x.reshape(-1), layers, eps, lambda qkv, n: None)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        chain.gemv_layers(x, layers, (1e-5, -1.0), lambda qkv, n: None)
    with count_launches() as c:
        assert chain.gemv_layers(x, layers, eps, lambda qkv, n: None) is None
        monkeypatch.setattr(chain, "layers_per_launch", lambda device: 0)
        asked = []
        assert chain.gemv_layers(x, layers, eps, lambda qkv, n: asked.append(n)) is None
        assert not asked
    assert c.count == 0



@pytest.mark.gpu_shaped
def test_layers_with_the_preload_ask_for_three_work_groups_registers(queue, monkeypatch):
    """chain.CAP_REGISTERS: a gemv_layers build holding the attention's preload asks for the registers of
    three work-groups an SM (80 for 256 work-items; NVIDIA then assembles it again within them, elsewhere it
    is not read), one without the preload asks for nothing, nor any with the switch off; the bits the same."""
    from netcl.ops.gemm import chain

    asked = []
    real = chain._program
    monkeypatch.setattr(chain, "_program", lambda device, variant, defines: asked.append(
        dict(defines)) or real(device, variant, defines))
    want = None
    for preload, cap, wanted in ((64, True, (("gemv_layers", 80),)), (0, True, None), (64, False, None)):
        gpu_shaped_chain(monkeypatch, 16, preload=preload)
        monkeypatch.setattr(chain, "CAP_REGISTERS", cap)
        asked.clear()
        model = random_decode_layers(queue, dtypes.bfloat16, 2, 17)
        got = run_decode_layers(queue, model, layered=True)
        layers = [d for d in asked if "GEMV_LAYERS" in d]
        assert layers and all(d.get("MAX_REGISTERS") == wanted for d in layers), (preload, cap)
        assert all(("DECODE_PRELOAD" in d) == bool(preload) for d in layers)
        if want is None:
            want = got
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    assert chain._register_cap(256) == 80   # 65,536 / 768 = 85.3, in steps of 8
    assert chain._register_cap(128) == 168 and chain._register_cap(32) == 255
    for items in (96, 512, 1024):
        cap = chain._register_cap(items)
        assert cap % 8 == 0 and 3 * items * cap <= chain.REGISTER_FILE < 3 * items * (cap + 8)
