"""One training step (forward, cross-entropy, backward, AdamW) of the seed MLP (784-256-128-10, batch 256)
and the `netcl train` CNN (batch 128, 1x28x28), netcl beside PyTorch and tinygrad on the same device
class in one run. Table + JSON (steps/s, ms/step, ratios, GFLOP/s).

    python bench/train_step.py                 # CPU: netcl on PoCL, PyTorch CPU (2 threads), tinygrad
    python bench/train_step.py --gpu           # GPU: netcl via OpenCL, PyTorch CUDA eager, tinygrad
    python bench/train_step.py --models mlp --repeat 50 --out bench/results/train_step.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import netcl.autograd as ag  # noqa: E402
from netcl import optim  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.ops import random  # noqa: E402
from netcl.train.loop import build_model  # noqa: E402
from netcl.tune.tuner import time_callable  # noqa: E402

BATCH = {"mlp": 256, "cnn": 128}


def step_flops(model: str, batch: int) -> float:
    """Multiply-adds x 2 of forward, x 3 for forward + backward (input grads of layer 1 skipped: ~)."""
    if model == "mlp":
        macs = 784 * 256 + 256 * 128 + 128 * 10
    else:
        macs = 28 * 28 * 16 * 9 + 14 * 14 * 32 * 16 * 9 + 32 * 7 * 7 * 128 + 128 * 10
    return 3 * 2.0 * macs * batch


def median_seconds(fn, finish, repeat: int, warmup: int = 3) -> float:
    """Median seconds of fn() + finish() after warm-up (netcl.tune's timer)."""
    return time_callable(fn, finish, repeat, warmup)


def netcl_step(model_kind: str, q, repeat: int) -> tuple[float, int, float, float, float, float]:
    """(median seconds per eager step, kernel launches per step, median host seconds to enqueue an
    eager step, median seconds per step replayed from a netcl.graph.Graph, its host seconds, median
    seconds per call of the step decorated with netcl.graph.compile)."""
    random.manual_seed(0)
    if model_kind == "mlp":  # the seed's model, on flat inputs
        from netcl.nn import Linear, ReLU, Sequential

        model = Sequential(Linear(q, 784, 256), ReLU(), Linear(q, 256, 128), ReLU(), Linear(q, 128, 10))
        shape = (BATCH[model_kind], 784)
    else:
        model = build_model("cnn", q, (1, 28, 28), 10)
        shape = (BATCH[model_kind], 1, 28, 28)
    opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    rng = np.random.default_rng(0)
    x = Tensor.from_host(q, rng.standard_normal(shape).astype(np.float32))
    y = Tensor.from_host(q, rng.integers(0, 10, shape[0]).astype(np.int32))

    def user_step(xb: Tensor, yb: Tensor) -> None:
        with ag.Tape() as tape:
            loss = ag.cross_entropy(model(ag.tensor(xb)), ag.tensor(yb))
        tape.backward(loss)
        opt.step()
        opt.zero_grad()

    def step() -> None:
        user_step(x, y)

    seconds = median_seconds(step, q.finish, repeat)
    from netcl.profiling import count_launches

    with count_launches() as c:
        step()
    q.finish()
    def host_seconds(fn) -> float:
        host = []
        for _ in range(max(3, repeat // 2)):  # host time alone: enqueue one step on an idle queue
            t0 = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t0)
            q.finish()
        return statistics.median(host)

    host = host_seconds(step)
    from netcl.graph import Graph  # the same step recorded once, then replayed (see netcl/graph.py)

    graph = Graph()
    with graph.capture():
        step()
    graph_seconds = median_seconds(graph.replay, q.finish, repeat)
    # what a user's loop gets from one decorator: the inputs copied into the recording's own, a replay
    from netcl.graph import compile as ncompile

    compiled = ncompile(user_step)
    compiled_seconds = median_seconds(lambda: compiled(x, y), q.finish, repeat)
    return seconds, c.count, host, graph_seconds, host_seconds(graph.replay), compiled_seconds


def torch_step(model_kind: str, gpu: bool, repeat: int) -> tuple[float, str]:
    import torch

    dev = "cuda" if gpu and torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        torch.set_num_threads(2)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    nn = torch.nn
    if model_kind == "mlp":
        model = nn.Sequential(
            nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)
        )
        shape = (BATCH[model_kind], 784)
    else:
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )
        shape = (BATCH[model_kind], 1, 28, 28)
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    x = torch.randn(shape, device=dev)
    y = torch.randint(0, 10, (shape[0],), device=dev)

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    finish = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    label = dev if dev == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    return median_seconds(step, finish, repeat), label


