"""Next-token sampling on the device (netcl.ops.sample, kernels/sampling.cl): the device time of one call on
rows of a vocabulary's logits, greedy and random (temperature; top-k and top-p), beside PyTorch doing the same
on the same device (argmax; softmax + multinomial; top-k, then top-p over the k kept, then multinomial), and
the floor of any launch: the device time of a one-element add. The compulsory bytes are the logits, read once;
at a decode step's one row they are a launch's worth of latency, not of bandwidth. Each greedy token is
checked against NumPy's argmax; netcl's figures are OpenCL event time (netcl.profiling) of every launch of a
call, median of three spans of --calls calls; PyTorch's CUDA event time over the same calls (on the CPU: wall
time after the last call). The rows' logits (--logits): `normal` (standard normal, a flat row: every token
within reach of the draw) or `zipf` (a trained model's shape, synthetic: 15 - 2.2 log(rank) plus noise of
0.5, ranks shuffled; netcl's draw skips the tokens that cannot win, so the random modes' cost depends on it).

    python bench/sampling.py [--gpu] [--vocab 32000] [--rows 1,8] [--dtypes bfloat16,float32]
                             [--logits normal,zipf] [--out JSON]
    python3 bench/sampling.py --gpu --sweep      # greedy by GREEDY_WG x GREEDY_UNROLL; by SPLIT_TOKENS
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv import device_seconds_per_call  # noqa: E402

from netcl import ops  # noqa: E402
from netcl.core import dtypes  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.ops import sampling  # noqa: E402

# (row name, temperature, top_k, top_p): greedy, plain random, Hugging Face's common generation settings
MODES = [("greedy", 0.0, None, 1.0), ("random T=0.8", 0.8, None, 1.0), ("top-k 50, top-p 0.9", 0.8, 50, 0.9)]
SWEEP_WG = (128, 256, 512, 1024)
SWEEP_UNROLL = (1, 2, 4, 8, 16)
SWEEP_SPLIT = (0, 512, 1024, 2048, 4096)   # ops.sampling.SPLIT_TOKENS (0: one work-group a row)


def row_values(rng: np.random.Generator, shape: str, rows: int, vocab: int) -> np.ndarray:
    """(rows, vocab) float32 logits: `normal` or `zipf` (the module docstring)."""
    if shape == "normal":
        return rng.standard_normal((rows, vocab)).astype(np.float32)
    ranks = np.stack([rng.permutation(vocab) + 1 for _ in range(rows)])
    return (15.0 - 2.2 * np.log(ranks) + 0.5 * rng.standard_normal((rows, vocab))).astype(np.float32)


def netcl_rows(q, logits: Tensor, calls: int) -> list[dict]:
    rows, vocab = logits.shape
    out = Tensor.empty(q, (rows,), np.int32)
    want = np.argmax(logits.to_host().astype(np.float32), axis=1)
    result = []
    for name, temperature, top_k, top_p in MODES:
        def call(t=temperature, k=top_k, p=top_p) -> None:
            ops.sample(logits, out, temperature=t, top_k=k, top_p=p)

        sec = device_seconds_per_call(call, q, calls)
        ok = None
        if temperature == 0.0:
            ops.sample(logits, out, temperature=0.0)
            ok = bool(np.array_equal(out.to_host(), want))
            if not ok:
                raise AssertionError(f"greedy tokens {out.to_host()} differ from NumPy's argmax {want}")
        result.append({"mode": name, "us": sec * 1e6, "checked": ok})
    return result


def torch_rows(host: np.ndarray, dtype: str, gpu: bool, calls: int) -> list[dict]:
    import torch  # noqa: PLC0415 (a peer, optional: the benchmark reports it missing)

    dev = "cuda" if gpu else "cpu"
    if gpu and not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    x = torch.from_numpy(host.astype(np.float32)).to(dev, getattr(torch, dtype))
    gen = torch.Generator(device=dev).manual_seed(0)

    def greedy():
        return torch.argmax(x, dim=-1)

    def plain():
        return torch.multinomial(torch.softmax(x.float() / 0.8, dim=-1), 1, generator=gen)

    def top_k_p():
        v, i = torch.topk(x.float() / 0.8, 50, dim=-1)  # sorted, largest first
        probs = torch.softmax(v, dim=-1)
        cut = torch.cumsum(probs, dim=-1) - probs >= 0.9  # the smallest prefix whose mass reaches 0.9
        probs = probs.masked_fill(cut, 0.0)
        return i.gather(-1, torch.multinomial(probs, 1, generator=gen))

    result = []
    for (name, *_), fn in zip(MODES, (greedy, plain, top_k_p)):
        for _ in range(3):
            fn()
        samples = []
        for _ in range(3):
            if gpu:
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e-3 / calls)
            else:
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples.append((time.perf_counter() - t0) / calls)
        result.append({"mode": name, "us": statistics.median(samples) * 1e6})
    return result


def sweep(q, logits: Tensor, calls: int) -> list[dict]:
    """Greedy by (GREEDY_WG, GREEDY_UNROLL); the work-group the call took (the device's and the compiled
    kernel's limits may lower the one asked for)."""
    rows, vocab = logits.shape
    out = Tensor.empty(q, (rows,), np.int32)
    want = np.argmax(logits.to_host().astype(np.float32), axis=1)
    old = sampling.GREEDY_WG, sampling.GREEDY_UNROLL
    result = []
    try:
        for wg in SWEEP_WG:
            for unroll in SWEEP_UNROLL:
                sampling.GREEDY_WG, sampling.GREEDY_UNROLL = wg, unroll

                def call() -> None:
                    ops.sample(logits, out, temperature=0.0)

                sec = device_seconds_per_call(call, q, calls)
                if not np.array_equal(out.to_host(), want):
                    raise AssertionError(f"WG {wg} unroll {unroll}: greedy tokens differ from NumPy's argmax")
                took = sampling.program(q.device, logits.dtype, greedy=True)[1]
                result.append({"wg": wg, "unroll": unroll, "wg_taken": took, "us": sec * 1e6})
    finally:
        sampling.GREEDY_WG, sampling.GREEDY_UNROLL = old
    return result


def sweep_split(q, logits: Tensor, calls: int) -> list[dict]:
    """Greedy and the plain draw (T=0.8) by SPLIT_TOKENS: the work-groups a row took, device us a call."""
    rows, vocab = logits.shape
    out = Tensor.empty(q, (rows,), np.int32)
    old = sampling.SPLIT_TOKENS
    result = []
    try:
        for tokens in SWEEP_SPLIT:
            sampling.SPLIT_TOKENS = tokens
            row = {"split_tokens": tokens, "groups": sampling.splits(q.device, vocab, False)}
            for name, t in (("greedy", 0.0), ("random T=0.8", 0.8)):
                row[name] = device_seconds_per_call(
                    lambda t=t: ops.sample(logits, out, temperature=t), q, calls) * 1e6
            result.append(row)
    finally:
        sampling.SPLIT_TOKENS = old
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="netcl on the OpenCL GPU, PyTorch on CUDA")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rows", default="1,8", help="rows (batch) of logits, comma-separated (default 1,8)")
    ap.add_argument("--dtypes", default="bfloat16,float32", help="logits' dtypes (default bfloat16,float32)")
    ap.add_argument("--calls", type=int, default=100, help="calls a timed span (default 100)")
    ap.add_argument("--logits", default="normal,zipf",
                    help="the rows' values, comma-separated: normal, zipf (default both; see above)")
    ap.add_argument("--sweep", action="store_true",
                    help="also greedy by GREEDY_WG x GREEDY_UNROLL, and greedy and T=0.8 by SPLIT_TOKENS "
                         "(the first --rows)")
    ap.add_argument("--no-torch", action="store_true", help="the netcl rows only")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    try:
        batch = [int(r) for r in args.rows.split(",")]
        names = [d.strip() for d in args.dtypes.split(",")]
    except ValueError:
        ap.error(f"--rows takes comma-separated integers, got {args.rows!r}")
    if args.vocab < 1 or args.calls < 1 or not batch or min(batch) < 1:
        ap.error("--vocab, --calls and every --rows entry must be >= 1")
    bad = [n for n in names if n not in ("bfloat16", "float16", "float32")]
    if bad:
        ap.error(f"--dtypes: {bad} (choose from bfloat16, float16, float32)")
    shapes = [k.strip() for k in args.logits.split(",")]
    if not shapes or any(k not in ("normal", "zipf") for k in shapes):
        ap.error(f"--logits takes a comma list of normal, zipf; got {args.logits!r}")
    dev = manager.get("gpu" if args.gpu else "auto")
    q = dev.queue
    one = Tensor.from_host(q, np.zeros(1, np.int32))
    floor = device_seconds_per_call(lambda: ops.add(one, 1).realize(), q, args.calls)
    print(f"{dev.device_name}: device us a call, median of 3 x {args.calls}; vocabulary {args.vocab:,}; "
          f"the smallest launch (a one-element add) {floor * 1e6:.1f} us")
    rng = np.random.default_rng(0)
    table, results = [], {"device": dev.device_name, "vocab": args.vocab, "floor_us": floor * 1e6, "rows": []}
    for name, shape in [(n, k) for n in names for k in shapes]:
        for rows in batch:
            host = row_values(rng, shape, rows, args.vocab)
            logits = Tensor.from_host(q, host)
            if name != "float32":
                logits = ops.cast(logits, getattr(dtypes, name)).realize()
                host = logits.to_host().astype(np.float32)
            mine = netcl_rows(q, logits, args.calls)
            peer = None
            if not args.no_torch:
                try:
                    peer = torch_rows(host, name, args.gpu, args.calls)
                except (ImportError, RuntimeError) as exc:
                    print(f"  (PyTorch not timed: {exc})")
            for k, row in enumerate(mine):
                theirs = peer[k]["us"] if peer else None
                table.append((name, shape, rows, row["mode"], row["us"], theirs))
                results["rows"].append({"dtype": name, "logits": shape, "rows": rows, **row,
                                        "torch_us": theirs})
            if args.sweep and rows == batch[0] and shape == shapes[0]:
                results.setdefault("sweep", {})[name] = found = sweep(q, logits, args.calls)
                print(f"  greedy, {name}, {rows} row(s), us by GREEDY_WG (asked / taken) x GREEDY_UNROLL:")
                for r in found:
                    print(f"    WG {r['wg']:5d} / {r['wg_taken']:5d}  unroll {r['unroll']:3d}  "
                          f"{r['us']:8.1f}")
                results.setdefault("sweep_split", {})[name] = spread = sweep_split(q, logits, args.calls)
                print(f"  {name}, {rows} row(s), us by SPLIT_TOKENS (work-groups a row): greedy, T=0.8")
                for r in spread:
                    print(f"    {r['split_tokens']:5d} ({r['groups']:3d})  {r['greedy']:8.1f} "
                          f"{r['random T=0.8']:8.1f}")
    print(f"\n{'dtype':9} {'logits':6} {'rows':>4}  {'mode':22} {'netcl us':>9} {'torch us':>9} {'ratio':>6}")
    for name, shape, rows, mode, us, theirs in table:
        peer = f"{theirs:9.1f} {theirs / us:6.2f}" if theirs else f"{'-':>9} {'-':>6}"
        print(f"{name:9} {shape:6} {rows:4d}  {mode:22} {us:9.1f} {peer}")
    print("ratio: PyTorch's time over netcl's (above 1: netcl faster)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
