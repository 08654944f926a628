"""A decode step's MLP halves in one launch a layer (ops.gemm.gemv_chain) against the same GEMVs launched one
by one, on TinyLlama-1.1B's shapes (dim 2048, hidden 5632, 22 layers; M = 1 row of bfloat16): each layer's
o-projection + residual, RMSNorm + gate/up + SwiGLU, down-projection + residual. Both ways are recorded in a
netcl Graph and replayed back to back (what generate does with a decode step): the wall time a replay of the
22 layers, and weight GB/s over the copy bandwidth measured in the same run. Results of the two ways are
compared (the same kernel and sums: equal bits). --qkv adds each layer's fourth phase of the decode step,
the next layer's RMSNorm + q/k/v product (2,560 x 2,048).

    python3 bench/gemv_chain.py --gpu [--layers 22] [--dtype bfloat16] [--rows 1] [--qkv] [--out JSON]
    python bench/gemv_chain.py --small       # CPU smoke test: every size / 16, 2 layers
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
from netcl import graph  # noqa: E402
from netcl.core import dtypes  # noqa: E402
from netcl.core.backend import enqueue_copy  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.ops.gemm import ChainStep, gemv_chain  # noqa: E402


def copy_gbs(q, nbytes: int = 256 << 20) -> float:
    a, b = Tensor.empty(q, (nbytes // 4,), np.float32), Tensor.empty(q, (nbytes // 4,), np.float32)
    for _ in range(3):
        enqueue_copy(q, b.buffer, a.buffer, byte_count=nbytes)
    q.finish()
    t0 = time.perf_counter()
    for _ in range(10):
        enqueue_copy(q, b.buffer, a.buffer, byte_count=nbytes)
    q.finish()
    return 2 * nbytes * 10 / (time.perf_counter() - t0) / 1e9


def replay_ms(g: graph.Graph, q, n: int) -> float:
    """Median ms of a replay over 5 spans of n back-to-back replays."""
    for _ in range(3):
        g.replay()
    q.finish()
    spans = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            g.replay()
        q.finish()
        spans.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(spans)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--small", action="store_true", help="every size / 16, 2 layers (a CPU smoke test)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--qkv", action="store_true",
                    help="a fourth phase a layer: the next layer's norm + q/k/v")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    q = manager.get("gpu" if args.gpu else "auto").queue
    dt = dtypes.normalize(args.dtype)
    d, hidden, layers = 2048, 5632, 22
    if args.small:
        d, hidden, layers = d // 16, hidden // 16, 2
    layers = args.layers or layers
    qkv_n = 2560 // (16 if args.small else 1)
    rng = np.random.default_rng(0)

    def t(shape, scale):
        return Tensor.from_host(q, (rng.standard_normal(shape) * scale).astype(dt))

    x = t((args.rows, d), 1.0)
    attn = t((args.rows, d), 1.0)
    weights = [(t((d, d), d ** -0.5), t((d,), 1.0), t((2 * hidden, d), d ** -0.5),
                t((d, hidden), hidden ** -0.5), t((qkv_n, d), d ** -0.5) if args.qkv else None)
               for _ in range(layers)]
    nbytes = sum(sum(w.size for w in ws if w is not None) for ws in weights) * dt.itemsize
    phases = 4 if args.qkv else 3

    def steps(wo, ln, wgu, wd, wqkv, h):
        s = [ChainStep(attn, wo, residual=h), ChainStep(0, wgu, norm=(ln, 1e-5), glu=True),
             ChainStep(1, wd, residual=0)]
        return s + [ChainStep(2, wqkv, norm=(ln, 1e-5))] if wqkv is not None else s

    def chained():
        h, outs = x, []
        for ws in weights:
            outs = gemv_chain(steps(*ws, h))
            h = outs[2]
        return outs

    def separate():
        h, outs = x, []
        for ws in weights:
            outs = []
            for step in steps(*ws, h):  # each step alone, reading the earlier ones' outputs
                a = outs[step.a] if type(step.a) is int else step.a
                r = outs[step.residual] if type(step.residual) is int else step.residual
                outs += gemv_chain([ChainStep(a, step.weight, residual=r, norm=step.norm, glu=step.glu)])
            h = outs[2]
        return outs

    rows = []
    results = []
    copy = copy_gbs(q)
    for name, fn, launches in (("chain (1 launch a layer)", chained, layers),
                               (f"separate ({phases} launches a layer)", separate, phases * layers)):
        g = graph.Graph()
        with g.capture(q):
            outs = fn()
        ms = replay_ms(g, q, args.replays)
        results.append([o.to_host().astype(np.float64) for o in outs])
        gbs = nbytes / ms / 1e6
        rows.append({"way": name, "launches": launches, "ms": ms, "weight_gbs": gbs, "of_copy": gbs / copy})
    same = all(np.array_equal(a, b) for a, b in zip(*results, strict=True))
    print(f"{q.device.describe()}: {layers} layers' MLP halves{' + next q/k/v' if args.qkv else ''}, "
          f"M = {args.rows}, {dt.name}, {nbytes / 1e9:.3f} GB of weights; copy {copy:.0f} GB/s")
    print(f"{'way':32s} {'launches':>8s} {'ms':>8s} {'GB/s':>8s} {'of copy':>8s}")
    for r in rows:
        print(f"{r['way']:32s} {r['launches']:8d} {r['ms']:8.3f} {r['weight_gbs']:8.0f} {r['of_copy']:8.1%}")
    print(f"chain / separate: {rows[1]['ms'] / rows[0]['ms']:.2f}x faster; results equal bit for bit: {same}")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": q.device.describe(), "rows": rows, "equal": same,
                                              "copy_gbs": copy, "dtype": dt.name, "m": args.rows,
                                              "phases": phases}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