TINYGRAD_CHILD = """
import json, statistics, time
import numpy as np
from tinygrad import Device, Tensor, TinyJit, nn
from tinygrad.nn.optim import AdamW
kind, batch, repeat = {kind!r}, {batch}, {repeat}
class MLP:
    def __init__(self):
        self.l1, self.l2, self.l3 = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)
    def __call__(self, x):
        return self.l3(self.l2(self.l1(x).relu()).relu())
class CNN:
    def __init__(self):
        self.c1, self.c2 = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.l1, self.l2 = nn.Linear(32 * 7 * 7, 128), nn.Linear(128, 10)
    def __call__(self, x):
        x = self.c1(x).relu().max_pool2d(2)
        x = self.c2(x).relu().max_pool2d(2)
        return self.l2(self.l1(x.flatten(1)).relu())
model = MLP() if kind == "mlp" else CNN()
opt = AdamW(nn.state.get_parameters(model), lr=1e-3, weight_decay=1e-4)
shape = (batch, 784) if kind == "mlp" else (batch, 1, 28, 28)
x = Tensor(np.random.randn(*shape).astype(np.float32)).realize()
y = Tensor(np.random.randint(0, 10, batch).astype(np.int32)).realize()
try:
    train_mode = Tensor.train()                     # tinygrad <= 0.10
except AttributeError:
    from tinygrad.helpers import Context             # later: a TRAINING context variable
    train_mode = Context(TRAINING=1)
@TinyJit
def step():
    with train_mode:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        opt.step()
    return loss.realize()
for _ in range(4): step()
Device[Device.DEFAULT].synchronize()
ts = []
for _ in range(repeat):
    t0 = time.perf_counter(); step(); Device[Device.DEFAULT].synchronize()  # noqa: E702
    ts.append(time.perf_counter() - t0)
print(json.dumps({{"device": Device.DEFAULT, "seconds": statistics.median(ts)}}))
"""


