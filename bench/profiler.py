"""What the profiler costs: the CNN training step of `netcl train` (batch 128) and tiny elementwise calls,
with netcl.profiling off and inside `with profile():`, in one process. The cost of the profiler when it is
off (one global read per launch and per Module call) is measured by running bench/elementwise.py --host and
bench/train_step.py on this checkout and on the commit before the profiler (see bench/NOTES.md).

    .venv/bin/python bench/profiler.py                 # CPU (PoCL); POCL_MAX_PTHREAD_COUNT=1 for host figures
    python bench/profiler.py --gpu                     # GPU (bash bench/gpu_run.sh 300 profiler)

Prints one table (median ms per step or us per call: wall and host-only, off and on, the ratio) and writes
bench/results/profiler.json (or --out). Also writes the trace of one profiled step (bench/results/
profiler_step.trace.json) and checks that the profile's device time does not exceed the step's wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from netcl import ops, optim, profiling  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.ops import random  # noqa: E402
from netcl.train.loop import GraphedStep, build_model, train_step  # noqa: E402


def timed(fn, finish, repeat: int, warmup: int = 3) -> tuple[float, float]:
    """(median wall seconds of fn() + finish(), median host seconds of fn() alone on an idle queue)."""
    for _ in range(warmup):
        fn()
    finish()
    walls, hosts = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        finish()
        walls.append(time.perf_counter() - t0)
        hosts.append(t1 - t0)
    return statistics.median(walls), statistics.median(hosts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="run on the GPU")
    ap.add_argument("--repeat", type=int, default=None, help="steps per figure (default 20 CPU, 100 GPU)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "profiler.json"))
    args = ap.parse_args()
    dev = manager.get("gpu") if args.gpu else manager.default("auto")
    q = dev.queue
    repeat = args.repeat or (100 if dev.capabilities.kind == "gpu" else 20)
    random.manual_seed(0)
    rng = np.random.default_rng(0)
    model = build_model("cnn", q, (1, 28, 28), 10)
    opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    x = Tensor.from_host(q, rng.standard_normal((128, 1, 28, 28)).astype(np.float32))
    y = Tensor.from_host(q, rng.integers(0, 10, 128).astype(np.int32))
    graphed = GraphedStep(model, opt)
    a = Tensor.from_host(q, rng.standard_normal(256).astype(np.float32))
    b = Tensor.from_host(q, rng.standard_normal(256).astype(np.float32))
    work = {
        "cnn step, eager (ms)": (lambda: train_step(model, opt, x, y), 1e3),
        "cnn step, graph replay (ms)": (lambda: graphed(x, y), 1e3),
        "add, 256 floats (us)": (lambda: (a + b).realize(), 1e6),
        "sum, 256 floats (us)": (lambda: ops.sum(a), 1e6),
    }
    rows = {}
    for name, (fn, scale) in work.items():
        off = timed(fn, q.finish, repeat)
        with profiling.profile() as prof:
            on = timed(fn, q.finish, repeat)
        events = len(prof.device_spans()) / (repeat + 3)
        rows[name] = {"wall_off": off[0] * scale, "wall_on": on[0] * scale, "host_off": off[1] * scale,
                      "host_on": on[1] * scale, "events_per_call": events}
    with profiling.profile() as prof:  # one step, synchronous, for the trace and the sanity check
        t0 = time.perf_counter()
        train_step(model, opt, x, y)
        q.finish()
        wall = time.perf_counter() - t0
    assert prof.device_seconds <= wall, (prof.device_seconds, wall)
    trace = prof.export_chrome_trace(Path(args.out).with_name("profiler_step.trace.json"))

    print(f"device: {dev.describe()}, median of {repeat}")
    print(f"{'work':30s} {'wall off':>9s} {'wall on':>9s} {'ratio':>6s} {'host off':>9s} {'host on':>9s} "
          f"{'ratio':>6s} {'events':>7s}")
    for name, r in rows.items():
        print(f"{name:30s} {r['wall_off']:9.3f} {r['wall_on']:9.3f} {r['wall_on'] / r['wall_off']:6.2f} "
              f"{r['host_off']:9.3f} {r['host_on']:9.3f} {r['host_on'] / r['host_off']:6.2f} "
              f"{r['events_per_call']:7.1f}")
    print(
        f"one profiled eager step: device time "
        f"{prof.device_seconds * 1e3:.3f} ms in {wall * 1e3:.3f} ms wall; "
        f"trace {trace}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "device": dev.describe(),
                "repeat": repeat,
                "rows": rows,
                "profiled_step": {"device_ms": prof.device_seconds * 1e3, "wall_ms": wall * 1e3},
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
