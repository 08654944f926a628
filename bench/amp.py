"""Mixed precision: BufferPool peak and step time of a training step with and without AMP, and the
bandwidth-bound ops in float16/bfloat16 storage against float32, netcl only (the peer is netcl's own
float32 path, measured in the same run). Table + JSON.

Steps: the `netcl train` CNN (batch 128, 1x28x28) and, when netcl.models is there, a small GPT (llama
arch, dim 256, 4 layers, seq 256, batch 8); each float32, then `--amp` float16 (autocast + GradScaler)
and bfloat16 (autocast), eager and replayed from a netcl.graph.Graph. "act peak" = BufferPool peak during
the step minus what was in use when it started (parameters, optimizer state, inputs): the activations,
gradients and scratch a step allocates. Target: act peak <= 0.55x float32's.

Ops (bandwidth-bound, bytes = compulsory reads + writes): a fused elementwise chain (gelu(x) * w + b),
softmax over rows, a row sum, and causal flash attention; time and GB/s per
dtype, ratio = float32 time / half time. Target on the H200: >= 1.6x with half storage.

Bandwidth over sizes (--sizes, the third table): per op, dtype and element count n, the time per call
with `inner` calls queued between two finishes (>= 2^27 elements a sample: the launch floor shows at small n,
the host's sync nowhere),
GB/s of compulsory bytes and float32 time / half time. Where half's ratio climbs with n toward 2x the
gap at small n is the per-launch cost; where it stays flat at large n the kernel moves fewer bytes/s.
Three clocks: "wall" (eager calls: the host's dispatch included), "dev" (the kernels' OpenCL event times:
on NVIDIA's driver ~5 us a kernel of event overhead, bench/NOTES.md seventh session) and "replay" (the
`inner` calls recorded once and replayed, wall time: the device's own pace wherever a launch's device time
exceeds the driver's enqueue, ~6 us on the H200's host).

    python bench/amp.py                   # PoCL CPU
    python bench/amp.py --gpu             # the default GPU (the lead's H200)
    python bench/amp.py --gpu --models --no-ops --sizes 16 18 20 22 24 26   # bandwidth table only
    python bench/amp.py --models cnn --repeat 20 --out bench/results/amp.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import netcl.autograd as ag  # noqa: E402
import netcl.ops as ops  # noqa: E402
from netcl import amp, optim, profiling  # noqa: E402
from netcl.core import dtypes  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.graph import Graph  # noqa: E402
from netcl.ops import random  # noqa: E402
from netcl.train.loop import build_model  # noqa: E402

try:  # the GPT model lands with the transformer issue; the CNN rows run without it
    from netcl.models import GPT, GPTConfig
except ImportError:  # pragma: no cover
    GPT = GPTConfig = None

MODES = ("float32", "float16", "bfloat16")


def median_seconds(fn, finish, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    finish()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        finish()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def make_step(kind: str, q, mode: str, gpu: bool):
    """(step function, model) of one AMP mode: forward under autocast, scaled backward, AdamW."""
    random.manual_seed(0)
    rng = np.random.default_rng(0)
    if kind in ("cnn", "resnet"):
        shape, batch = ((1, 28, 28), 128) if kind == "cnn" else ((3, 32, 32), 64 if gpu else 8)
        model = build_model(kind, q, shape, 10)
        x = Tensor.from_host(q, rng.standard_normal((batch, *shape)).astype(np.float32))
        y = Tensor.from_host(q, rng.integers(0, 10, batch).astype(np.int32))

        def loss_of():
            return ag.cross_entropy(model(ag.tensor(x)), ag.tensor(y))
    else:  # gpt: a small GPT; gpt25m: lm-train's 25m preset (8 layers, dim 512, batch 32 x 512; GPU-sized)
        big = kind == "gpt25m"
        vocab, rows, seq = (4096, 32, 512) if big else (512, 8, 256)
        cfg = GPTConfig(vocab_size=vocab, dim=512 if big else 256, n_layers=8 if big else 4,
                        n_heads=8 if big else 4, max_seq_len=seq)
        model = GPT(q, cfg)
        ids = Tensor.from_host(q, rng.integers(0, vocab, (rows, seq)).astype(np.int32))
        targets = Tensor.from_host(q, rng.integers(0, vocab, (rows, seq)).astype(np.int32))

        def loss_of():
            return model.loss(ids, targets)
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    scaler = amp.GradScaler() if mode == "float16" else None

    def step() -> None:
        if mode == "float32":
            with ag.Tape() as tape:
                loss = loss_of()
            tape.backward(loss)
            opt.step()
        else:
            with amp.autocast(mode), ag.Tape() as tape:
                loss = loss_of()
            if scaler is not None:
                tape.backward(scaler.scale(loss))
                scaler.step(opt)
                scaler.update()
            else:
                tape.backward(loss)
                opt.step()
        opt.zero_grad()

    return step


def profile_step(kind: str, dev, mode: str, top: int) -> str:
    """One eager step of `kind` in `mode` under netcl.profiling: the device time by op (where AMP's step
    time goes: casts, GEMMs, norms, attention)."""
    q = dev.queue
    gc.collect()
    step = make_step(kind, q, mode, False)
    step()
    step()
    q.finish()
    with profiling.profile() as prof:
        step()
        q.finish()
    return prof.report(by="op", top=top, file=open("/dev/null", "w"))  # noqa: SIM115


def measure_step(kind: str, dev, mode: str, repeat: int, gpu: bool) -> dict:
    q = dev.queue
    gc.collect()  # the previous mode's model, optimizer and graph go back to the pool first
    q.finish()
    step = make_step(kind, q, mode, gpu)
    step()  # state made (optimizer moments, scaler) before the peak is taken
    q.finish()
    pool = dev.pool
    base = pool.stats()["in_use"]
    pool.reset_peak()
    step()
    q.finish()
    peak = pool.stats()["peak"]
    eager = median_seconds(step, q.finish, repeat)
    graph = Graph()
    with graph.capture():
        step()
    replay = median_seconds(graph.replay, q.finish, repeat)
    return {"model": kind, "mode": mode, "act_peak_bytes": peak - base, "peak_bytes": peak,
            "eager_ms": eager * 1e3, "graph_ms": replay * 1e3}


def measure_ops(dev, repeat: int, gpu: bool) -> list[dict]:
    q = dev.queue
    n = (1 << 26) if gpu else (1 << 22)
    rows, cols = (n // 4096, 4096)
    rng = np.random.default_rng(1)
    base = rng.standard_normal(n).astype(np.float32)
    out = []
    for dt in (dtypes.float32, dtypes.float16, dtypes.bfloat16):
        x = Tensor.from_host(q, base, dtype=dt)
        w = Tensor.from_host(q, base[::-1].copy(), dtype=dt)
        b = Tensor.from_host(q, base[: n // 2].repeat(2), dtype=dt)
        size = dt.itemsize
        cases = {
            "gelu(x) * w + b": (lambda: (ops.gelu(x) * w + b).realize(), 4 * n * size),
            "softmax rows": (lambda: ops.softmax(x.reshape(rows, cols), -1), 2 * n * size),
            "row sum": (lambda: ops.sum(x.reshape(rows, cols), axis=1), n * size),
        }
        if hasattr(ops, "flash_attention"):
            bh, s, d = (16, 1024, 64) if gpu else (4, 256, 64)
            qa = Tensor.from_host(q, rng.standard_normal((1, bh, s, d)).astype(np.float32), dtype=dt)
            cases["flash attention (causal)"] = (
                lambda qa=qa: ops.flash_attention(qa, qa, qa, causal=True), 4 * bh * s * d * size)
        for name, (fn, nbytes) in cases.items():
            try:
                sec = median_seconds(fn, q.finish, repeat)
            except Exception as exc:  # an op without this dtype's path yet
                out.append({"op": name, "dtype": dt.name, "error": str(exc).splitlines()[0][:80]})
                continue
            out.append({"op": name, "dtype": dt.name, "ms": sec * 1e3, "gbps": nbytes / sec / 1e9})
    f32 = {r["op"]: r["ms"] for r in out if r["dtype"] == "float32" and "ms" in r}
    for r in out:
        if "ms" in r and r["op"] in f32:
            r["speedup_vs_f32"] = f32[r["op"]] / r["ms"]
    return out


def _bw_cases(q, n: int, dt, rng, gpu: bool) -> dict:
    """op name -> (function, compulsory bytes) at n elements of dtype dt (rows of 1024 for the row ops)."""
    cols = 1024 if n >= 1024 else n
    rows = n // cols
    base = rng.standard_normal(rows * cols).astype(np.float32)
    x = Tensor.from_host(q, base, dtype=dt)
    w = Tensor.from_host(q, base[::-1].copy(), dtype=dt)
    x2 = x.reshape(rows, cols)
    g = Tensor.from_host(q, np.ones(cols, np.float32), dtype=dt)
    size = dt.itemsize
    m = rows * cols
    cases = {
        "x * 2 (1 read, 1 write)": (lambda: (x * 2.0).realize(), 2 * m * size),
        "x * w + 1 (2r 1w)": (lambda: (x * w + 1.0).realize(), 3 * m * size),
        "softmax rows": (lambda: ops.softmax(x2, -1), 2 * m * size),
        "row sum": (lambda: ops.sum(x2, axis=1), m * size),
        "rms_norm rows": (lambda: ops.rms_norm(x2, (cols,), g)[0], 2 * m * size),
        "layer_norm rows": (lambda: ops.layer_norm(x2, (cols,), g, g)[0], 2 * m * size),
    }
    if hasattr(ops, "flash_attention") and n >= 1 << 16:
        d = 64
        s = min(2048 if gpu else 256, max(64, int((n // d) ** 0.5)))
        bh = max(1, n // (s * d))
        qa = Tensor.from_host(q, rng.standard_normal((1, bh, s, d)).astype(np.float32), dtype=dt)
        cases["flash attention causal"] = (lambda: ops.flash_attention(qa, qa, qa, causal=True),
                                           4 * bh * s * d * size)
    return cases


def measure_bandwidth(dev, log2_sizes: list[int], repeat: int, gpu: bool) -> list[dict]:
    """The bandwidth table: every case of _bw_cases at every size, float32 then float16 and bfloat16."""
    q = dev.queue
    rng = np.random.default_rng(2)
    out = []
    for lg in log2_sizes:
        n = 1 << lg
        # calls queued per timed sample: >= 128 M elements each (8 calls at 2^24, 2 at 2^26), so that a
        # sample's one finish (a sync round trip, ~10-15 us on the H200) skews half
        inner = max(1, min(64, (1 << 27) // n))
        for dt in (dtypes.float32, dtypes.float16, dtypes.bfloat16):
            try:
                cases = _bw_cases(q, n, dt, rng, gpu)
            except Exception as exc:
                msg = str(exc).splitlines()[0][:80]
                out.append({"n": n, "op": "(inputs)", "dtype": dt.name, "error": msg})
                continue
            for name, (fn, nbytes) in cases.items():
                def many(fn=fn):
                    for _ in range(inner):
                        fn()
                try:
                    sec = median_seconds(many, q.finish, repeat) / inner
                    with profiling.profile() as prof:  # the kernels' own time (events): a half kernel at
                        many()                         # 2^26 can be shorter than the host's dispatch
                        q.finish()
                    dev_sec = prof.device_seconds / inner
                    graph = Graph()
                    with graph.capture():
                        many()
                    rep_sec = median_seconds(graph.replay, q.finish, repeat) / inner
                    graph.close()
                except Exception as exc:
                    out.append({"n": n, "op": name, "dtype": dt.name, "error": str(exc).splitlines()[0][:80]})
                    continue
                out.append({"n": n, "op": name, "dtype": dt.name, "us": sec * 1e6, "gbps": nbytes / sec / 1e9,
                            "dev_us": dev_sec * 1e6, "dev_gbps": nbytes / dev_sec / 1e9, "inner": inner,
                            "rep_us": rep_sec * 1e6, "rep_gbps": nbytes / rep_sec / 1e9})
            del cases
            gc.collect()
    for key, ratio in (("us", "speedup_vs_f32"), ("dev_us", "dev_speedup_vs_f32"),
                       ("rep_us", "rep_speedup_vs_f32")):
        f32 = {(r["n"], r["op"]): r[key] for r in out if r["dtype"] == "float32" and key in r}
        for r in out:
            if key in r and (r["n"], r["op"]) in f32:
                r[ratio] = f32[(r["n"], r["op"])] / r[key]
    return out


def print_bandwidth(rows: list[dict]) -> None:
    """One line per (op, n): float32 us and GB/s, then each half dtype's GB/s and f32 time / its time."""
    print("\nwall: host time per call (dispatch included); dev: the kernels' event time; rep: recorded and"
          " replayed, wall time. x f32 = float32's time over this one (2.00 = the same GB/s)")
    print(f"{'op':<24} {'n':>9} {'f32 us':>9} {'f32 GB/s':>9} {'f16 GB/s':>9} {'x f32':>6} "
          f"{'bf16 GB/s':>9} {'x f32':>6} | {'dev f32':>8} {'f16':>8} {'x f32':>6} {'bf16':>8} {'x f32':>6} "
          f"| {'rep f32':>8} {'f16':>8} {'x f32':>6} {'bf16':>8} {'x f32':>6}")
    by = {(r["op"], r["n"], r["dtype"]): r for r in rows}
    seen = []
    for r in rows:
        if (r["op"], r["n"]) not in seen and r["op"] != "(inputs)":
            seen.append((r["op"], r["n"]))
    order = list(dict.fromkeys(o for o, _ in seen))
    seen.sort(key=lambda k: (order.index(k[0]), k[1]))

    def cell(r, key, fmt, width):
        return f"{'err':>{width}}" if r is None or key not in r else f"{r[key]:>{width}{fmt}}"

    for op, n in seen:
        a, h, b = (by.get((op, n, d)) for d in ("float32", "float16", "bfloat16"))
        print(f"{op:<24} {n:>9} {cell(a, 'us', '.1f', 9)} {cell(a, 'gbps', '.1f', 9)} "
              f"{cell(h, 'gbps', '.1f', 9)} {cell(h, 'speedup_vs_f32', '.2f', 6)} "
              f"{cell(b, 'gbps', '.1f', 9)} {cell(b, 'speedup_vs_f32', '.2f', 6)} | "
              f"{cell(a, 'dev_gbps', '.1f', 8)} {cell(h, 'dev_gbps', '.1f', 8)} "
              f"{cell(h, 'dev_speedup_vs_f32', '.2f', 6)} "
              f"{cell(b, 'dev_gbps', '.1f', 8)} {cell(b, 'dev_speedup_vs_f32', '.2f', 6)} | "
              f"{cell(a, 'rep_gbps', '.1f', 8)} {cell(h, 'rep_gbps', '.1f', 8)} "
              f"{cell(h, 'rep_speedup_vs_f32', '.2f', 6)} "
              f"{cell(b, 'rep_gbps', '.1f', 8)} {cell(b, 'rep_speedup_vs_f32', '.2f', 6)}")
    errs = {(r["op"], r["dtype"]): r["error"] for r in rows if "error" in r}
    for (op, dt), msg in errs.items():
        print(f"  ({op}, {dt}: {msg})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="run on the default GPU (else the CPU through PoCL)")
    ap.add_argument("--models", nargs="*", default=["cnn", "gpt"], choices=["cnn", "gpt", "gpt25m", "resnet"],
                    help="step models (none: no step table); resnet: ResNet-18 (CIFAR layout, batch norm) at "
                         "batch 64 (GPU) / 8 (CPU); gpt25m: lm-train's 25m preset (a GPU's size)")
    ap.add_argument("--sizes", nargs="*", type=int, default=None, metavar="LOG2N",
                    help="the bandwidth table at 2**LOG2N elements (none given: no table)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--no-ops", action="store_true", help="skip the bandwidth-bound op rows")
    ap.add_argument("--profile", type=int, default=0, metavar="TOP",
                    help="then one profiled eager step per model and mode: the TOP ops by device time")
    ap.add_argument("--out", default="bench/results/amp.json")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # a run cut off by a time limit keeps what it printed
    dev = manager.default("gpu" if args.gpu else "cpu")
    steps = []
    for kind in args.models:
        if kind.startswith("gpt") and GPT is None:
            print("(netcl.models is not here: GPT rows skipped)")
            continue
        for mode in MODES:
            try:
                steps.append(measure_step(kind, dev, mode, args.repeat, args.gpu))
            except Exception as exc:
                steps.append({"model": kind, "mode": mode, "error": str(exc).splitlines()[0][:100]})
    f32 = {r["model"]: r for r in steps if r["mode"] == "float32" and "error" not in r}
    print(f"device: {dev.device_name} ({dev.backend})")
    print(f"{'model':<5} {'mode':<9} {'act peak MiB':>12} {'x f32':>6} {'eager ms':>9} {'x f32':>6} "
          f"{'graph ms':>9} {'x f32':>6}")
    for r in steps:
        if "error" in r:
            print(f"{r['model']:<5} {r['mode']:<9} error: {r['error']}")
            continue
        ref = f32.get(r["model"])
        ratio = (lambda k: r[k] / ref[k]) if ref else (lambda k: float("nan"))
        r.update(
            act_peak_ratio=ratio("act_peak_bytes"),
            eager_ratio=ratio("eager_ms"),
            graph_ratio=ratio("graph_ms"),
        )
        print(
            f"{r['model']:<5} {r['mode']:<9} {r['act_peak_bytes'] / 2**20:>12.1f} "
            f"{r['act_peak_ratio']:>6.2f} "
            f"{r['eager_ms']:>9.2f} {r['eager_ratio']:>6.2f} {r['graph_ms']:>9.2f} {r['graph_ratio']:>6.2f}"
        )
    op_rows = [] if args.no_ops else measure_ops(dev, args.repeat, args.gpu)
    if op_rows:
        print(f"\n{'op':<26} {'dtype':<9} {'ms':>8} {'GB/s':>8} {'f32 time / this':>16}")
        for r in op_rows:
            if "error" in r:
                print(f"{r['op']:<26} {r['dtype']:<9} error: {r['error']}")
            else:
                print(f"{r['op']:<26} {r['dtype']:<9} {r['ms']:>8.3f} {r['gbps']:>8.1f} "
                      f"{r.get('speedup_vs_f32', float('nan')):>16.2f}")
    profiles = {}
    for kind in args.models if args.profile else ():
        for mode in MODES:
            if kind.startswith("gpt") and GPT is None:
                continue
            text = profile_step(kind, dev, mode, args.profile)
            profiles[f"{kind} {mode}"] = text
            print(f"\n-- {kind} {mode}: one eager step by op --\n{text}")
    bw_rows = measure_bandwidth(dev, args.sizes, args.repeat, args.gpu) if args.sizes else []
    if bw_rows:
        print_bandwidth(bw_rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": dev.device_name, "host": platform.node(), "steps": steps,
                                          "ops": op_rows, "bandwidth": bw_rows, "profiles": profiles},
                                         indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
