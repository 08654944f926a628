"""Attention kernels under Oclgrind: attention_cpu.cl and attention_gpu.cl (forward, dq and dk/dv passes) and
attention_dropout.cl's keep-mask on small odd shapes (rows and keys not multiples of the blocks, GQA, a
strided bool mask, kv_len, causal, dropout, a head dim that is not a multiple of the vector width; q, k, v
and so the output and dk, dv in a (B, S, H, D) memory order)."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.ops as ops
from netcl.ops import attention as attn
from netcl.ops import determinism
from netcl.ops.random import Generator
from tests.oclgrind.cases import close, dev, oclgrind_only
from tests.ops.test_attention import reference

pytestmark = oclgrind_only


@pytest.mark.parametrize("variant,D", [("cpu", 12), ("cpu", 32), ("gpu", 12), ("gpu", 32), ("gpu", 64),
                                       ("gpu-atomic", 12), ("gpu-atomic", 64), ("gpu-two-pass", 12),
                                       ("gpu-row-shfl", 32)])
def test_attention_forward_backward(queue, monkeypatch, variant, D):
    """The GPU variant's float32 backward is the fused pass: deterministic by default (each work-group adds
    dq's shares into its own copy, plain load-add-store, and attention_dq_sum_gpu sums the copies; D = 32:
    one work-group per kv head walks both key tiles, the others one copy per key tile), gpu-atomic: dq by
    atomic adds (here the atomic_cmpxchg loop). D = 12 and 32: 2 query rows per item, D = 64: 4, read as
    float4s; gpu-two-pass: the dq and dk/dv passes, tiles prefetched into registers; gpu-row-shfl: the
    forward's row maxima by (emulated) warp shuffles."""
    if D == 64:  # 16 item columns (the H200's grids, smaller tiles: Oclgrind's local memory is 32 KiB)
        grids = {k: [(16, 8, 2, 2)] for k in ("forward", "dq", "dkdv", "fused")}
        monkeypatch.setattr(attn, "GPU_GRIDS", grids)
        assert attn.gpu_tiles(queue.device, "fused", D, np.float32)["TC"] == 16
    monkeypatch.setattr(determinism, "_deterministic", [variant != "gpu-atomic"])
    if variant == "gpu-atomic":
        variant = "gpu"
    elif variant == "gpu" and D == 32:
        monkeypatch.setattr(attn, "dq_splits", lambda device, b, h, keys, tile: 1)
    else:
        monkeypatch.setattr(attn, "dq_splits", lambda device, b, h, keys, tile: -(-keys // tile))
    if variant == "gpu-two-pass":  # and with register prefetch (PREFETCH=1)
        monkeypatch.setattr(attn, "GPU_BACKWARD", "two_pass")
        monkeypatch.setattr(attn, "GPU_PREFETCH", ("forward", "dkdv", "fused"))
        variant = "gpu"
    if variant == "gpu-row-shfl":
        monkeypatch.setattr(attn, "GPU_ROW_SHFL", True)
        variant = "gpu"
    rng = np.random.default_rng(3)
    B, HQ, HKV, SQ, SK, p = 2, 2, 1, 40, 37, 0.25   # several row and key tiles (and blocks) of each variant
    q = rng.standard_normal((B, HQ, SQ, D)).astype(np.float32)
    k = rng.standard_normal((B, HKV, SK, D)).astype(np.float32)
    v = rng.standard_normal((B, HKV, SK, D)).astype(np.float32)
    g = rng.standard_normal((B, HQ, SQ, D)).astype(np.float32)
    mask = rng.random((B, 1, SK, SQ)) < 0.8
    lengths = np.array([SK, 29], np.int32)
    old = attn.variant_override
    attn.variant_override = variant
    try:
        # q, k and v as the heads of (B, S, H, D) projections: the output and dk, dv in that memory order
        nq, nk, nv = (dev(queue, t.transpose(0, 2, 1, 3)).permute(0, 2, 1, 3) for t in (q, k, v))
        ng = dev(queue, g)
        nmask = dev(queue, mask).transpose(-2, -1)
        opts = dict(causal=True, mask=nmask, kv_len=dev(queue, lengths), dropout_p=p)
        draw = attn.DropoutDraw(Generator(1))
        out, lse = ops.flash_attention_forward(nq, nk, nv, dropout_draw=draw, **opts)
        grads = ops.flash_attention_backward(nq, nk, nv, out, lse, ng, dropout_draw=draw, **opts)
        keep = attn.attention_dropout_mask(queue, draw, (B, HQ, SQ, SK), p).to_host()
    finally:
        attn.variant_override = old
    want = reference(q, k, v, causal=True, mask=mask.transpose(0, 1, 3, 2), kv_len=lengths, keep=keep,
                     dropout_p=p, grad_out=g)
    close(out, want[0], 1e-4, 1e-4)
    for got, like in ((out, nq), (grads[1], nk), (grads[2], nv)):  # their memory order (axes of more than 1)
        assert [st for st, n in zip(got.strides, got.shape) if n > 1] == \
            [st for st, n in zip(like.strides, like.shape) if n > 1]
    for got, ref in zip(grads, want[2:], strict=True):
        close(got, ref, 1e-4, 1e-4)


@pytest.mark.parametrize("D,preload", [(12, 0), (32, 0), (12, 16), (32, 32)])
def test_attention_decode_split_keys(queue, monkeypatch, D, preload):
    """attention_gpu.cl's decode kernel (GQA rows of one kv head, keys split over work-groups) and its
    merge; `preload`: each split's keys held in local memory first (DECODE_PRELOAD_KEYS)."""
    monkeypatch.setattr(attn, "variant_override", "gpu")
    monkeypatch.setattr(attn, "DECODE_GROUPS_PER_CU", 1000)
    monkeypatch.setattr(attn, "DECODE_TILE_KEYS", (16,))
    monkeypatch.setattr(attn, "DECODE_PRELOAD_KEYS", preload)
    rng = np.random.default_rng(4)
    B, HQ, HKV, SQ, SK, p = 2, 4, 2, 2, 37, 0.25
    q = rng.standard_normal((B, HQ, SQ, D)).astype(np.float32)
    k = rng.standard_normal((B, HKV, SK, D)).astype(np.float32)
    v = rng.standard_normal((B, HKV, SK, D)).astype(np.float32)
    mask = rng.random((B, 1, SQ, SK)) < 0.8
    lengths = np.array([SK, 29], np.int32)
    opts = dict(causal=True, mask=dev(queue, mask), kv_len=dev(queue, lengths), dropout_p=p)
    draw = attn.DropoutDraw(Generator(2))
    out, lse = ops.flash_attention_forward(
        dev(queue, q), dev(queue, k), dev(queue, v), dropout_draw=draw, **opts
    )
    keep = attn.attention_dropout_mask(queue, draw, (B, HQ, SQ, SK), p).to_host()
    want = reference(q, k, v, causal=True, mask=mask, kv_len=lengths, keep=keep, dropout_p=p)
    close(out, want[0], 1e-4, 1e-4)
    close(lse, want[1], 1e-4, 1e-4)


@pytest.mark.parametrize("D,pairing,preload,split", [(12, "interleaved", 0, 1), (32, "half", 0, 1),
                                                     (32, "half", 16, 1), (32, "half", 16, 2)])
def test_attention_decode_rotates_and_writes_the_caches(queue, monkeypatch, D, pairing, preload, split):
    """attention_gpu.cl's decode kernel with ROPE_CACHE (ops.rope_cache_decode_attention): q rotated while
    staged, the split holding the new rows writes them into the caches and reads them back after its barrier
    (positions 15 and 16 straddle two 16-key splits, 35 and 36 sit in the last one); the same bits as
    rope_qkv_cache and then the kernel. split 2: a kv head's two q heads over two work-groups
    (DECODE_HEAD_SPLIT), one of which writes the caches."""
    monkeypatch.setattr(attn, "DECODE_HEAD_SPLIT", split)
    monkeypatch.setattr(attn, "variant_override", "gpu")
    monkeypatch.setattr(attn, "DECODE_GROUPS_PER_CU", 1000)
    monkeypatch.setattr(attn, "DECODE_TILE_KEYS", (16,))
    monkeypatch.setattr(attn, "DECODE_PRELOAD_KEYS", preload)
    rng = np.random.default_rng(5)
    B, HQ, HKV, S, cap = 2, 4, 2, 2, 37
    y = rng.standard_normal((B, S, HQ + 2 * HKV, D)).astype(np.float32)
    caches = [rng.standard_normal((B, HKV, cap, D)).astype(np.float32) for _ in range(2)]
    tables = ops.rope_tables(queue, cap, D)
    position = dev(queue, np.array([15, 35], np.int32))
    runs = []
    for fused in (True, False):
        monkeypatch.setattr(attn, "DECODE_ROPE_CACHE", fused)
        kc, vc = dev(queue, caches[0]), dev(queue, caches[1])
        out, lse = ops.rope_cache_decode_attention(dev(queue, y).permute(0, 2, 1, 3), HQ, *tables, kc, vc,
                                                   position, pairing)
        runs.append([t.to_host() for t in (out, lse, kc, vc)])
    for got, want in zip(*runs, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", ["tf32", "bf16-dsplit"])
def test_attention_matrix_unit_passes(queue, monkeypatch, kind):
    """The matrix-unit passes through their emulation, on small tiles (Oclgrind's 32 KiB of local memory):
    attention_tf32.cl's forward, dq and dk/dv (float32, D = 24: six 16-byte chunks a row, two warps, 16-key
    and 16-query tiles, both ring stages), and attention_mma.cl's bfloat16 passes at D = 96, whose dk/dv pass
    takes dk's and dv's columns in two slices (DSPLIT); GQA, a bool mask, kv_len, causal rows and dropout."""
    from netcl.core import dtypes
    monkeypatch.setattr(attn, "MMA_EMULATE", True)
    if kind == "tf32":
        monkeypatch.setattr(attn, "GPU_TF32X3", True)
        monkeypatch.setattr(attn, "TF32_TILES", {"WARPS": 2, "BN": 16, "BQ": 16})
        monkeypatch.setattr(attn, "variant_override", "gpu")
        dt, D, tol = np.dtype(np.float32), 24, 1e-4
    else:
        monkeypatch.setattr(attn, "MMA_TILES", {"BM": 32, "BN": 16, "BQ": 16, "PREFETCH": 1, "DKDV_RING": 1})
        dt, D, tol = np.dtype(dtypes.bfloat16), 96, 5e-2
    rng = np.random.default_rng(6)
    B, HQ, HKV, SQ, SK, p = 1, 2, 1, 37, 41, 0.25
    rows = ((B, HQ, SQ, D), (B, HKV, SK, D), (B, HKV, SK, D), (B, HQ, SQ, D))
    q, k, v, g = (rng.standard_normal(s).astype(dt) for s in rows)
    mask = rng.random((B, 1, SQ, SK)) < 0.8
    lengths = np.array([35], np.int32)
    nq, nk, nv, ng = (dev(queue, t) for t in (q, k, v, g))
    pr = attn._Problem("test", nq, nk, nv, False, None, None, 0.0, None)
    assert (pr.tf32_pass("forward") and pr.tf32_pass("dkdv")) if kind == "tf32" else pr.mma_backward(ng)
    opts = dict(causal=True, mask=dev(queue, mask), kv_len=dev(queue, lengths), dropout_p=p)
    draw = attn.DropoutDraw(Generator(7))
    out, lse = ops.flash_attention_forward(nq, nk, nv, dropout_draw=draw, **opts)
    grads = ops.flash_attention_backward(nq, nk, nv, out, lse, ng, dropout_draw=draw, **opts)
    keep = attn.attention_dropout_mask(queue, draw, (B, HQ, SQ, SK), p).to_host()
    want = reference(q, k, v, causal=True, mask=mask, kv_len=lengths, keep=keep, dropout_p=p, grad_out=g)
    close(out, want[0], tol, tol)
    for got, ref in zip(grads, want[2:], strict=True):
        close(got, ref, tol, tol * max(np.abs(ref).max(), 1.0))
