"""Where a step's time goes: per-kernel device time (OpenCL events) and the host's Python profile.

    python bench/profile_step.py --what cnn            # the CNN training step (batch 128)
    python bench/profile_step.py --what mlp            # the seed MLP step (batch 256)
    python bench/profile_step.py --what conv --gpu     # 3x3 conv forward, N=32 C=K=128 56x56, per algorithm

Prints the per-kernel table of one step (device time), the host time to enqueue a step on an idle
queue, the time spent inside pyopencl's enqueue/set-arg calls, and the top of a cProfile of the host.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("NETCL_PROFILE", "1")  # the queue records an event per launch
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyopencl as cl  # noqa: E402

from netcl import optim, profiling  # noqa: E402
from netcl.core import backend  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.ops import random  # noqa: E402


def make_step(what: str, q):
    random.manual_seed(0)
    rng = np.random.default_rng(0)
    if what == "conv":
        from netcl.ops import conv as C

        n, c, k, hw = (32, 128, 128, 56) if q.device.capabilities.kind == "gpu" else (8, 64, 64, 28)
        x = Tensor.from_host(q, rng.standard_normal((n, c, hw, hw)).astype(np.float32))
        w = Tensor.from_host(q, (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32))
        algo = os.environ.get("CONV_ALGO", "winograd")
        return lambda: C.conv2d(x, w, padding=1, algorithm=algo)
    from netcl.train.loop import build_model, train_step

    batch, shape = (256, (784,)) if what == "mlp" else (128, (1, 28, 28))
    model = build_model(what, q, (1, 28, 28), 10)
    opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    x = Tensor.from_host(q, rng.standard_normal((batch, 1, 28, 28)).astype(np.float32))
    y = Tensor.from_host(q, rng.integers(0, 10, batch).astype(np.int32))
    del shape

    return lambda: train_step(model, opt, x, y)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", default="cnn", choices=["cnn", "mlp", "conv"])
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    dev = manager.get("gpu" if args.gpu else "auto")
    q = dev.queue
    step = make_step(args.what, q)
    for _ in range(5):
        step()
    q.finish()
    profiling.reset()
    for _ in range(args.steps):
        step()
    q.finish()
    rows = profiling.table()
    total = sum(r[2] for r in rows)
    print(f"{dev.device_name}: {args.what}, device time per step {total / args.steps * 1e3:.3f} ms "
          f"(sum of kernel events), {sum(r[1] for r in rows) / args.steps:.1f} launches")
    print(f"{'kernel':40s} {'per step':>8s} {'us/step':>10s} {'us/call':>9s}")
    for name, calls, t, mean in rows:
        print(f"{name:40s} {calls / args.steps:8.1f} {t / args.steps * 1e6:10.1f} {mean * 1e6:9.1f}")

    # wall and host-only times, with the driver calls timed separately
    walls, hosts = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        hosts.append(time.perf_counter() - t0)
        q.finish()
        walls.append(time.perf_counter() - t0)
    inside = {"enqueue_nd_range_kernel": 0.0, "set_arg": 0.0, "set_args": 0.0, "enqueue_copy": 0.0,
              "Buffer": 0.0}
    counts = dict.fromkeys(inside, 0)
    real_enqueue, real_copy, real_buffer = cl.enqueue_nd_range_kernel, cl.enqueue_copy, cl.Buffer

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                inside[name] += time.perf_counter() - t0
                counts[name] += 1
        return wrapper

    cl.enqueue_nd_range_kernel = timed("enqueue_nd_range_kernel", real_enqueue)
    cl.enqueue_copy = timed("enqueue_copy", real_copy)
    real_set_args = backend.Kernel._set_args
    backend.Kernel._set_args = timed("set_args", real_set_args)
    try:
        for _ in range(args.steps):
            step()
            q.finish()
    finally:
        cl.enqueue_nd_range_kernel, cl.enqueue_copy, backend.Kernel._set_args = (
            real_enqueue,
            real_copy,
            real_set_args,
        )
    del real_buffer
    print(f"\nwall per step {statistics.median(walls) * 1e3:.3f} ms, "
          f"host enqueue {statistics.median(hosts) * 1e3:.3f} ms")
    for name in inside:
        if counts[name]:
            print(f"  inside {name:26s} {inside[name] / args.steps * 1e3:7.3f} ms/step over "
                  f"{counts[name] / args.steps:.1f} calls/step")
    pr = cProfile.Profile()
    for _ in range(args.steps):
        pr.enable()
        step()
        pr.disable()
        q.finish()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(25)
    st.sort_stats("cumulative").print_stats(35)
    print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
