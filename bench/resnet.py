"""ResNet-18 (CIFAR layout, 32x32 inputs) training step: forward, cross-entropy, backward, SGD with momentum,
netcl eager and recorded (netcl.graph) beside PyTorch eager and PyTorch with CUDA graphs on the same device
in one run. Table + JSON: ms/step, images/s, ratios; a per-kernel breakdown of netcl's recorded step
(netcl.profiling: device time, share, GB/s and GFLOP/s where the op declares its work); a check that
netcl's and PyTorch's first- and second-step losses agree on the same weights and batch.

    python bench/resnet.py                       # CPU (PoCL): batch 32, PyTorch CPU (same thread count)
    python bench/resnet.py --gpu                 # GPU: batches 128 and 256, PyTorch CUDA (cudnn.benchmark on,
    TF32 off)
    python bench/resnet.py --gpu --batches 128 --steps 10 --skip torch-graph --out bench/results/resnet.json
    python bench/resnet.py --gpu --amp bfloat16   # netcl's --amp step (netcl.train.loop.MixedPrecision)
                                                  # beside torch.autocast (float16: both with a GradScaler)

Work per step: 0.56 GFLOP of forward multiply-adds per image x 2 x 3 (forward + both gradients) ~ 3.3
GFLOP per image; at batch 128 ~ 0.43 TFLOP, ~8.4 ms at the H200's ~51 TFLOP/s FP32 peak (cuBLAS SGEMM).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netcl import optim, profiling  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.graph import Graph  # noqa: E402
from netcl.nn.resnet import resnet18  # noqa: E402
from netcl.ops import random  # noqa: E402
from netcl.train.loop import MixedPrecision, train_step  # noqa: E402

LR, MOMENTUM, WEIGHT_DECAY, CLASSES = 0.05, 0.9, 5e-4, 10


def forward_macs_per_image() -> int:
    """Multiply-adds of one ResNet-18 CIFAR forward pass (convolutions and the linear layer)."""
    macs, hw, c = 3 * 64 * 9 * 32 * 32, 32, 64
    for i, width in enumerate((64, 128, 256, 512)):
        for j in range(2):
            stride = 2 if i > 0 and j == 0 else 1
            hw_out = hw // stride
            macs += c * width * 9 * hw_out * hw_out + width * width * 9 * hw_out * hw_out
            if stride != 1 or c != width:
                macs += c * width * hw_out * hw_out
            c, hw = width, hw_out
    return macs + 512 * CLASSES


def timed(fn, finish, steps: int, warmup: int) -> float:
    """Median seconds of fn() + finish() over `steps` after `warmup` calls."""
    for _ in range(warmup):
        fn()
    finish()
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        finish()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def batch_data(batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(batch)
    return rng.standard_normal((batch, 3, 32, 32)).astype(np.float32), rng.integers(0, CLASSES, batch).astype(
        np.int32
    )


# -- netcl ---------------------------------------------------------------------------------------------
def netcl_run(q, batch: int, steps: int, warmup: int, profile_steps: int, amp: str | None = None) -> dict:
    random.manual_seed(0)
    model = resnet18(q, CLASSES)
    opt = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    mixed = MixedPrecision.make(amp) if amp else None   # what `netcl train --amp` runs
    xh, yh = batch_data(batch)
    x, y = Tensor.from_host(q, xh), Tensor.from_host(q, yh)
    state = {k: v.to_host().copy() for k, v in model.state_dict().items()}  # before any step: the torch check
    first_loss = float(train_step(model, opt, x, y, mixed=mixed).to_host()[0])
    # after one update: a wrong backward shows here, not in the first loss
    second_loss = float(train_step(model, opt, x, y, mixed=mixed).to_host()[0])
    eager = timed(lambda: train_step(model, opt, x, y, mixed=mixed), q.finish, steps, warmup)
    host = []
    for _ in range(3):  # host time to enqueue one eager step on an idle queue
        t0 = time.perf_counter()
        train_step(model, opt, x, y, mixed=mixed)
        host.append(time.perf_counter() - t0)
        q.finish()
    graph = Graph()
    with graph.capture():
        train_step(model, opt, x, y, mixed=mixed)
    replay = timed(graph.replay, q.finish, steps, warmup)
    with profiling.profile() as prof:
        for _ in range(profile_steps):
            graph.replay()
        q.finish()
    rows = prof.rows("kernel")
    kernels = [{"kernel": r.name, "calls_per_step": r.calls / profile_steps,
                "us_per_step": r.total / profile_steps * 1e6, "us_per_call": r.mean * 1e6, "share": r.share,
                "gflops": r.gflops, "gbps": r.gbps} for r in rows]
    return {
        "eager_ms": eager * 1e3,
        "graph_ms": replay * 1e3,
        "host_enqueue_ms": statistics.median(host) * 1e3,
        "device_ms_per_step": prof.device_seconds / profile_steps * 1e3,
        "first_loss": first_loss,
        "second_loss": second_loss,
        "kernels": kernels,
        "_state": state,
    }


# -- PyTorch -------------------------------------------------------------------------------------------
def torch_model(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            c = 64
            for i, w in enumerate((64, 128, 256, 512)):
                setattr(self, f"layer{i + 1}", nn.Sequential(Block(c, w, 2 if i else 1), Block(w, w, 1)))
                c = w
            self.fc = nn.Linear(512, CLASSES)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return Net()


def torch_run(
    batch: int, gpu: bool, steps: int, warmup: int, state: dict, threads: int, graphs: bool,
    amp: str | None = None,
) -> dict:
    import torch  # noqa: PLC0415  (a peer, imported only when measured)

    dev = "cuda" if gpu else "cpu"
    if gpu and not torch.cuda.is_available():
        raise RuntimeError("torch.cuda is not available")
    if not gpu:
        torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    model = torch_model(torch).to(dev)
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(v) for k, v in state.items()}, strict=False
    )
    if unexpected or any(not k.endswith("num_batches_tracked") for k in missing):
        raise RuntimeError(f"state_dict mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    xh, yh = batch_data(batch)
    x, y = torch.from_numpy(xh).to(dev), torch.from_numpy(yh).long().to(dev)
    finish = torch.cuda.synchronize if gpu else (lambda: None)

    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(amp or "")
    scaler = torch.amp.GradScaler(dev) if amp == "float16" else None

    def step():
        with torch.autocast(dev, dtype=dtype, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=False)
        return loss

    first_loss = float(step().item())
    second_loss = float(step().item())
    out = {"device": torch.cuda.get_device_name() if gpu else f"cpu, {torch.get_num_threads()} threads",
           "first_loss": first_loss, "second_loss": second_loss,
           "eager_ms": timed(step, finish, steps, warmup) * 1e3}
    if gpu and graphs:  # the whole step captured once (PyTorch's "whole network capture" recipe)
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            out["graph_ms"] = timed(g.replay, finish, steps, warmup) * 1e3
        except Exception as exc:  # the eager figures stand without it
            out["graph_note"] = f"CUDA graph unavailable: {type(exc).__name__}: {exc}"[:160]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="netcl on the OpenCL GPU, PyTorch on CUDA")
    ap.add_argument("--device", default=None, help="netcl device spec (default: gpu with --gpu, else auto)")
    ap.add_argument("--batches", default=None, help="comma list (default: 128,256 with --gpu, else 32)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: 20 GPU, 3 CPU)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default: 3 GPU, 1 CPU)")
    ap.add_argument(
        "--profile-steps", type=int, default=None, help="replays profiled (default: 5 GPU, 1 CPU)"
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="PyTorch CPU threads")
    ap.add_argument("--skip", default="", help="comma list of peers to skip: torch, torch-graph")
    ap.add_argument("--top", type=int, default=12, help="kernels in the printed breakdown")
    ap.add_argument("--amp", choices=("float16", "bfloat16"), default=None,
                    help="mixed precision on both sides: netcl's --amp step, torch.autocast (float16 with "
                         "a GradScaler each)")
    ap.add_argument("--no-step-memo", action="store_true",
                    help="every optimizer step through its full path (netcl.optim.optimizer.STEP_MEMO off)")
    ap.add_argument("--no-op-templates", action="store_true",
                    help="run every op's Python each call (netcl.core.template.ENABLED off)")
    ap.add_argument("--out", default="bench/results/resnet.json")
    args = ap.parse_args()
    if args.no_op_templates:
        from netcl.core import template

        template.ENABLED = False
    if args.no_step_memo:
        from netcl.optim import optimizer

        optimizer.STEP_MEMO = False
    steps = args.steps or (20 if args.gpu else 3)
    warmup = args.warmup if args.warmup is not None else (3 if args.gpu else 1)
    profile_steps = args.profile_steps or (5 if args.gpu else 1)
    batches = [int(b) for b in (args.batches or ("128,256" if args.gpu else "32")).split(",")]
    skip = set(filter(None, args.skip.split(",")))
    dev = manager.get(args.device or ("gpu" if args.gpu else "auto"))
    q = dev.queue
    gflop_image = 3 * 2 * forward_macs_per_image() / 1e9
    rows = []
    for batch in batches:
        entry: dict = {"batch": batch, "step_gflop": gflop_image * batch}
        nc = netcl_run(q, batch, steps, warmup, profile_steps, args.amp)
        state = nc.pop("_state")
        entry["netcl"] = {"device": dev.device_name, **nc}
        if "torch" not in skip:
            try:
                entry["pytorch"] = torch_run(batch, args.gpu, steps, warmup, state, args.threads,
                                             "torch-graph" not in skip, args.amp)
            except Exception as exc:  # a missing peer is reported, not fatal
                entry["pytorch"] = {"note": f"unavailable: {type(exc).__name__}: {exc}"[:160]}
        rows.append(entry)

    precision = f"autocast {args.amp} (both)" if args.amp else "float32"
    print(f"ResNet-18 CIFAR training step (forward + cross-entropy + backward + SGD momentum), {precision}, "
          f"median of {steps} after {warmup} warm-up")
    print(f"netcl device: {dev.describe()}; host: {platform.processor() or platform.machine()}")
    print(f"{'batch':>5}  {'impl':<22}{'ms/step':>9}{'img/s':>9}{'TFLOP/s':>9}{'x torch eager':>15}")
    for e in rows:
        pt = e.get("pytorch", {})
        ref = pt.get("eager_ms")
        lines = [("netcl eager", e["netcl"]["eager_ms"]), ("netcl graph", e["netcl"]["graph_ms"]),
                 ("pytorch eager", ref), ("pytorch cuda graph", pt.get("graph_ms"))]
        for name, ms in lines:
            if ms is None:
                continue
            ratio = f"{ref / ms:.2f}x" if ref else ""
            print(f"{e['batch']:>5}  {name:<22}{ms:>9.2f}{e['batch'] / ms * 1e3:>9.0f}"
                  f"{e['step_gflop'] / ms:>9.2f}{ratio:>15}")
        for key in ("note", "graph_note"):
            if key in pt:
                print(f"       pytorch: {pt[key]}")
        nc = e["netcl"]
        if "first_loss" in pt:
            print(f"       first-step loss on the same weights and batch: netcl {nc['first_loss']:.5f}, "
                  f"pytorch {pt['first_loss']:.5f}; second step (after one update) netcl "
                  f"{nc['second_loss']:.5f}, pytorch {pt['second_loss']:.5f}")
        print(
            f"       step = {e['step_gflop']:.1f} GFLOP; netcl host enqueue (eager) "
            f"{nc['host_enqueue_ms']:.2f} ms; "
            f"device time of a replayed step {nc['device_ms_per_step']:.2f} ms"
        )
        print(
            f"       {'kernel':<36}{'calls':>6}{'us/step':>10}{'us/call':>9}{'share':>7}"
            f"{'GFLOP/s':>9}{'GB/s':>8}"
        )
        for k in nc["kernels"][:args.top]:
            gf = f"{k['gflops']:.0f}" if k["gflops"] else ""
            gb = f"{k['gbps']:.0f}" if k["gbps"] else ""
            print(f"       {k['kernel'][:35]:<36}{k['calls_per_step']:>6.0f}{k['us_per_step']:>10.0f}"
                  f"{k['us_per_call']:>9.1f}{k['share'] * 100:>6.1f}%{gf:>9}{gb:>8}")
    print("x torch eager: PyTorch eager's ms/step over the row's (above 1: faster than PyTorch eager)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": steps, "warmup": warmup, "gpu": args.gpu, "device": dev.describe(),
                               "amp": args.amp, "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
