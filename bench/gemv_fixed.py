"""The fixed cost of a decode GEMV launch: the event time of one gemm_gemv and of a one-phase gemv_chain by
the weight's rows N (K = 2,048 bfloat16, one row of activations), ten such launches in a row, and a chain
of one to four tiny phases (256 x 256: what a phase boundary costs). Each way is recorded in a netcl Graph and
replayed; wall is a replay's host-to-finish time, the kernels' figures their OpenCL event times. Issue 33: a
decode step's kernels read their weights at ~56% of copy and each small launch costs ~20 us of event time.

    python3 bench/gemv_fixed.py --gpu [--rows 8,256,2048,5632,11264,32000]
    python bench/gemv_fixed.py --small        # CPU smoke test: N = 8, 256
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from netcl import graph, ops, profiling  # noqa: E402
from netcl.core import dtypes  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.ops.gemm import ChainStep, gemv_chain  # noqa: E402


def timed(q, fn, n: int = 200) -> tuple[float, list[tuple[str, float, float]]]:
    """(wall seconds a replay, [(kernel, launches a replay, mean event us)]) of fn recorded once."""
    g = graph.Graph()
    with g.capture(q):
        fn()
    for _ in range(5):
        g.replay()
    q.finish()
    t0 = time.perf_counter()
    for _ in range(n):
        g.replay()
    q.finish()
    wall = (time.perf_counter() - t0) / n
    with profiling.profile() as prof:
        for _ in range(50):
            g.replay()
        q.finish()
    return wall, [(r.name, r.calls / 50, r.mean * 1e6) for r in prof.rows("kernel")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--small", action="store_true", help="N = 8 and 256 only (a CPU smoke test)")
    ap.add_argument("--rows", default="8,256,2048,5632,11264,32000", help="comma list of weight rows N")
    args = ap.parse_args()
    try:
        sizes = [8, 256] if args.small else [int(v) for v in args.rows.split(",")]
    except ValueError:
        ap.error(f"--rows takes a comma list of integers, got {args.rows!r}")
    if any(n < 1 for n in sizes):
        ap.error("--rows values must be >= 1")
    q = manager.get("gpu" if args.gpu else "auto").queue
    bf = dtypes.bfloat16
    rng = np.random.default_rng(0)

    def t(shape, scale=1.0):
        return Tensor.from_host(q, (rng.standard_normal(shape) * scale).astype(bf))

    k = 2048
    x = t((1, k))
    print(f"{q.device.describe()}: M = 1, K = {k}, bfloat16")

    def show(label: str, wall: float, rows: list) -> None:
        kernels = ", ".join(f"{name} {calls:.0f} x {mean:.1f} us" for name, calls, mean in rows)
        print(f"{label:44s} wall {wall * 1e6:8.1f} us a replay; {kernels}")

    for n in sizes:
        w = t((n, k), k ** -0.5)
        for name, fn in (("linear (gemm_gemv)", lambda: ops.linear(x, w)),
                         ("gemv_chain, 1 phase", lambda: gemv_chain([ChainStep(x, w)])),
                         ("10 linear in a row", lambda: [ops.linear(x, w) for _ in range(10)])):
            show(f"N {n:6d} ({n * k * 2 / 1e6:6.1f} MB) {name}", *timed(q, fn))
    ws = [t((256, 256), 1 / 16) for _ in range(4)]
    x2 = t((1, 256))
    for phases in (1, 2, 3, 4):
        steps = [ChainStep(x2, ws[0])] + [ChainStep(i, ws[i + 1]) for i in range(phases - 1)]
        show(f"chain of {phases} tiny phases (256 x 256)", *timed(q, lambda s=steps: gemv_chain(s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
