"""Matrix-vector products (GEMMs of one to three rows: a decode step's x @ W): each GEMM kernel that takes
them
beside netcl's automatic choice, on the default device, with W both as a linear layer's transposed weight
(k-contiguous) and row-major. Bytes = W once (the compulsory traffic); median of 30 calls after 3 warm-ups.

    python bench/gemv.py [--out bench/results/gemv.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from netcl.core.device import manager
from netcl.core.tensor import Tensor
from netcl.ops import gemm as mm

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/gemv.json")
    args = ap.parse_args()
    dev = manager.default()
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
