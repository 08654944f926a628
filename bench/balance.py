"""Throughput-balanced data parallelism over mismatched devices: the samples/s of one job of N ranks against
the sum of the ranks' samples/s each alone, with equal shares (--balance off) and balanced (--balance on).
Table + JSON.

    python bench/balance.py                                # CPU: two ranks on one device, rank 1 slowed 3x
    python bench/balance.py --devices 0:0,1:0 --delays-ms 0,0 --width 2048 --layers 4 --global-batch 1024
                                                           # the GPU machine: the GPU beside PoCL's CPU device

A slowed rank (--delays-ms, one per rank) is a test-only hook of this script: its forward sleeps that many
milliseconds per sample it holds, on top of the real MLP, so on a shared CPU two ranks can differ by a known
factor without fighting over the cores. Alone, each rank trains on the whole global batch with its own
delay; in the job, the ranks split it (netcl.distributed.Balancer) and DDP weights the gradients by share.
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
        balancer = dist.Balancer(step_model, args.global_batch, mode=args.worker)
    opt = optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    rng = np.random.default_rng(0)
    x = Tensor.from_host(q, rng.standard_normal((args.global_batch, args.width)).astype(np.float32))
    y = Tensor.from_host(q, rng.integers(0, 10, args.global_batch).astype(np.int32))

    def step() -> None:
        xb, yb = balancer.split((x, y)) if balancer is not None else (x, y)
        with ag.Tape() as tape:
            loss = ag.cross_entropy(step_model(ag.tensor(xb)), ag.tensor(yb))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
        q.finish()
        if balancer is not None:
            balancer.step()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if rank == 0 or not distributed:
        print("RESULT " + json.dumps({
            "step_s": statistics.median(times), "device": q.device.describe(),
            "shares": balancer.shares if balancer is not None else [args.global_batch],
            "changes": len(balancer.changes) if balancer is not None else 0,
        }), flush=True)


def run(mode: str, args: argparse.Namespace, alone_rank: int = 0) -> dict:
    flags = ["--worker", mode, "--width", str(args.width), "--layers", str(args.layers), "--global-batch",
             str(args.global_batch), "--steps", str(args.steps), "--warmup", str(args.warmup), "--delays-ms",
             args.delays_ms, "--alone-rank", str(alone_rank)]
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
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--alone-rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    nproc = len(args.delays_ms.split(","))
    alone = [run("alone", args, r) for r in range(nproc)]
    equal = run("off", args)
    balanced = run("on", args)
    rates = [args.global_batch / a["step_s"] for a in alone]
    total = sum(rates)
    print(f"global batch {args.global_batch}, MLP {args.layers} x {args.width}, delays ms/sample "
          f"{args.delays_ms}; samples/s, medians of {args.steps} steps after {args.warmup}")
    print(f"{'run':<22} {'step ms':>8} {'samples/s':>10} {'/ sum alone':>12}  shares")
    for r, (a, rate) in enumerate(zip(alone, rates)):
        print(f"{f'rank {r} alone':<22} {a['step_s'] * 1e3:>8.1f} {rate:>10.0f} {'':>12}  {a['device']}")
    result = {"alone": alone, "alone_samples_per_s": rates, "sum_alone": total}
    for name, res in (("job, equal shares", equal), ("job, balanced", balanced)):
        rate = args.global_batch / res["step_s"]
        print(f"{name:<22} {res['step_s'] * 1e3:>8.1f} {rate:>10.0f} {rate / total:>12.2f}  {res['shares']}")
        result[name] = {**res, "samples_per_s": rate, "ratio": rate / total}
    out = Path(args.out or ROOT / "bench/results" / "balance.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "args": vars(args)}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
