"""DistributedDataParallel scaling: the step throughput of N processes (one device each) over N x one process,
on an MLP stack with many parameters (the all-reduce is a large share of a step: the hard case for DDP).
Table + JSON.

    python bench/ddp_scaling.py [--nproc 2] [--width 512 --layers 4 --batch 64 --steps 20]   (CPU: a smoke
    figure)
    python bench/ddp_scaling.py --gpu [--devices 0:0,0:1]     (width 4096, 8 layers: 134M parameters, 537 MB
    of
                                                               gradients per step, batch 512 per GPU)

Each rank trains on its own batch of the same size (weak scaling, as DDP is used); efficiency = N-process
samples/s over N x the one-process samples/s. The one-process run has the same model and batch, no DDP.
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

    distributed = args.worker == "ddp"
    if distributed:
        dist.init()
    q = manager.default("auto").queue
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(q, args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(q, args.width, 10))
    step_model = dist.DistributedDataParallel(model) if distributed else model
    opt = optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    rng = np.random.default_rng(dist.rank())
    x = Tensor.from_host(q, rng.standard_normal((args.batch, args.width)).astype(np.float32))
    y = Tensor.from_host(q, rng.integers(0, 10, args.batch).astype(np.int32))

    def step() -> None:
        with ag.Tape() as tape:
            loss = ag.cross_entropy(step_model(ag.tensor(x)), ag.tensor(y))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        step()
    q.finish()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        q.finish()
        times.append(time.perf_counter() - t0)
    if dist.rank() == 0:
        params = sum(p.size for p in model.parameters())
        print("RESULT " + json.dumps({"step_s": statistics.median(times), "params": params,
                                      "device": q.device.device_name}), flush=True)


def run(mode: str, args: argparse.Namespace, nproc: int) -> dict:
    flags = [
        "--worker",
        mode,
        "--width",
        str(args.width),
        "--layers",
        str(args.layers),
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    script = str(Path(__file__).resolve())
    if mode == "ddp":
        cmd = [sys.executable, "-m", "netcl.cli", "run", "--nproc", str(nproc)]
        cmd += ["--devices", args.devices] if args.devices else []
        cmd += [script, *flags]
    else:
        cmd = [sys.executable, script, *flags]
        if args.devices:
            env["NETCL_DEVICE"] = args.devices.split(",")[0]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{mode} run failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--devices", default=None, help="netcl run --devices (with --gpu default 0:0,0:1)")
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.gpu and args.devices is None:
        args.devices = ",".join(f"0:{i}" for i in range(args.nproc))
    args.width = args.width or (4096 if args.gpu else 512)
    args.layers = args.layers or (8 if args.gpu else 4)
    args.batch = args.batch or (512 if args.gpu else 64)
    one = run("single", args, 1)
    many = run("ddp", args, args.nproc)
    rate1 = args.batch / one["step_s"]
    rate_n = args.batch * args.nproc / many["step_s"]
    eff = rate_n / (args.nproc * rate1)
    grad_mb = one["params"] * 4 / 2**20
    print(
        f"{'processes':>9} {'step ms':>8} {'samples/s':>10} "
        f"{'efficiency':>10}   model: {one['params']:,} parameters "
        f"({grad_mb:.0f} MiB of gradients per step), batch {args.batch} per process, {one['device']}"
    )
    print(f"{1:>9} {one['step_s'] * 1e3:>8.1f} {rate1:>10.0f} {'':>10}")
    print(f"{args.nproc:>9} {many['step_s'] * 1e3:>8.1f} {rate_n:>10.0f} {eff:>10.2f}")
    print(
        f"gradient all-reduce: {grad_mb:.0f} MiB per step; at "
        f"the step time of {args.nproc} processes that is "
        f"{grad_mb * 2**20 / 1e9 / many['step_s']:.2f} GB/s of gradients reduced"
    )
    out = Path(
        args.out or ROOT / "bench/results" / ("ddp_scaling_gpu.json" if args.gpu else "ddp_scaling.json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"single": one, "ddp": many, "nproc": args.nproc, "efficiency": eff,
                               "width": args.width, "layers": args.layers, "batch": args.batch}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
