"""One-command sweep for the ResNet-18 (CIFAR) GPU gaps (issue 15): GEMM tile configurations on the exact
Winograd GEMM shapes of ResNet-18's stride-1 3x3 convolutions, on the square SGEMMs (with split-K), and
the batch-norm kernels' knobs, each beside cuBLAS / cuDNN / PyTorch on the same GPU.

    python3 bench/conv_sweep.py --gpu                          # batch 128, all sections, ~60-110 s cold
    python3 bench/conv_sweep.py --gpu --what wino --budget 50  # one section (the lead's round: wino, then
    python3 bench/conv_sweep.py --gpu --what sgemm,bn --budget 40   # these two, each under its own budget)
    .venv/bin/python bench/conv_sweep.py --batch 2 --sizes 32 --sgemm 200 --configs T0,T3   # CPU smoke

Sections (run in --what's order, default wino, sgemm, bn; a measurement starts only while the --budget of
seconds lasts, so one command always ends in time and prints what it measured):
- bn: batch_norm forward (training, relu) + backward on ResNet's four activation shapes; device time per
  kernel (netcl.profiling events), bytes moved (forward: x read twice, y written; backward: x and dy read
  twice, dx written) over time = GB/s and % of the copy bandwidth (torch's clone of the same tensor, read +
  write); beside torch's batch_norm forward + backward (cuDNN). Knobs: parts per channel (PARTS, x1 x2 x4
  the automatic count), the reduction work-group size (L128/256), "fused" (the last work-group of a
  channel merges the parts: no finalize launches, norm.FUSED_FINALIZE), U (float4 loads in flight
  per work-item, norm.UNROLL) and "chained" (each way one launch, the elementwise parts waiting for their
  channel's statistics: norm.CHAINED; "2 launches" rows are the separate passes).
- wino: the batched GEMMs of Winograd F(2x2,3x3): forward (and flipped backward-data, the same shape)
  U (16, K, C) @ V (16, C, tiles) and the weight gradient's (S, 16, K, tiles/S) @ (S, 16, tiles/S, C) over
  the S tile slices conv picks (and half / twice that), per candidate tile; torch.bmm of the same product
  (cuBLAS) beside it.
- sgemm: 512^3, 1000^3, 2048^3 per candidate tile x split-K slices, beside torch.mm (cuBLAS, TF32 off).
netcl times are device time per call (events: GEMM + split-K reduction), torch's are CUDA-event time of
back-to-back calls; medians of --repeat after warm-up. Each netcl result is checked against torch / NumPy
(max error relative to the result's scale; BAD when > 1e-3). Prints one table per section with the best
config per shape, and writes JSON (bench/results/conv_sweep.json or --out).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netcl import profiling  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.ops import conv as conv_ops  # noqa: E402
from netcl.ops import gemm as gemm_ops  # noqa: E402
from netcl.ops import norm as norm_ops  # noqa: E402
from netcl.ops.gemm import gemm  # noqa: E402

# Candidate tiles of the tiled kernel (float32), over DEFAULTS["tiled"]["float32"]. T0 = the default.
# Per work-item register tile = (BM/TY) x (BN/TX).
CONFIGS: dict[str, dict[str, int]] = {
    "T0": {},                                                                        # 128x128 BK8, 8x8 / item
    "T1": {"BM": 64, "BN": 128, "BK": 8, "TX": 16, "TY": 16, "BKE": 16},             # 4x8 / item, 256 items
    "T2": {"BM": 64, "BN": 128, "BK": 16, "TX": 16, "TY": 8, "BKE": 0},              # 8x8 / item, 128 items
    "T3": {"BM": 64, "BN": 64, "BK": 16, "TX": 8, "TY": 8, "BKE": 0},                # 8x8 / item, 64 items
    "T4": {"BM": 64, "BN": 64, "BK": 8, "TX": 16, "TY": 16, "BKE": 16},              # 4x4 / item, 256 items
    "T5": {"BM": 128, "BN": 64, "BK": 16, "TX": 8, "TY": 16, "BKE": 0},              # 8x8 / item, 128 items
    "T6": {"BM": 64, "BN": 256, "BK": 8, "TX": 32, "TY": 8, "BKE": 16},              # 8x8 / item, 256 items
}
STAGES = ((64, 32), (128, 16), (256, 8), (512, 4))  # ResNet-18 CIFAR: channels, spatial size


def device_ms(q, fn, repeat: int, warmup: int = 2) -> float:
    """Median device ms of one fn() call (sum of its kernels' event times), over `repeat` calls."""
    for _ in range(warmup):
        fn()
    q.finish()
    samples = []
    for _ in range(repeat):
        with profiling.Profile() as prof:
            fn()
            q.finish()
        samples.append(prof.device_seconds * 1e3)
    return statistics.median(samples)


def kernel_ms(q, fn, repeat: int, warmup: int = 2) -> dict[str, float]:
    """Device ms per call of each kernel fn() launches (mean over `repeat` calls)."""
    for _ in range(warmup):
        fn()
    q.finish()
    with profiling.Profile() as prof:
        for _ in range(repeat):
            fn()
        q.finish()
    return {r.name: r.total * 1e3 / repeat for r in prof.rows("kernel")}


class TorchTimer:
    def __init__(self):
        import torch  # noqa: PLC0415 (bench-only peer)

        self.torch = torch
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cudnn.benchmark = True
        self.dev = "cuda" if self.cuda else "cpu"

    def ms(self, fn, repeat: int, warmup: int = 3) -> float:
        torch = self.torch
        for _ in range(warmup):
            fn()
        if not self.cuda:
            samples = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(samples)
        torch.cuda.synchronize()
        samples = []
        for _ in range(repeat):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            samples.append(s.elapsed_time(e))
        return statistics.median(samples)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / (np.abs(want).max() + 1e-30))