def tinygrad_step(model_kind: str, gpu: bool, repeat: int) -> tuple[float | None, str]:
    """tinygrad on its OpenCL backend (DEV=CL), in a child process so a crashing runtime cannot end the run.
    tinygrad loads the system's libOpenCL (ctypes) and takes the first platform's device, so on the
    CPU machine it needs `apt-get install ocl-icd-libopencl1 pocl-opencl-icd` (pyopencl's bundled ICD
    loader crashes when loaded that way) and netcl should run on the same platform for a fair
    comparison (that PoCL is then netcl's default CPU device too)."""
    import ctypes.util
    import os

    if not ctypes.util.find_library("OpenCL") and "OPENCL_PATH" not in os.environ:
        return None, "unavailable: no system libOpenCL (apt-get install ocl-icd-libopencl1 pocl-opencl-icd)"
    code = TINYGRAD_CHILD.format(kind=model_kind, batch=BATCH[model_kind], repeat=repeat)
    env = dict(os.environ, DEV="CL")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
        )
    except subprocess.TimeoutExpired:
        return None, "timed out"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        res = json.loads(lines[-1])
        return res["seconds"], res["device"]
    tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    if proc.returncode < 0:
        tail = f"crashed (signal {-proc.returncode}) in its OpenCL runtime"
    return None, f"unavailable: {tail}"[:140]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="netcl on the OpenCL GPU, PyTorch on CUDA")
    ap.add_argument("--device", default=None, help="netcl device spec (default: gpu with --gpu, else auto)")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--skip", default="", help="comma list of peers to skip: torch,tinygrad")
    ap.add_argument("--no-step-memo", action="store_true",
                    help="every optimizer step through its full path (netcl.optim.optimizer.STEP_MEMO off)")
    ap.add_argument("--no-op-templates", action="store_true",
                    help="run every op's Python each call (netcl.core.template.ENABLED off)")
    ap.add_argument("--out", default="bench/results/train_step.json")
    args = ap.parse_args()
    if args.no_op_templates:
        from netcl.core import template

        template.ENABLED = False
    if args.no_step_memo:
        from netcl.optim import optimizer

        optimizer.STEP_MEMO = False
    repeat = args.repeat or (50 if args.gpu else 10)
    skip = set(filter(None, args.skip.split(",")))
    dev = manager.get(args.device or ("gpu" if args.gpu else "auto"))
    q = dev.queue
    rows = []
    for kind in args.models.split(","):
        flops = step_flops(kind, BATCH[kind])
        entry: dict = {"model": kind, "batch": BATCH[kind], "step_gflop": flops / 1e9}
        t, launches, host, tg_, host_g, tc_ = netcl_step(kind, q, repeat)
        entry["netcl"] = {
            "device": dev.device_name,
            "ms": t * 1e3,
            "launches_per_step": launches,
            "host_enqueue_ms": host * 1e3,
            "steps_per_s": 1 / t,
            "gflops": flops / t / 1e9,
        }
        entry["netcl graph"] = {"device": dev.device_name, "ms": tg_ * 1e3, "host_enqueue_ms": host_g * 1e3,
                                "steps_per_s": 1 / tg_}
        entry["netcl compile"] = {"device": dev.device_name, "ms": tc_ * 1e3, "steps_per_s": 1 / tc_}
        if "torch" not in skip:
            try:
                tt, label = torch_step(kind, args.gpu, repeat)
                entry["pytorch"] = {"device": label, "ms": tt * 1e3, "steps_per_s": 1 / tt}
                entry["netcl_over_pytorch"] = t / tt
                entry["netcl_graph_over_pytorch"] = tg_ / tt
                entry["netcl_compile_over_pytorch"] = tc_ / tt
            except Exception as exc:  # a missing peer is reported, not fatal
                entry["pytorch"] = {"note": f"unavailable: {type(exc).__name__}: {exc}"[:140]}
        if "tinygrad" not in skip:
            tg, label = tinygrad_step(kind, args.gpu, repeat)
            entry["tinygrad"] = {
                "device": label,
                "ms": None if tg is None else tg * 1e3,
                "steps_per_s": None if tg is None else 1 / tg,
            }
            if tg:
                entry["netcl_over_tinygrad"] = t / tg
        rows.append(entry)

    print(f"training step (forward + cross-entropy + backward + AdamW), median of {repeat} after warm-up")
    print(f"netcl device: {dev.describe()}; host: {platform.processor() or platform.machine()}")
    print(f"{'model':<6}{'batch':>6}  {'impl':<14}{'device':<34}{'ms/step':>9}{'steps/s':>9}{'netcl/x':>9}")
    for e in rows:
        for impl in ("netcl", "netcl graph", "netcl compile", "pytorch", "tinygrad"):
            r = e.get(impl)
            if r is None:
                continue
            ms = r.get("ms")
            ratio = {"pytorch": e.get("netcl_over_pytorch"), "tinygrad": e.get("netcl_over_tinygrad"),
                     "netcl graph": e.get("netcl_graph_over_pytorch"),
                     "netcl compile": e.get("netcl_compile_over_pytorch")}.get(impl)
            print(
                f"{e['model']:<6}{e['batch']:>6}  "
                f"{impl:<14}{str(r.get('device', r.get('note', '-')))[:33]:<34}"
                f"{(f'{ms:.2f}' if ms else '-'):>9}{(f'{1e3 / ms:.1f}' if ms else '-'):>9}"
                f"{(f'{ratio:.2f}x' if ratio else ''):>9}"
            )
        print(
            f"      step = {e['step_gflop']:.3f} GFLOP; netcl reaches {e['netcl']['gflops']:.1f} GFLOP/s; "
            f"{e['netcl']['launches_per_step']} launches/step, host enqueue "
            f"{e['netcl']['host_enqueue_ms']:.2f} ms "
            f"(graph replay {e['netcl graph']['host_enqueue_ms']:.2f} ms)"
        )
    print(
        "netcl/x: netcl's eager step over the peer's; on the 'netcl graph' row, the replayed step over "
        "PyTorch's; 'netcl compile': the step decorated with netcl.graph.compile, inputs copied in each call"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"repeat": repeat, "gpu": args.gpu, "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
