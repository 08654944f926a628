"""GEMM on matrix units (issue 18; netcl/kernels/gemm_mma.cl) on an NVIDIA GPU of compute capability 8.0+.

Each tile/loader configuration runs through netcl's API (what ships): first checked on odd shapes and
layouts against float64 NumPy (TF32-rounded inputs for float32), then timed at 4096^3 and 8192^3 (median
of 5 after 2 warm-ups). Then netcl's automatic choice under both matmul precisions, and PyTorch's cuBLAS
float16, bfloat16, TF32 and FP32 on the same GPU in the same run. Limits: H200 dense float16/bfloat16
~990 TFLOP/s (wgmma; mma.sync reaches less), TF32 ~495, FP32 (no matrix units) ~67.

    python3 bench/gemm_mma.py [--out bench/results/gemm_mma.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import netcl
from netcl.core import dtypes
from netcl.core.device import manager
from netcl.core.tensor import Tensor
from netcl.ops import gemm as mm

BF16 = dtypes.bfloat16
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
HALF = {"PAD": 8, "PADB": 8, "EMULATE": 0}
CONFIGS = [  # (dtype, tile and loader); the first of each dtype is the kernel before cp.async/ldmatrix
    (F16, dict(BM=128, BN=256, BK=32, WM=64, WN=64, ASYNC=0, LDMATRIX=0)),
    (F16, dict(BM=128, BN=256, BK=32, WM=64, WN=64, ASYNC=0, LDMATRIX=1)),
    (F16, dict(BM=128, BN=128, BK=32, WM=64, WN=64, ASYNC=1, STAGES=2, LDMATRIX=1)),
    (F16, dict(BM=128, BN=128, BK=32, WM=64, WN=32, ASYNC=1, STAGES=2, LDMATRIX=1)),
    (F16, dict(BM=128, BN=128, BK=32, WM=32, WN=64, ASYNC=1, STAGES=2, LDMATRIX=1)),
    (F16, dict(BM=128, BN=128, BK=16, WM=64, WN=64, ASYNC=1, STAGES=4, LDMATRIX=1)),
    (F16, dict(BM=128, BN=128, BK=32, WM=64, WN=32, ASYNC=1, STAGES=2, LDMATRIX=0)),
    (BF16, dict(BM=128, BN=256, BK=32, WM=64, WN=64, ASYNC=0, LDMATRIX=0)),
    (BF16, dict(BM=128, BN=128, BK=32, WM=32, WN=64, ASYNC=1, STAGES=2, LDMATRIX=1)),
    (BF16, dict(BM=128, BN=128, BK=16, WM=64, WN=32, ASYNC=1, STAGES=4, LDMATRIX=1)),
    (F32, dict(BM=128, BN=256, BK=16, WM=64, WN=64, PAD=4, ASYNC=0, LDMATRIX=0)),
    (F32, dict(BM=128, BN=128, BK=16, WM=64, WN=64, PAD=4, ASYNC=1, STAGES=2, LDMATRIX=0)),
    (F32, dict(BM=128, BN=128, BK=8, WM=64, WN=32, PAD=4, ASYNC=1, STAGES=4, LDMATRIX=0)),
]


def tf32(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def local_bytes(p: dict, dt: np.dtype) -> int:
    a = p["BM"] * (p["BK"] + p["PAD"])
    b = max(p["BK"] * (p["BN"] + p["PADB"]), p["BN"] * (p["BK"] + p["PAD"]))
    return (a + b) * np.dtype(dt).itemsize * (p.get("STAGES", 2) if p.get("ASYNC") else 1)


def median_seconds(fn, queue, repeat: int = 5) -> float:
    for _ in range(2):
        fn()
    queue.finish()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        queue.finish()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def operand(queue, x: np.ndarray, transposed: bool) -> Tensor:
    return Tensor.from_host(queue, np.ascontiguousarray(x.T)).T if transposed else Tensor.from_host(queue, x)


def check(queue, rng, dt, params) -> float:
    worst = 0.0
    for m, n, k, layout in (
        (37, 29, 45, "nn"),
        (130, 270, 70, "nn"),
        (256, 256, 256, "nt"),
        (1000, 999, 517, "nn"),
        (64, 96, 200, "tn"),
    ):
        a, b = rng.standard_normal((m, k)).astype(dt), rng.standard_normal((k, n)).astype(dt)
        got = mm.gemm(operand(queue, a, layout[0] == "t"), operand(queue, b, layout[1] == "t"), variant="mma",
                      params=params).to_host().astype(np.float64)
        ref = tf32(a) @ tf32(b) if dt == F32 else a.astype(np.float64) @ b.astype(np.float64)
        worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/gemm_mma.json")
    ap.add_argument(
        "--gpu", action="store_true", help="accepted for bench/gpu_run.sh (this bench is GPU-only)"
    )
    args = ap.parse_args()
    import torch

    dev = manager.get("gpu")
    q = dev.queue
    print(dev.device_name, "compute capability", dev.capabilities.nv_compute_capability, "local memory",
          dev.capabilities.local_mem)
    rng = np.random.default_rng(0)
    out: dict[str, object] = {}
    netcl.set_matmul_precision("high")
    for dt, tile in CONFIGS:
        params = {**HALF, **tile}
        name = f"{dt.name} " + " ".join(f"{k}{v}" for k, v in tile.items())
        if local_bytes(params, dt) > dev.capabilities.local_mem:
            print(f"{name}: skipped, {local_bytes(params, dt)} bytes of local memory")
            continue
        try:
            row: dict[str, object] = {"max_rel_err": check(q, rng, dt, params)}
            for s in (4096, 8192):
                a = Tensor.from_host(q, rng.standard_normal((s, s)).astype(dt))
                b = Tensor.from_host(q, rng.standard_normal((s, s)).astype(dt))
                sec = median_seconds(lambda a=a, b=b: mm.gemm(a, b, variant="mma", params=params), q)
                row[f"tflops_{s}"] = round(2 * s**3 / sec / 1e12, 1)
        except Exception as exc:  # a configuration this device cannot build or run is reported, not fatal
            row = {"failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(name, row, flush=True)
        out[name] = row
    for dt in (F16, BF16, F32):
        s = 4096
        a = Tensor.from_host(q, rng.standard_normal((s, s)).astype(dt))
        b = Tensor.from_host(q, rng.standard_normal((s, s)).astype(dt))
        for precision in ("highest", "high"):
            netcl.set_matmul_precision(precision)
            v = round(2 * s**3 / median_seconds(lambda a=a, b=b: mm.matmul(a, b), q) / 1e12, 1)
            out[f"auto {dt.name} {precision}"] = v
            print(f"netcl matmul (automatic choice) {dt.name} precision {precision}: {v} TFLOP/s at {s}^3")
    netcl.set_matmul_precision("highest")
    for name, tdt, allow_tf32 in (("float16", torch.float16, False), ("bfloat16", torch.bfloat16, False),
                                  ("tf32", torch.float32, True), ("float32", torch.float32, False)):
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        for s in (4096, 8192):
            a = torch.randn(s, s, device="cuda", dtype=tdt)
            b = torch.randn(s, s, device="cuda", dtype=tdt)
            for _ in range(3):
                a @ b
            torch.cuda.synchronize()
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                a @ b
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            v = round(2 * s**3 / float(np.median(times)) / 1e12, 1)
            out[f"torch {name} {s}"] = v
            print(f"PyTorch {torch.__version__} {name} {s}^3: {v} TFLOP/s", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