# -- sections -------------------------------------------------------------------------------------------
def bn_section(args, dev, q, tt: TorchTimer, rows: list) -> None:
    torch = tt.torch
    rng = np.random.default_rng(0)
    for c, hw in STAGES:
        if hw not in args.sizes:
            continue
        shape = (args.batch, c, hw, hw)
        xh = rng.standard_normal(shape, dtype=np.float32)
        gh = rng.standard_normal(shape, dtype=np.float32)
        x, g = Tensor.from_host(q, xh), Tensor.from_host(q, gh)
        w = Tensor.from_host(q, rng.standard_normal(c).astype(np.float32))
        b = Tensor.from_host(q, rng.standard_normal(c).astype(np.float32))
        nbytes = xh.nbytes
        tx = torch.from_numpy(xh).to(tt.dev).requires_grad_(True)
        tg = torch.from_numpy(gh).to(tt.dev)
        tw = torch.from_numpy(w.to_host()).to(tt.dev).requires_grad_(True)
        tb = torch.from_numpy(b.to_host()).to(tt.dev).requires_grad_(True)

        def torch_bn():
            y = torch.relu(torch.nn.functional.batch_norm(tx, None, None, tw, tb, True))
            torch.autograd.grad(y, (tx, tw, tb), tg)

        copy_ms = tt.ms(lambda: tx.detach().clone(), args.repeat)
        copy_gbs = 2 * nbytes / copy_ms / 1e6
        torch_ms = tt.ms(torch_bn, args.repeat)
        auto_local = norm_ops._local_size(dev)
        fused_default, unroll_default = norm_ops.FUSED_FINALIZE, norm_ops.UNROLL
        chained_default = norm_ops.CHAINED
        vec = norm_ops._bn_vec(x, g)
        auto_parts = norm_ops._bn_parts(dev, "groups" if dev.capabilities.kind != "cpu" else "runs",
                                        args.batch, c, hw * hw, auto_local, vec)
        # reference (float64) of y and grad_x for the check
        xd = xh.astype(np.float64)
        mean = xd.mean(axis=(0, 2, 3), keepdims=True)
        inv = 1 / np.sqrt(xd.var(axis=(0, 2, 3), keepdims=True) + 1e-5)
        wd = w.to_host().astype(np.float64)[None, :, None, None]
        bd = b.to_host().astype(np.float64)[None, :, None, None]
        yd = (xd - mean) * inv * wd + bd
        gm = np.where(yd > 0, gh, 0.0)
        xhat = (xd - mean) * inv
        gxd = wd * inv * (gm - gm.mean(axis=(0, 2, 3), keepdims=True)
                          - xhat * (gm * xhat).mean(axis=(0, 2, 3), keepdims=True))
        gpu = dev.capabilities.kind != "cpu"
        knobs = [(256, 1, True, 4, False), (256, 1, True, 4, True), (256, 2, True, 4, True),
                 (256, 2, True, 4, False), (128, 2, True, 4, True), (256, 1, True, 1, True),
                 (256, 1, True, 2, True), (256, 1, False, 4, False)]
        if not gpu:
            knobs = [(None, 2, False, 1, False)]
        for local, mult, fused, unroll, chained in ([(None, None, None, None, None)]
                                                    + ([] if args.defaults_only else knobs)):
            if budget_over(args):
                return
            if mult is None:  # netcl's own settings
                label = (f"auto (L{auto_local}{' fused' if fused_default else ''} U{unroll_default}"
                         f"{' chained' if chained_default and gpu else ''})")
            else:
                norm_ops.local_size_override = local
                norm_ops.FUSED_FINALIZE = fused
                norm_ops.UNROLL = unroll
                norm_ops.CHAINED = chained
                norm_ops.PARTS = None if mult == 1 and local == auto_local else max(1, auto_parts * mult)
                label = (f"L{local} parts={'auto' if norm_ops.PARTS is None else norm_ops.PARTS}"
                         f"{' fused' if fused else ''} U{unroll}{' chained' if chained else ' 2 launches'}")

            def run():
                y, m, s = norm_ops.batch_norm(x, w, b, None, None, True, activation="relu")
                gx, _, _ = norm_ops.batch_norm_backward(g, x, w, m, s, True, bias=b, activation="relu")
                run.out = (y, gx)

            try:
                per_kernel = kernel_ms(q, run, args.repeat)
                err = max(rel_err(run.out[0].to_host(), np.maximum(yd, 0)),
                          rel_err(run.out[1].to_host(), gxd))
            except Exception as e:  # a work-group the kernel cannot take (NVIDIA: at most 256 here)
                rows.append(dict(section="bn", shape=f"{args.batch}x{c}x{hw}x{hw}", config=label,
                                 error=str(e)[:200]))
                print_row(rows[-1])
                continue
            finally:
                norm_ops.local_size_override = None
                norm_ops.PARTS = None
                norm_ops.FUSED_FINALIZE = fused_default
                norm_ops.UNROLL = unroll_default
                norm_ops.CHAINED = chained_default
            total = sum(per_kernel.values())
            moved = 8 * nbytes  # fwd: 2 reads + 1 write, bwd: 4 reads + 1 write
            rows.append(dict(section="bn", shape=f"{args.batch}x{c}x{hw}x{hw}", config=label,
                             netcl_ms=total, peer_ms=torch_ms, ratio=torch_ms / total,
                             gbs=moved / total / 1e6, pct_copy=100 * moved / total / 1e6 / copy_gbs,
                             copy_gbs=copy_gbs, err=err,
                             kernels={k: round(v * 1e3, 2) for k, v in per_kernel.items()}))
            print_row(rows[-1])


