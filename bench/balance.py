"""Throughput-balanced data parallelism over mismatched devices: the samples/s of one job of N ranks against
the sum of the ranks' samples/s each alone, with equal shares (--balance off) and balanced (--balance on).
Table + JSON.

    python bench/balance.py                                # CPU: two ranks on one device, rank 1 slowed 3x
    python bench/balance.py --devices 0:0,1:0 --delays-ms 0,0 --width 2048 --layers 4 --global-batch 1024
                                                           # the GPU machine: the GPU beside PoCL's CPU device

    python bench/balance.py --delays-ms 1,100 --runs floor,on --alone-steps 3 --alone-warmup 2
                                                           # CPU: rank 1 100x slower, left out or not

A slowed rank (--delays-ms, one per rank) is a test-only hook of this script: its forward sleeps that many
milliseconds per sample it holds, on top of the real MLP, so on a shared CPU two ranks can differ by a known
factor without fighting over the cores. Alone, each rank trains on the whole global batch with its own
delay; in the job, the ranks split it (netcl.distributed.Balancer) and DDP weights the gradients by share.
The job runs (--runs): `off` equal shares, `floor` balanced with one sample a rank at least (the Balancer
without the optimizer), `on` balanced, a rank worth less than it costs left out (the default Balancer).
Step times are medians over --steps steps after --warmup steps (long enough for the shares to settle).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def worker(args: argparse.Namespace) -> None:
    import netcl.autograd as ag
    import netcl.distributed as dist
    from netcl import nn, optim
    from netcl.core.device import manager
    from netcl.core.tensor import Tensor

    distributed = args.worker != "alone"
    if distributed:
        dist.init()
    rank = dist.rank() if distributed else args.alone_rank
    delay = [float(d) / 1e3 for d in args.delays_ms.split(",")][rank]
    q = manager.default("auto").queue

    class Throttled(nn.Module):
        def __init__(self, inner: nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            if delay:
                time.sleep(delay * x.shape[0])
            return self.inner(x)

    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(q, args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(q, args.width, 10))
    step_model = Throttled(model)
    balancer = None
    if distributed:
        step_model = dist.DistributedDataParallel(step_model)
    opt = optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if distributed:
        balancer = dist.Balancer(step_model, args.global_batch, mode="on" if args.worker == "floor" else
                                 args.worker, optimizer=None if args.worker == "floor" else opt,
                                 log=(lambda line: print(line, file=sys.stderr, flush=True)) if rank == 0
                                 else None)
    rng = np.random.default_rng(0)
    x = Tensor.from_host(q, rng.standard_normal((args.global_batch, args.width)).astype(np.float32))
    y = Tensor.from_host(q, rng.integers(0, 10, args.global_batch).astype(np.int32))

    def step() -> None:
        part = balancer.split((x, y)) if balancer is not None else (x, y)
        if part is not None:  # None: this rank is left out
            with ag.Tape() as tape:
                loss = ag.cross_entropy(step_model(ag.tensor(part[0])), ag.tensor(part[1]))
            tape.backward(loss)
            opt.step()
            opt.zero_grad()
        q.finish()
        if balancer is not None:
            balancer.step()

    alone = not distributed
    for _ in range(args.alone_warmup if alone and args.alone_warmup is not None else args.warmup):
        step()
    times = []
    for _ in range(args.alone_steps if alone and args.alone_steps is not None else args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if rank == 0 or not distributed:
        print("RESULT " + json.dumps({
            "step_s": statistics.median(times), "device": q.device.describe(),
            "shares": balancer.shares if balancer is not None else [args.global_batch],
            "changes": len(balancer.changes) if balancer is not None else 0,
            "left_out": balancer.left_out_at if balancer is not None else [],
        }), flush=True)
    if balancer is not None:
        balancer.synchronize()  # every rank ends with the same weights (a collective: all ranks call it)


def run(mode: str, args: argparse.Namespace, alone_rank: int = 0) -> dict:
    flags = ["--worker", mode, "--width", str(args.width), "--layers", str(args.layers), "--global-batch",
             str(args.global_batch), "--steps", str(args.steps), "--warmup", str(args.warmup), "--delays-ms",
             args.delays_ms, "--alone-rank", str(alone_rank)]
    for name in ("alone_steps", "alone_warmup"):
        if getattr(args, name) is not None:
            flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    script = str(Path(__file__).resolve())
    nproc = len(args.delays_ms.split(","))
    if mode == "alone":
        cmd = [sys.executable, script, *flags]
        if args.devices:
            env["NETCL_DEVICE"] = args.devices.split(",")[alone_rank]
    else:
        cmd = [sys.executable, "-m", "netcl.cli", "run", "--nproc", str(nproc)]
        cmd += ["--devices", args.devices] if args.devices else []
        cmd += [script, *flags]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stderr.splitlines():
        if line.startswith("balance:"):
            print(f"  [{mode}] {line}", flush=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{mode} run failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default=None, help="netcl run --devices, one per rank (default: the default "
                    "device for every rank)")
    ap.add_argument("--delays-ms", default="1,3", help="per rank: ms of sleep per sample in its forward")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--alone-steps", type=int, default=None, help="steps timed alone (default --steps)")
    ap.add_argument("--alone-warmup", type=int, default=None, help="warm-up steps alone (default --warmup)")
    ap.add_argument("--runs", default="off,on", help="the job runs, in order: off (equal shares), floor "
                    "(balanced, one sample a rank at least), on (balanced, ranks worth less left out)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--alone-rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    nproc = len(args.delays_ms.split(","))
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    names = {"off": "job, equal shares", "floor": "job, balanced, floor 1", "on": "job, balanced"}
    unknown = [r for r in runs if r not in names]
    if unknown or not runs:
        raise SystemExit(f"--runs {args.runs}: expected some of off, floor, on")
    alone = [run("alone", args, r) for r in range(nproc)]
    jobs = [(names[r], run(r, args)) for r in runs]
    rates = [args.global_batch / a["step_s"] for a in alone]
    total = sum(rates)
    print(f"global batch {args.global_batch}, MLP {args.layers} x {args.width}, delays ms/sample "
          f"{args.delays_ms}; samples/s, medians of {args.steps} steps after {args.warmup}")
    print(f"{'run':<24} {'step ms':>8} {'samples/s':>10} {'/ sum alone':>12} {'/ fastest':>10}  shares")
    for r, (a, rate) in enumerate(zip(alone, rates)):
        print(f"{f'rank {r} alone':<24} {a['step_s'] * 1e3:>8.1f} {rate:>10.0f} {'':>12} {'':>10}  "
              f"{a['device']}")
    fastest = max(rates)
    result = {"alone": alone, "alone_samples_per_s": rates, "sum_alone": total, "fastest_alone": fastest}
    for name, res in jobs:
        rate = args.global_batch / res["step_s"]
        print(f"{name:<24} {res['step_s'] * 1e3:>8.1f} {rate:>10.0f} {rate / total:>12.2f} "
              f"{rate / fastest:>10.2f}  {res['shares']}")
        result[name] = {**res, "samples_per_s": rate, "ratio": rate / total, "to_fastest": rate / fastest}
    out = Path(args.out or ROOT / "bench/results" / "balance.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "args": vars(args)}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
