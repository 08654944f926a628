"""Host<->device bandwidth (pageable vs pinned vs netcl's staged path) and program-build time
(cold compile vs binary from the disk cache vs the in-memory cache). Table + JSON.

    python bench/transfer.py [--sizes-mb 1,16,256] [--repeat 10] [--out bench/results/transfer.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from netcl.core.backend import enqueue_copy
from netcl.core.device import manager
from netcl.core.memory import pinned_empty
from netcl.core.tensor import Tensor


def median_seconds(fn, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bandwidth_rows(dev, sizes_mb, repeat):
    q = dev.queue
    rows = []
    for mb in sizes_mb:
        n = mb * (1 << 20) // 4
        nbytes = n * 4
        pageable = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        pinned = pinned_empty(q, (n,), np.float32)
        pinned[...] = pageable
        out_pageable = np.empty_like(pageable)
        t = Tensor.empty(q, (n,))
        t2 = Tensor.empty(q, (n,))
        buf = t.buffer

        def h2d(src):
            return lambda: (enqueue_copy(q, buf, src, is_blocking=False), q.finish())

        def d2h(dst):
            return lambda: enqueue_copy(q, dst, buf, is_blocking=True)

        cases = {
            "h2d pageable": h2d(pageable),
            "h2d pinned": h2d(pinned),
            "h2d netcl from_host (staged)": lambda: (t._write_contiguous(pageable, pinned=True), q.finish()),
            "h2d netcl from_host (pinned src)": lambda: (
                t._write_contiguous(pinned, pinned=True),
                q.finish(),
            ),
            "d2h pageable": d2h(out_pageable),
            "d2h pinned": d2h(pinned),
            "d2h netcl to_host": lambda: t.to_host(),
            "d2h netcl to_host(out=pinned)": lambda: t.to_host(out=pinned),
            "d2d copy (read+write)": lambda: (enqueue_copy(q, t2.buffer, buf, byte_count=nbytes), q.finish()),
        }
        for name, fn in cases.items():
            sec = median_seconds(fn, repeat)
            moved = 2 * nbytes if name.startswith("d2d") else nbytes
            rows.append({"case": name, "mb": mb, "seconds": sec, "gb_per_s": moved / sec / 1e9})
    return rows


_BUILD_SCRIPT = r"""
import sys, time, json
t0 = time.perf_counter()
from netcl.core.device import manager
from netcl.core.backend import build_program, format_options, build_stats
from netcl.kernels import dtype_defines, source as kernel_source
dev = manager.default()
src = kernel_source("random.cl") + "\n// " + sys.argv[1] + "\n"
opts = format_options({**dtype_defines("float32"), "KIND": 1, "PER_ITEM": 4, "SCALAR": "float"})
t1 = time.perf_counter()
build_program(dev, src, opts)
t2 = time.perf_counter()
build_program(dev, src, opts)
t3 = time.perf_counter()
print(json.dumps({"build": t2 - t1, "memory": t3 - t2, "kinds": build_stats.counts}))
"""


def build_rows():
    nonce = uuid.uuid4().hex  # a source no driver-side cache has seen
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NETCL_CACHE_DIR": cache, "POCL_KERNEL_CACHE": "0"}
        runs = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", _BUILD_SCRIPT, nonce], capture_output=True, text=True,
                                 env=env, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    return [
        {
            "case": "program build, cold (compile from source)",
            "seconds": cold["build"],
            "kinds": cold["kinds"],
        },
        {
            "case": "program build, second process (disk binary)",
            "seconds": warm["build"],
            "kinds": warm["kinds"],
        },
        {"case": "program build, same process (memory cache)", "seconds": cold["memory"]},
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", default="1,16,256")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", default="bench/results/transfer.json")
    args = ap.parse_args()
    dev = manager.default()
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    print(f"device: {dev.device_name} ({dev.backend})")
    bw = bandwidth_rows(dev, sizes, args.repeat)
    print(f"\n{'transfer':<32} {'MiB':>6} {'median ms':>10} {'GB/s':>8}")
    for r in bw:
        print(f"{r['case']:<32} {r['mb']:>6} {r['seconds'] * 1e3:>10.3f} {r['gb_per_s']:>8.2f}")
    builds = build_rows()
    print(f"\n{'program build':<46} {'seconds':>9}")
    for r in builds:
        print(f"{r['case']:<46} {r['seconds']:>9.4f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": dev.device_name, "backend": dev.backend,
                                          "bandwidth": bw, "build": builds}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
