"""Host cost of one kernel launch with 25 arguments (the tiled GEMM's signature), by the way the
arguments are set: pyopencl's per-argument set_arg, its one-call _set_arg_multi, netcl's Kernel
(skips unchanged by-value arguments), a netcl Plan (static arguments set once, only the buffers per call),
and setting nothing (the enqueue alone); then the host time per
launch of whole eager training steps (bench/train_step.py's MLP and CNN; ResNet-18 and a transformer with
`--steps`), each step enqueued behind a
gate (a marker waiting on a user event) so the device runs nothing until the host is done: on PoCL the
kernels would otherwise share the CPU with the Python that enqueues them. A fixed pure-Python loop timed
before and after the steps (python_reference_us) gives the process's Python speed beside them.

    python bench/launch_cost.py [--gpu] [--n 2000] [--steps mlp,cnn] [--repeat 20] [--python-only]
                                [--out JSON]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyopencl as cl  # noqa: E402

from netcl.core.backend import build_program  # noqa: E402
from netcl.core.device import manager  # noqa: E402

SRC = """
__kernel void k25(int m, int n, int k, __global float *a, long ao, long ars, long aks,
                  __global float *b, long bo, long bks, long bns, __global float *c, long co, long crs,
                  __global float *bias, long bio, long bis, __global float *r, long ro, long rrs, long rcs,
                  float alpha, int nb, long4 s1, long4 s2)
{ if (get_global_id(0) == 0 && m < 0) c[co] = alpha; }
"""


def per_call(fn, n: int, q) -> float:
    """Median host seconds of one call of fn over 5 samples of n calls, each sample behind a gate (as the
    eager steps below): the kernels it enqueues run after the sample, not beside it (on PoCL they took the
    other core from the enqueueing thread: a Plan's launch read 15.9 us ungated, 3.8-7.0 gated, against the
    raw enqueue's 1.7-3.4; bench/NOTES.md, eleventh session)."""
    for _ in range(50):
        fn()
    q.finish()
    samples = []
    for _ in range(5):
        gate = cl.UserEvent(q.context)
        cl.enqueue_marker(q.cl, wait_for=[gate])
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
        gate.set_status(cl.command_execution_status.COMPLETE)
        q.finish()
    return statistics.median(samples)


def eager_step(kind: str, q):
    """(step function, launches per step) of an eager training step: bench/train_step.py's `mlp` and `cnn`,
    bench/resnet.py's `resnet` (ResNet-18, batch 32: the host's work a launch does not depend on the batch),
    or `gpt` (lm-train's 25m preset's widths, 8 layers, batch 4 x 128 tokens, float32, lm_step as `lm-train
    --eager` runs it, clipping included)."""
    from netcl import optim
    from netcl.core.tensor import Tensor
    from netcl.ops import random
    from netcl.profiling import count_launches
    from netcl.train.loop import build_model, train_step

    random.manual_seed(0)
    rng = np.random.default_rng(0)
    if kind == "gpt":
        from netcl.models.gpt import GPT, GPTConfig
        from netcl.train.lm import lm_step, make_optimizer

        net = GPT(q, GPTConfig(vocab_size=4096, dim=512, n_layers=8, n_heads=8, max_seq_len=128))
        opt = make_optimizer(net, {"weight_decay": 0.1, "lr": 1e-4})
        batch = rng.integers(0, 4096, (4, 129)).astype(np.int32)
        ids = Tensor.from_host(q, np.ascontiguousarray(batch[:, :-1]))
        targets = Tensor.from_host(q, np.ascontiguousarray(batch[:, 1:]))

        def step() -> None:
            lm_step(net, opt, ids, targets, 1.0, None, None)
    else:
        if kind == "resnet":
            from netcl.nn.resnet import resnet18

            shape, model = (32, 3, 32, 32), resnet18(q, 10)
            opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        else:
            shape = (256, 1, 28, 28) if kind == "mlp" else (128, 1, 28, 28)
            model = build_model(kind, q, (1, 28, 28), 10)
            opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
        x = Tensor.from_host(q, rng.standard_normal(shape).astype(np.float32))
        y = Tensor.from_host(q, rng.integers(0, 10, shape[0]).astype(np.int32))

        def step() -> None:
            train_step(model, opt, x, y)

    for _ in range(3):
        step()
    q.finish()
    with count_launches() as c:
        step()
    q.finish()
    return step, c.count


def op_templates() -> dict[str, tuple[int, int]]:
    """Per op: (signatures replayed from a template, signatures refused one) in netcl.core.capture.plans."""
    from netcl.core import capture, template

    counts: dict[str, list[int]] = {}
    for key, value in list(capture.plans.items()):
        if isinstance(key[0], str) and key[0].endswith(" (replayed)"):
            entry = counts.setdefault(key[0][:-len(" (replayed)")], [0, 0])
            entry[isinstance(value, str) and value == template._REFUSED] += 1
    return {op: (kept, refused) for op, (kept, refused) in counts.items()}


def gated_host_seconds(step, q, repeat: int) -> tuple[float, float, float]:
    """(median host seconds to enqueue one step while the device waits, the same in the enqueueing thread's
    CPU time (what the Python costs, without the time other processes took the core), median seconds of the
    step run ungated: enqueue + finish)."""
    host, cpu, full = [], [], []
    for _ in range(repeat):
        gate = cl.UserEvent(q.context)
        cl.enqueue_marker(q.cl, wait_for=[gate])
        t0, c0 = time.perf_counter(), time.thread_time()
        step()
        host.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        gate.set_status(cl.command_execution_status.COMPLETE)
        q.finish()
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        q.finish()
        full.append(time.perf_counter() - t0)
    return statistics.median(host), statistics.median(cpu), statistics.median(full)


def python_only_seconds(step, q, repeat: int) -> float:
    """The best host seconds of a step with its kernel launches not enqueued (netcl.core.backend's
    _enqueue_kernel replaced by a marker for the duration): the Python a step costs, without the driver's
    enqueue; the step's results are not computed (copies and fills still run), so the model's state is not
    advanced by these calls."""
    from netcl.core import backend

    q.finish()
    marker = cl.enqueue_marker(q.cl)
    real = backend._enqueue_kernel
    backend._enqueue_kernel = lambda *a, **k: marker
    try:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    finally:
        backend._enqueue_kernel = real
    q.finish()
    return min(times)


class _Slot:
    __slots__ = ("shape", "strides", "buffer")

    def __init__(self, shape: tuple, strides: tuple, buffer: object):
        self.shape, self.strides, self.buffer = shape, strides, buffer


def python_reference_us(repeat: int = 30) -> float:
    """Best microseconds of a fixed pure-Python loop shaped like an eager launch's host work (objects with
    slots made and dropped, attribute loads, tuple keys hashed into a dict, list appends, small calls, id()):
    this process's Python speed, so that step figures from hosts (or processes) of different speeds can be
    told apart from changes in netcl (the lent GPU hosts run some processes ~1.5x slower throughout)."""
    cache: dict = {}

    def key(t: _Slot, name: str) -> tuple:
        return (name, t.shape, t.strides, id(t.buffer))

    best = float("inf")
    for _ in range(repeat):
        cache.clear()
        t0 = time.perf_counter()
        made = []
        for i in range(1000):
            t = _Slot((i & 7, 64), (64, 1), made)
            k = key(t, "x")
            hit = cache.get(k)
            if hit is None:
                cache[k] = hit = len(cache)
            made.append(hit)
            if len(made) > 64:
                made = []
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--steps", default="mlp,cnn",
                    help="eager steps to time, of mlp, cnn, resnet, gpt (empty: none)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--python-only", action="store_true",
                    help="also each step's Python alone: its kernel launches not enqueued (best of --repeat)")
    ap.add_argument("--no-step-memo", action="store_true",
                    help="every optimizer step through its full path (netcl.optim.optimizer.STEP_MEMO off)")
    ap.add_argument("--no-op-templates", action="store_true",
                    help="run every op's Python each call (netcl.core.template.ENABLED off)")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    kinds = [k for k in args.steps.split(",") if k.strip()]
    unknown = sorted({k for k in kinds if k not in ("mlp", "cnn", "resnet", "gpt")})
    if unknown:
        ap.error(f"--steps: unknown step {', '.join(map(repr, unknown))}; choose from mlp, cnn, resnet, gpt "
                 f"(comma-separated; empty for none)")
    if args.n < 1 or args.repeat < 1:
        ap.error("--n and --repeat must be at least 1")
    if args.no_op_templates:
        from netcl.core import template

        template.ENABLED = False
    if args.no_step_memo:
        from netcl.optim import optimizer

        optimizer.STEP_MEMO = False
    dev = manager.get("gpu" if args.gpu else "auto")
    q = dev.queue
    prg = build_program(dev, SRC)
    kern = prg.k25
    raw: cl.Kernel = kern.cl
    bufs = [cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 4096) for _ in range(5)]
    i32, i64 = np.int32, np.int64
    from pyopencl import cltypes

    s4 = cltypes.make_long4(0, 0, 0, 0)
    vals = (i32(1), i32(1), i32(1), bufs[0], i64(0), i64(1), i64(1), bufs[1], i64(0), i64(1), i64(1),
            bufs[2], i64(0), i64(1), bufs[3], i64(0), i64(0), bufs[4], i64(0), i64(0), i64(0),
            np.float32(1.0), i32(1), s4, s4)
    multi = tuple(x for i, v in enumerate(vals) for x in (i, v))
    gs, ls = (64,), (64,)
    enqueue = cl.enqueue_nd_range_kernel
    raw.set_args(*vals)
    rows = []

    def bench(label, fn):
        t = per_call(fn, args.n, q)
        q.finish()
        rows.append((label, t))

    bench("set_arg x25 (no enqueue)", lambda: [raw.set_arg(i, v) for i, v in enumerate(vals)])
    bench("_set_arg_multi (no enqueue)", lambda: raw._set_arg_multi(multi))
    bench(
        "set_arg buffers only x5 (no enqueue)", lambda: [raw.set_arg(i, vals[i]) for i in (3, 7, 11, 14, 17)]
    )
    bench("cl.enqueue_nd_range_kernel alone", lambda: enqueue(q.cl, raw, gs, ls))
    bench(
        "_cl.enqueue_nd_range_kernel alone",
        lambda: cl._cl.enqueue_nd_range_kernel(q.cl, raw, gs, ls, None, None),
    )
    bench("netcl Kernel.__call__ (same args)", lambda: kern(q, gs, ls, *vals))
    bench("netcl Kernel.__call__ (20 new scalars)", lambda: kern(q, gs, ls, *[
        v if isinstance(v, (cl.MemoryObject, np.ndarray)) else type(v)(v + 0) for v in vals]))
    bench("set_args(*25) + enqueue", lambda: (raw.set_args(*vals), enqueue(q.cl, raw, gs, ls)))
    slots = (3, 7, 11, 14, 17)  # a GEMM plan's dynamic arguments: its buffers (offsets fixed here)
    # what setting a buffer costs between launches (a driver may copy the argument block it enqueued last)
    bench("set_arg buffers x5 + enqueue", lambda: ([raw.set_arg(i, vals[i]) for i in slots],
                                                    enqueue(q.cl, raw, gs, ls)))
    plan = kern.plan(gs, ls, vals, slots)
    bench("netcl Plan (5 buffers set, 20 fixed)", lambda: plan(q, *[vals[i] for i in slots]))
    q.finish()
    print(f"{dev.device_name}: host seconds per call, median of 5 x {args.n}")
    for label, t in rows:
        print(f"  {label:42s} {t * 1e6:8.2f} us")
    reference = [python_reference_us()]
    print(f"  this process's Python speed: reference loop {reference[0]:.1f} us (best of 30)")
    steps = {}
    for kind in kinds:
        step, launches = eager_step(kind, q)
        host, cpu, full = gated_host_seconds(step, q, args.repeat)
        steps[kind] = {"launches": launches, "host_us_per_launch": host / launches * 1e6,
                       "thread_cpu_us_per_launch": cpu / launches * 1e6, "step_ms": full * 1e3}
        print(f"  eager {kind} step: {launches} launches, host {host * 1e3:.2f} ms = "
              f"{host / launches * 1e6:.1f} us per launch (thread CPU {cpu / launches * 1e6:.1f} us); "
              f"step (enqueue + finish) {full * 1e3:.2f} ms")
        kept = op_templates()
        steps[kind]["op_templates"] = kept
        listed = ", ".join(f"{op} {n} kept" + (f" / {r} refused" if r else "")
                           for op, (n, r) in sorted(kept.items()))
        print(f"    op templates (netcl.core.template) after it: {listed or 'none'}")
        if args.python_only:
            best = python_only_seconds(step, q, args.repeat)
            steps[kind]["python_only_us_per_launch"] = best / launches * 1e6
            print(f"    its Python alone (kernel enqueues skipped, best of {args.repeat}): "
                  f"{best * 1e3:.2f} ms = {best / launches * 1e6:.1f} us per launch")
    if kinds:
        reference.append(python_reference_us())
        print(f"  the reference loop after the steps: {reference[1]:.1f} us")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"device": dev.device_name, "per_call_us": {
            label: t * 1e6 for label, t in rows}, "eager_steps": steps, "python_reference_us": reference},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
