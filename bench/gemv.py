"""Matrix-vector products (GEMMs of one to three rows: a decode step's x @ W): each GEMM kernel that takes
them
beside netcl's automatic choice, on the default device, with W both as a linear layer's transposed weight
(k-contiguous) and row-major. Bytes = W once (the compulsory traffic); median of 30 calls after 3 warm-ups.

    python bench/gemv.py [--out bench/results/gemv.json]

--sweep: the decode GEMV kernel (gemm_gemv.cl) alone on a TinyLlama-1.1B decode step's shapes (bfloat16 and
int8 weights, M = 1 and 8 rows of bfloat16 x), under each of a list of tile knob sets (JSON, over the device's
defaults; default: SWEEP_KNOBS), timed by OpenCL events (netcl.profiling: device time per call, median of
three spans of --calls calls), as GB/s of weight bytes beside the buffer copy rate measured in the same run.
Each configuration's first result is checked against float64 NumPy on 64 of its columns.

    python3 bench/gemv.py --gpu --sweep --out bench/results/gemv_sweep_gpu.json
    python3 bench/gemv.py --gpu --sweep '[{"GEMV_WG": 32, "GEMV_ROWS": 8}, {"GEMV_WG": 16, "GEMV_UNROLL": 8}]'
    python bench/gemv.py --sweep --small     # CPU: every shape / 16, a smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from netcl import profiling
from netcl.core.backend import enqueue_copy
from netcl.core.device import manager
from netcl.core.tensor import Tensor
from netcl.ops import gemm as mm
from netcl.ops.gemm.launch import launch
from netcl.ops.gemm.problem import _Problem
from netcl.ops.gemm.variants import default_params

SHAPES = [(1, 512, 1376, "W^T"), (1, 1376, 512, "W^T"), (1, 512, 4096, "W^T"), (1, 512, 1376, "row-major"),
          (2, 64, 4096, "row-major"), (3, 4096, 64, "row-major"), (1, 4096, 4096, "row-major")]


def median_seconds(fn, queue, repeat: int = 30) -> float:
    for _ in range(3):
        fn()
    queue.finish()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        queue.finish()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# a TinyLlama-1.1B decode step's GEMVs: (name, K, N outputs, GLU: W holds 2N rows, gate over up)
TINYLLAMA = [("qkv", 2048, 2560, False), ("o", 2048, 2048, False), ("gate_up", 2048, 5632, True),
             ("down", 5632, 2048, False), ("lm_head", 2048, 32000, False)]
# the knob sets --sweep tries by default: the defaults, the old kernel's tile (64 items a column, one load in
# flight, A from global), then one knob moved at a time
SWEEP_KNOBS = [
    {},
    {"GEMV_WG": 64, "GEMV_ROWS": 4, "GEMV_UNROLL": 1, "GEMV_STAGE": 0},
    {"GEMV_STAGE": 0},
    {"GEMV_UNROLL": 2},
    {"GEMV_UNROLL": 8},
    {"GEMV_WG": 16, "GEMV_ROWS": 16},
    {"GEMV_WG": 16, "GEMV_ROWS": 8, "GEMV_UNROLL": 8},
    {"GEMV_ROWS": 4},
    {"GEMV_COLS": 2},
]
BF16 = np.dtype(ml_dtypes.bfloat16)


def device_seconds_per_call(fn, queue, calls: int, spans: int = 3) -> float:
    """Median over `spans` of the device time of `calls` calls of fn (OpenCL events), per call."""
    fn()
    queue.finish()
    per_call = []
    for _ in range(spans):
        with profiling.profile() as prof:
            for _ in range(calls):
                fn()
            queue.finish()
        per_call.append(prof.device_seconds / calls)
    return statistics.median(per_call)


def copy_bandwidth(queue, nbytes: int) -> float:
    """The device's buffer-to-buffer copy rate, 2 x bytes / device time of one copy (median of 3 x 5)."""
    src = Tensor.empty(queue, (nbytes // 4,), np.float32)
    dst = Tensor.empty(queue, (nbytes // 4,), np.float32)
    def copy() -> None:
        enqueue_copy(queue, dst.buffer, src.buffer, byte_count=nbytes)

    sec = device_seconds_per_call(copy, queue, 5)
    return 2 * nbytes / sec


def sweep(dev, knob_sets: list[dict], small: bool, calls: int) -> dict:
    """Time gemm_gemv on TINYLLAMA's shapes under each knob set; print a table, return the rows."""
    q = dev.queue
    rng = np.random.default_rng(0)
    scale = 16 if small else 1
    shapes = [(name, k // scale, n // scale, glu) for name, k, n, glu in TINYLLAMA]
    most = max((2 if glu else 1) * n * k for _, k, n, glu in shapes)
    # one random weight buffer per storage dtype; each shape takes a prefix of it (bandwidth, not values)
    flat = {"bfloat16": rng.standard_normal(most, dtype=np.float32).astype(BF16),
            "int8": rng.integers(1, 256, most, dtype=np.uint8)}
    copy_bw = copy_bandwidth(q, (64 << 20) if not small else (4 << 20))
    defaults = default_params("gemv", BF16, dev)
    print(f"device: {dev.device_name}; copy {copy_bw / 1e9:,.0f} GB/s (2 x bytes / event time); gemv "
          f"defaults {json.dumps(defaults)}")
    print("per shape: device time a call and weight bytes/s over copy; all: GB/s and share over the five")
    heads = " ".join(f"{name:>15}" for name, *_ in shapes)
    print(f"{'WG ROWS COLS UNROLL STAGE':>25} {'w':>8} {'M':>2} {heads} {'all':>12}")
    rows = []
    weights: dict[tuple, tuple] = {}
    for knobs in knob_sets:
        params = {**defaults, **knobs}
        for wdt in ("bfloat16", "int8"):
            for m in (1, 8):
                x_host = rng.standard_normal((m, max(k for _, k, _, _ in shapes))).astype(BF16)
                cells, total_bytes, total_sec = [], 0.0, 0.0
                for name, k, n, glu in shapes:
                    key = (wdt, k, n, glu)
                    if key not in weights:
                        w_host = flat[wdt][: (2 if glu else 1) * n * k].reshape(-1, k)
                        w = Tensor.from_host(q, w_host)
                        s_host = (rng.random(w_host.shape[0], dtype=np.float32) / 64 + 1e-3
                                  if wdt == "int8" else None)
                        s = Tensor.from_host(q, s_host) if s_host is not None else None
                        weights[key] = (w_host, w, s_host, s)
                    w_host, w, s_host, s = weights[key]
                    x = Tensor.from_host(q, np.ascontiguousarray(x_host[:, :k]))
                    out = Tensor.empty(q, (m, n), BF16)
                    prob = _Problem(a=x, b=w.transpose(0, 1), out=out, bias=None, residual=None,
                                    activation=None, alpha=1.0, m=m, n=n, k=k, batch=(), squeeze=())

                    def call(prob=prob, s=s, glu=glu):
                        launch(prob, "gemv", params=params, scales=s, glu=glu)

                    call()
                    check_columns(out.to_host(), x_host[:, :k], w_host, s_host, glu, (knobs, wdt, m, name))
                    sec = device_seconds_per_call(call, q, calls)
                    nbytes = w_host.nbytes + (s_host.nbytes if s_host is not None else 0)
                    total_bytes += nbytes
                    total_sec += sec
                    cells.append(f"{sec * 1e6:6.1f}us {nbytes / sec / copy_bw:4.0%}")
                    rows.append({"knobs": knobs, "params": params, "weights": wdt, "m": m, "shape": name,
                                 "k": k, "n": n, "glu": glu, "seconds": sec, "weight_bytes": nbytes,
                                 "gb_s": nbytes / sec / 1e9, "of_copy": nbytes / sec / copy_bw})
                label = " ".join(str(params.get(f"GEMV_{key}", "-")) for key in
                                 ("WG", "ROWS", "COLS", "UNROLL", "STAGE"))
                print(f"{label:>25} {wdt:>8} {m:>2} " + " ".join(f"{c:>15}" for c in cells)
                      + f" {total_bytes / total_sec / 1e9:7,.0f} {total_bytes / total_sec / copy_bw:4.0%}")
    return {"device": dev.device_name, "copy_bandwidth": copy_bw, "defaults": defaults, "small": small,
            "rows": rows}


def check_columns(got, x, w, scales, glu, what) -> None:
    """64 columns of a GEMV result (the last among them) against float64 NumPy."""
    n = got.shape[1]
    cols = np.unique(np.r_[np.random.default_rng(1).integers(0, n, 63), n - 1])
    xd = x.astype(np.float64)

    def rows_of(c):
        wd = w[c].astype(np.float64)
        if scales is not None:
            wd = (wd - 128) * scales[c, None]
        return xd @ wd.T

    if glu:
        gate, up = rows_of(cols), rows_of(cols + n)
        want = gate / (1 + np.exp(-gate)) * up
    else:
        want = rows_of(cols)
    err = np.abs(got[:, cols].astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)
    if not err < 2e-2:
        raise SystemExit(f"gemv result off by {err:.3g} (relative to the largest) for {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON file (default bench/results/gemv[_sweep].json)")
    ap.add_argument("--gpu", action="store_true", help="the first GPU instead of the default device")
    ap.add_argument("--sweep", nargs="?", const="default", default=None, metavar="JSON",
                    help="time gemm_gemv on TinyLlama's shapes under these knob sets (default SWEEP_KNOBS)")
    ap.add_argument("--small", action="store_true", help="--sweep on every shape / 16 (a CPU smoke test)")
    ap.add_argument("--calls", type=int, default=20, help="--sweep: calls per timed span")
    args = ap.parse_args()
    dev = manager.get("gpu") if args.gpu else manager.default()
    if args.sweep is not None:
        knob_sets = SWEEP_KNOBS if args.sweep == "default" else json.loads(args.sweep)
        result = sweep(dev, knob_sets, args.small, args.calls)
        out = Path(args.out or "bench/results/gemv_sweep.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print("wrote", out)
        return
    args.out = args.out or "bench/results/gemv.json"
    q = dev.queue
    variants = ("direct", "cpu") if dev.capabilities.kind == "cpu" else ("direct", "dot")
    print(f"device: {dev.device_name}; time per call (GB/s of W)")
    print(f"{'M x K x N':>16} {'W':>10} " + " ".join(f"{v:>18}" for v in (*variants, "auto")))
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n, layout in SHAPES:
        x = Tensor.from_host(q, rng.standard_normal((m, k)).astype(np.float32))
        if layout == "W^T":
            w = Tensor.from_host(q, rng.standard_normal((n, k)).astype(np.float32)).transpose(0, 1)
        else:
            w = Tensor.from_host(q, rng.standard_normal((k, n)).astype(np.float32))
        ref = x.to_host().astype(np.float64) @ w.to_host().astype(np.float64)
        row = {"m": m, "k": k, "n": n, "w": layout}
        cells = []
        for variant in (*variants, None):
            got = mm.gemm(x, w, variant=variant).to_host()
            assert np.abs(got - ref).max() <= 1e-4 * np.sqrt(k) * max(1.0, np.abs(ref).max()), (
                variant,
                m,
                k,
                n,
            )
            sec = median_seconds(lambda v=variant: mm.gemm(x, w, variant=v), q)
            row[variant or "auto"] = sec
            cells.append(f"{sec * 1e6:9.0f} us {k * n * 4 / sec / 1e9:5.1f}")
        rows.append(row)
        print(f"{m:>4} x {k:>4} x {n:>4} {layout:>10} " + " ".join(f"{c:>18}" for c in cells))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": dev.device_name, "rows": rows}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