def wino_shapes(batch: int, sizes) -> list[tuple[str, int, int, int]]:
    out = []
    for c, hw in STAGES:
        if hw in sizes:
            out.append((f"C{c} {hw}x{hw}", c, c, batch * (hw // 2) ** 2))
    return out


def splits_for(dev, c: int, k: int, pt: int, bm: int, bn: int) -> int:
    """conv.winograd._winograd_splits's rule with this tile's block size."""
    if dev.capabilities.kind == "cpu":
        return 1
    blocks = 16 * math.ceil(k / bm) * math.ceil(c / bn)
    target = 2 * dev.capabilities.compute_units
    best = 1
    for s in (2, 4, 8, 16, 32, 64):
        if blocks * best >= target or pt % s or pt // s < 512:
            break
        best = s
    return best


def wino_section(args, dev, q, tt: TorchTimer, rows: list) -> None:
    torch = tt.torch
    rng = np.random.default_rng(1)
    defaults = gemm_ops.tuned_params(dev, "tiled", np.float32)
    for name, c, k, pt in wino_shapes(args.batch, args.sizes):
        uh = rng.standard_normal((16, k, c), dtype=np.float32)
        vh = rng.standard_normal((16, c, pt), dtype=np.float32)
        zh = rng.standard_normal((16, k, pt), dtype=np.float32)
        u, v, z = Tensor.from_host(q, uh), Tensor.from_host(q, vh), Tensor.from_host(q, zh)
        tu, tv, tz = (torch.from_numpy(a).to(tt.dev) for a in (uh, vh, zh))
        flop = 2.0 * 16 * k * c * pt
        # forward / flipped backward-data: (16, K, C) @ (16, C, pt)
        cublas_f = tt.ms(lambda: torch.bmm(tu, tv), args.repeat)
        want_f = torch.bmm(tu, tv)[:, :, :: max(1, pt // 64)].double().cpu().numpy()
        # weight gradient: sum over tiles of Z (16, K, pt) @ V^T (16, pt, C)
        cublas_w = tt.ms(lambda: torch.bmm(tz, tv.transpose(1, 2)), args.repeat)
        want_w = torch.bmm(tz.double(), tv.double().transpose(1, 2)).cpu().numpy()
        geometry = conv_ops.ConvParams((args.batch, c, 4, 4), (k, c, 3, 3), 1, 1, 1, 1)
        default_s = conv_ops.winograd._winograd_splits(dev, geometry, pt)
        for cname in ["auto"] + ([] if args.defaults_only else args.configs):
            cfg = CONFIGS.get(cname)
            if budget_over(args):
                return
            tile = {**defaults, **(cfg or {})}

            def fwd(cfg=cfg):  # auto: exactly what conv's Winograd runs (matmul: shape-class tile)
                return gemm(u, v) if cfg is None else gemm(u, v, variant="tiled", params=cfg)

            try:
                ms = device_ms(q, fwd, args.repeat)
                got = fwd().to_host()[:, :, :: max(1, pt // 64)]
                err = rel_err(got, want_f)
            except Exception as e:  # a config the device rejects: say so, go on
                rows.append(dict(section="wino_fwd", shape=name, config=cname, error=str(e)[:200]))
                print_row(rows[-1])
                continue
            rows.append(dict(section="wino_fwd", shape=name, config=cname, mnk=(k, pt, c), netcl_ms=ms,
                             peer_ms=cublas_f, ratio=cublas_f / ms, tflops=flop / ms / 1e9, err=err))
            print_row(rows[-1])
            s_t = splits_for(dev, c, k, pt, tile["BM"], tile["BN"])
            for s in [default_s] if cfg is None else sorted({max(1, s_t // 2), s_t, s_t * 2, default_s}):
                if pt % s or budget_over(args):
                    continue
                sl = pt // s
                zs = z._view((s, 16, k, sl), (sl, k * pt, pt, 1), z.offset)
                vs = v._view((s, 16, sl, c), (sl, c * pt, 1, pt), v.offset)

                def wgrad(zs=zs, vs=vs, cfg=cfg):  # (S, 16, K, C): the filter transform sums the S slices
                    return gemm(zs, vs) if cfg is None else gemm(zs, vs, variant="tiled", params=cfg)

                try:
                    ms = device_ms(q, wgrad, args.repeat)
                    got = wgrad().to_host().astype(np.float64).sum(axis=0)
                    err = rel_err(got, want_w)
                except Exception as e:
                    rows.append(dict(section="wino_wgrad", shape=name, config=f"{cname} S={s}",
                                     error=str(e)[:200]))
                    print_row(rows[-1])
                    continue
                rows.append(dict(section="wino_wgrad", shape=name, config=f"{cname} S={s}", mnk=(k, c, sl),
                                 splits=s, netcl_ms=ms, peer_ms=cublas_w, ratio=cublas_w / ms,
                                 tflops=flop / ms / 1e9, err=err, conv_default=s == default_s))
                print_row(rows[-1])


def layer_section(args, dev, q, tt: TorchTimer, rows: list) -> None:
    """ResNet-18's stride-1 3x3 convolutions (C -> C, pad 1, no bias) per stage: forward, grad_input and
    grad_weight as netcl runs them (its automatic algorithm: Winograd through the GEMM on these shapes),
    with the tile transforms launched as the driver's grid (flat 0) or 1-D work-groups (flat 128 / 256:
    conv.winograd.WINOGRAD_FLAT); beside cuDNN's three passes."""
    torch = tt.torch
    rng = np.random.default_rng(3)
    flat_default = conv_ops.winograd.WINOGRAD_FLAT
    flats = [flat_default] + ([] if args.defaults_only or dev.capabilities.kind == "cpu"
                              else [f for f in (0, 256, 128) if f != flat_default])
    for c, hw in STAGES:
        if hw not in args.sizes:
            continue
        xs, ws = (args.batch, c, hw, hw), (c, c, 3, 3)
        xh = rng.standard_normal(xs, dtype=np.float32)
        wh = (rng.standard_normal(ws, dtype=np.float32) / np.sqrt(9 * c)).astype(np.float32)
        gh = rng.standard_normal(xs, dtype=np.float32)
        x, w, g = Tensor.from_host(q, xh), Tensor.from_host(q, wh), Tensor.from_host(q, gh)
        tx, tw, tg = (torch.from_numpy(a).to(tt.dev) for a in (xh, wh, gh))
        F = torch.nn.functional
        peers = {
            "fwd": tt.ms(lambda: F.conv2d(tx, tw, padding=1), args.repeat),
            "grad_input": tt.ms(lambda: torch.nn.grad.conv2d_input(xs, tw, tg, padding=1), args.repeat),
            "grad_weight": tt.ms(lambda: torch.nn.grad.conv2d_weight(tx, ws, tg, padding=1), args.repeat),
        }
        want = {
            "fwd": F.conv2d(tx, tw, padding=1).cpu().numpy(),
            "grad_input": torch.nn.grad.conv2d_input(xs, tw, tg, padding=1).cpu().numpy(),
            "grad_weight": torch.nn.grad.conv2d_weight(tx, ws, tg, padding=1).cpu().numpy(),
        }
        passes = {
            "fwd": lambda: conv_ops.conv2d(x, w, None, 1, 1),
            "grad_input": lambda: conv_ops.conv2d_backward_input(g, w, xs, 1, 1),
            "grad_weight": lambda: conv_ops.conv2d_backward_weight(x, g, ws, 1, 1),
        }
        flop = 2.0 * args.batch * c * c * 9 * hw * hw
        for flat in flats:
            for name, fn in passes.items():
                if budget_over(args):
                    conv_ops.winograd.WINOGRAD_FLAT = flat_default
                    return
                conv_ops.winograd.WINOGRAD_FLAT = flat
                try:
                    per_kernel = kernel_ms(q, fn, args.repeat)
                    err = rel_err(fn().to_host(), want[name].astype(np.float64))
                finally:
                    conv_ops.winograd.WINOGRAD_FLAT = flat_default
                total = sum(per_kernel.values())
                label = f"{'auto' if flat == flat_default else 'flat'} flat={flat} {name}"
                rows.append(dict(section="layer", shape=f"C{c} {hw}x{hw}", config=label, netcl_ms=total,
                                 peer_ms=peers[name], ratio=peers[name] / total, tflops=flop / total / 1e9,
                                 err=err, kernels={k: round(v * 1e3, 1) for k, v in per_kernel.items()}))
                print_row(rows[-1])
                print("           " + ", ".join(f"{k} {v:.0f}us" for k, v in rows[-1]["kernels"].items()))


def sgemm_section(args, dev, q, tt: TorchTimer, rows: list) -> None:
    torch = tt.torch
    rng = np.random.default_rng(2)
    for size in args.sgemm:
        ah = rng.standard_normal((size, size), dtype=np.float32)
        bh = rng.standard_normal((size, size), dtype=np.float32)
        a, b = Tensor.from_host(q, ah), Tensor.from_host(q, bh)
        ta, tb = torch.from_numpy(ah).to(tt.dev), torch.from_numpy(bh).to(tt.dev)
        cublas = tt.ms(lambda: ta @ tb, args.repeat)
        rows_idx = np.linspace(0, size - 1, 8).astype(int)
        want = ah[rows_idx].astype(np.float64) @ bh.astype(np.float64)
        flop = 2.0 * size ** 3
        swept = [] if args.defaults_only else args.configs
        runs = [("auto", None, None)] + [(c, CONFIGS[c], s) for c in swept for s in (1, 2, 4, 8)]
        for cname, cfg, s in runs:
            if budget_over(args):
                return
            if s is not None and (size % s or size // s < 64):
                continue
            label = cname if s is None else f"{cname} S={s}"

            def run(cfg=cfg, s=s):
                if cfg is None:
                    return gemm(a, b)
                return gemm(a, b, variant="tiled", params=cfg, splits=s)

            try:
                ms = device_ms(q, run, args.repeat)
                err = rel_err(run().to_host()[rows_idx], want)
            except Exception as e:
                rows.append(dict(section="sgemm", shape=f"{size}^3", config=label, error=str(e)[:200]))
                print_row(rows[-1])
                continue
            rows.append(dict(section="sgemm", shape=f"{size}^3", config=label, netcl_ms=ms, peer_ms=cublas,
                             ratio=cublas / ms, tflops=flop / ms / 1e9, err=err))
            print_row(rows[-1])


# -- output ---------------------------------------------------------------------------------------------
_T0 = [0.0]


def budget_over(args) -> bool:
    return time.perf_counter() - _T0[0] > args.budget


def print_row(r: dict) -> None:
    t = time.perf_counter() - _T0[0]
    if "error" in r:
        print(f"[{t:5.1f}s] {r['section']:10s} {r['shape']:12s} {r['config']:26s} ERROR {r['error']}",
              flush=True)
        return
    extra = (f"{r['gbs']:7.0f} GB/s {r['pct_copy']:5.1f}% copy" if r["section"] == "bn"
             else f"{r['tflops']:6.2f} TFLOP/s")
    bad = "  BAD" if r["err"] > 1e-3 else ""
    print(f"[{t:5.1f}s] {r['section']:10s} {r['shape']:12s} {r['config']:26s} netcl {r['netcl_ms']:8.4f} ms  "
          f"peer {r['peer_ms']:8.4f} ms  {r['ratio']:5.2f}x  {extra}  err {r['err']:.1e}{bad}", flush=True)


def summary(rows: list) -> None:
    print("\n== best per (section, shape): netcl / peer throughput; auto = netcl's own choice")
    keyed: dict[tuple, list] = {}
    for r in rows:
        if "error" not in r and r["err"] <= 1e-3:
            what = r["config"].split()[-1] if r["section"] == "layer" else ""
            keyed.setdefault((r["section"] + (" " + what if what else ""), r["shape"]), []).append(r)
    print(f"{'section':18s} {'shape':12s} {'best config':26s} {'ms':>8s} {'peer ms':>8s} {'ratio':>6s} "
          f"{'default ms':>10s} {'default ratio':>13s}")
    for (sec, shape), rs in keyed.items():
        best = min(rs, key=lambda r: r["netcl_ms"])
        base = [r for r in rs if r["config"].startswith("auto")]
        d = base[0] if base else None
        print(f"{sec:18s} {shape:12s} {best['config']:26s} {best['netcl_ms']:8.4f} {best['peer_ms']:8.4f} "
              f"{best['ratio']:6.2f} {d['netcl_ms'] if d else float('nan'):10.4f} "
              f"{d['ratio'] if d else float('nan'):13.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--device", default=None)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--what", default="wino,sgemm,bn")
    ap.add_argument("--sizes", default="32,16,8,4", help="ResNet stage spatial sizes to run (32,16,8,4)")
    ap.add_argument("--sgemm", default="512,1000,2048")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--defaults-only", action="store_true", help="only netcl's own choices (the auto rows)")
    ap.add_argument("--budget", type=float, default=105.0, help="seconds: no new measurement after this")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "conv_sweep.json"))
    args = ap.parse_args()
    _T0[0] = time.perf_counter()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.sgemm = [int(s) for s in args.sgemm.split(",") if s]
    args.configs = [c for c in args.configs.split(",") if c]
    for c in args.configs:
        if c not in CONFIGS:
            ap.error(f"unknown config {c!r}: one of {', '.join(CONFIGS)}")
    dev = manager.get(args.device or ("gpu" if args.gpu else "auto"))
    q = dev.queue
    tt = TorchTimer()
    print(f"netcl on {dev.describe()}; peer torch on {tt.dev}"
          f"{' (' + tt.torch.cuda.get_device_name(0) + ', TF32 off, cudnn.benchmark)' if tt.cuda else ''}; "
          f"batch {args.batch}", flush=True)
    for name, cfg in CONFIGS.items():
        if name in args.configs:
            print(f"  {name}: {cfg or 'default'}")
    rows: list = []
    sections = {"bn": bn_section, "wino": wino_section, "layer": layer_section, "sgemm": sgemm_section}
    # one outer profile keeps the queue recording event times for the whole run (each measurement's own
    # profile would otherwise switch the OpenCL queue on and off)
    with profiling.Profile(max_events=1000, name="sweep"):
        for what in args.what.split(","):
            if not budget_over(args):
                sections[what](args, dev, q, tt, rows)
    summary(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": dev.describe(), "batch": args.batch, "configs": CONFIGS,
                                          "rows": rows, "seconds": time.perf_counter() - _T0[0]}, indent=1))
    print(f"wrote {args.out} ({time.perf_counter() - _T0[0]:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
