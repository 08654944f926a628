"""3x3 convolution forward: netcl im2col+GEMM vs Winograd F(2x2,3x3) vs direct, beside PyTorch,
tinygrad and NumPy on the same device in one run; then both gradients per algorithm beside PyTorch's
convolution_backward. Table + JSON, GFLOP/s and ratios.

    python bench/conv.py                    # CPU (PoCL) default size N=8, C=K=64, 28x28
    python bench/conv.py --gpu              # GPU size N=32, C=K=128, 56x56; PyTorch on CUDA (no TF32)
    python bench/conv.py --n 16 --c 96 --k 96 --hw 40 --repeat 20 --out bench/results/conv.json
    python bench/conv.py --tune             # also store the fastest netcl algorithm of each pass in the
    tuning DB
    python bench/conv.py --gpu --n 128 --c 64 --k 64 --hw 32    # ResNet-18 CIFAR's first stage at batch 128
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.ops import conv as C  # noqa: E402
from netcl.ops import pool as P  # noqa: E402
from netcl.tune.tuner import time_callable  # noqa: E402


def median_seconds(fn, finish, repeat: int, warmup: int = 2) -> float:
    """Median seconds of fn() + finish() after warm-up (netcl.tune's timer)."""
    return time_callable(fn, finish, repeat, warmup)


def numpy_conv(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))  # N C OH OW KH KW
    return np.einsum("ncpqhw,kchw->nkpq", win, w, optimize=True)


TINYGRAD_CHILD = """
import json, statistics, tempfile, time
import numpy as np
from tinygrad import Device, Tensor
rng = np.random.default_rng(0)
x = rng.standard_normal(({n}, {c}, {hw}, {hw})).astype(np.float32)
w = (rng.standard_normal(({k}, {c}, 3, 3)) / np.sqrt(9 * {c})).astype(np.float32)
b = rng.standard_normal({k}).astype(np.float32)
dev = Device.DEFAULT
gx, gw, gb = (Tensor(a, device=dev).realize() for a in (x, w, b))
fn = lambda: gx.conv2d(gw, gb, padding=1).realize()
for _ in range(3): fn()
Device[dev].synchronize()
ts = []
for _ in range({repeat}):
    t0 = time.perf_counter(); fn(); Device[dev].synchronize(); ts.append(time.perf_counter() - t0)
path = tempfile.mktemp(suffix=".npy")
np.save(path, fn().numpy())
print(json.dumps({{"device": dev, "seconds": statistics.median(ts), "path": path}}))
"""


def backward_rows(args, dev, q, x, w, repeat: int, skip: set) -> list[dict]:
    """grad_weight and grad_input of the same convolution (GEMM path vs the direct gather kernels vs
    PyTorch's convolution_backward), and max_pool2d 2x2's backward (plane scatter vs gather)."""
    rng = np.random.default_rng(1)
    n, k, hw = x.shape[0], w.shape[0], x.shape[2]
    gy = rng.standard_normal((n, k, hw, hw)).astype(np.float32)
    xt, wt, gyt = Tensor.from_host(q, x), Tensor.from_host(q, w), Tensor.from_host(q, gy)
    flops = 2.0 * n * k * hw * hw * x.shape[1] * 9
    rows: list[dict] = []
    refs: dict = {}
    if "torch" not in skip:
        try:
            import torch

            tdev = "cuda" if args.gpu and torch.cuda.is_available() else "cpu"
            sync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)
            tx, tw_, tg = (torch.from_numpy(a).to(tdev) for a in (x, w, gy))
            for what, mask in (("grad_weight", [False, True, False]), ("grad_input", [True, False, False])):
                fn = lambda m=mask: torch.ops.aten.convolution_backward(  # noqa: E731
                    tg, tx, tw_, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, m)
                s = median_seconds(fn, sync, repeat)
                res = fn()
                refs[what] = (res[1] if what == "grad_weight" else res[0]).cpu().numpy().astype(np.float64)
                rows.append({"op": what, "impl": "pytorch", "ms": s * 1e3, "gflops": flops / s / 1e9})
        except Exception as exc:  # a missing peer is reported, not fatal
            rows.append(
                {"op": "conv backward", "impl": "pytorch", "ms": None, "note": f"unavailable: {exc}"[:160]}
            )
    # per pass: 'auto' (the default choice), then each algorithm; 'flipped' runs the flipped-kernel forward
    # convolution (Winograd where it pays), 'winograd' F(2x2, 3x3) run backwards
    passes = {"grad_weight": ("backward_weight", ("auto", "gemm", "winograd", "direct"),
                              lambda a: C.conv2d_backward_weight(xt, gyt, w.shape, padding=1, algorithm=a)),
              "grad_input": ("backward_input", ("auto", "gemm", "flipped", "direct"),
                             lambda a: C.conv2d_backward_input(gyt, wt, x.shape, padding=1, algorithm=a))}
    for what, (pass_, algos, call) in passes.items():
        timings = {}
        for algo in algos:
            fn = lambda a=algo, call=call: call(a)  # noqa: E731
            # the direct gather kernels are slow (seconds per call at the GPU size): few repeats
            s = median_seconds(fn, q.finish, min(repeat, 3) if algo == "direct" else repeat, warmup=1)
            if algo != "auto":
                timings[algo] = s
            row = {"op": what, "impl": f"netcl {algo}", "ms": s * 1e3, "gflops": flops / s / 1e9}
            if what in refs:
                ref = refs[what]
                row["max_rel_err"] = float(np.max(np.abs(fn().to_host() - ref)) / np.max(np.abs(ref)))
                peer = next(r["ms"] for r in rows if r["op"] == what and r["impl"] == "pytorch")
                row["vs_pytorch"] = peer / (s * 1e3)
            rows.append(row)
        if args.tune:
            best = min(timings, key=timings.get)
            C.record_algorithm(dev, x.shape, w.shape, np.float32, best, padding=1, pass_=pass_,
                               ms=timings[best] * 1e3)
    _, idx = P.max_pool2d(xt, 2)
    for algo in ("plane", "gather"):
        pooled = Tensor.from_host(q, rng.standard_normal(idx.shape).astype(np.float32))
        fn = lambda a=algo: P.max_pool2d_backward(pooled, idx, x.shape, 2, algorithm=a)  # noqa: E731
        s = median_seconds(fn, q.finish, repeat)
        rows.append({"op": "max_pool2d_backward 2x2", "impl": f"netcl {algo}", "ms": s * 1e3, "gflops": None})
    print(f"backward of the same convolution ({flops / 1e9:.2f} GFLOP each) and of max_pool2d 2x2 on x:")
    print(f"{'op':26s} {'impl':16s} {'ms':>9s} {'GFLOP/s':>9s} {'x pytorch':>9s} {'rel err':>9s}  note")
    for r in rows:
        print(f"{r['op']:26s} {r['impl']:16s} {r['ms'] if r['ms'] is not None else float('nan'):9.3f} "
              f"{r.get('gflops') or float('nan'):9.1f} {r.get('vs_pytorch', float('nan')):9.2f} "
              f"{r.get('max_rel_err', float('nan')):9.1e}  {r.get('note', '')}")
    print("x pytorch: PyTorch's time over netcl's (above 1: netcl faster); GFLOP/s: the direct convolution's "
          "FLOPs over time")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="run on the GPU (OpenCL) with the GPU problem size")
    ap.add_argument("--device", default=None, help="netcl device spec (default: gpu with --gpu, else auto)")
    ap.add_argument("--n", type=int)
    ap.add_argument("--c", type=int)
    ap.add_argument("--k", type=int)
    ap.add_argument("--hw", type=int)
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--out", default="bench/results/conv.json")
    ap.add_argument("--tune", action="store_true", help="record the fastest netcl algorithm in netcl.tune")
    ap.add_argument("--skip", default="", help="comma list of peers to skip: torch,tinygrad,numpy")
    args = ap.parse_args()

    n, c, k, hw = (32, 128, 128, 56) if args.gpu else (8, 64, 64, 28)
    n, c, k, hw = args.n or n, args.c or c, args.k or k, args.hw or hw
    repeat = args.repeat or (20 if args.gpu else 5)
    skip = set(filter(None, args.skip.split(",")))
    dev = manager.get(args.device or ("gpu" if args.gpu else "auto"))
    q = dev.queue
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    flops = 2.0 * n * k * hw * hw * c * 9
    nbytes = 4.0 * (x.size + w.size + n * k * hw * hw)
    xt, wt, bt = Tensor.from_host(q, x), Tensor.from_host(q, w), Tensor.from_host(q, b)

    rows: list[dict] = []
    ref = None

    def add(
        name: str, device: str, seconds: float | None, out: np.ndarray | None = None, note: str = ""
    ) -> None:
        nonlocal ref
        err = None
        if out is not None:
            if ref is None:
                ref = out.astype(np.float64)
            err = float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-30))
        rows.append({"impl": name, "device": device, "ms": None if seconds is None else seconds * 1e3,
                     "gflops": None if not seconds else flops / seconds / 1e9, "max_rel_err_vs_first": err,
                     "note": note})

    # peers first, so the first correct result (PyTorch) is the reference for the error column
    if "torch" not in skip:
        try:
            import torch

            tdev = "cuda" if args.gpu and torch.cuda.is_available() else "cpu"
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
            tx, tw_, tb = (torch.from_numpy(a).to(tdev) for a in (x, w, b))
            sync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)
            with torch.no_grad():
                fn = lambda: torch.nn.functional.conv2d(tx, tw_, tb, padding=1)  # noqa: E731
                s = median_seconds(fn, sync, repeat)
                out = fn().cpu().numpy()
            add(f"pytorch {torch.__version__}" + (" cudnn" if tdev == "cuda" else ""), tdev, s, out,
                "cudnn.allow_tf32=False" if tdev == "cuda" else f"{torch.get_num_threads()} threads")
        except Exception as exc:  # a missing peer is reported, not fatal
            add("pytorch", "-", None, note=f"unavailable: {type(exc).__name__}: {exc}"[:160])
    if "tinygrad" not in skip:
        # in a child process: a tinygrad backend that crashes (PoCL segfaults under its CL runtime here)
        # must not take the benchmark down with it
        code = TINYGRAD_CHILD.format(n=n, c=c, k=k, hw=hw, repeat=repeat)
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode == 0 and lines:
                res = json.loads(lines[-1])
                add("tinygrad", res["device"], res["seconds"], np.load(res["path"]))
            else:
                tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
                add("tinygrad", "-", None, note=f"unavailable: {tail}"[:160])
        except Exception as exc:
            add("tinygrad", "-", None, note=f"unavailable: {type(exc).__name__}: {exc}"[:160])
    if "numpy" not in skip and not args.gpu:
        s = median_seconds(lambda: numpy_conv(x, w, 1), lambda: None, max(1, repeat // 2), warmup=1)
        add("numpy einsum", "cpu", s, (numpy_conv(x, w, 1) + b[None, :, None, None]).astype(np.float32))

    timings = {}
    for algo in ("im2col", "winograd", "direct"):
        try:
            fn = lambda: C.conv2d(xt, wt, bt, padding=1, algorithm=algo)  # noqa: E731
            s = median_seconds(fn, q.finish, repeat)
            timings[algo] = s
            add(f"netcl {algo}", dev.device_name, s, fn().to_host())
        except Exception as exc:
            add(f"netcl {algo}", dev.device_name, None, note=f"failed: {type(exc).__name__}: {exc}"[:160])
    fn = lambda: C.conv2d(xt, wt, bt, padding=1, activation="relu")  # noqa: E731
    s = median_seconds(fn, q.finish, repeat)
    auto = C.select_algorithm(dev, C.ConvParams(x.shape, w.shape, 1, 1, 1, 1), np.float32)
    add(f"netcl auto+relu ({auto})", dev.device_name, s, note="fused bias+relu; error column n/a (relu)")
    rows[-1]["max_rel_err_vs_first"] = None

    if args.tune and timings:
        best = min(timings, key=timings.get)
        C.record_algorithm(dev, x.shape, w.shape, np.float32, best, padding=1, ms=timings[best] * 1e3)

    first = next((r for r in rows if r["gflops"]), None)
    print(f"conv2d 3x3 pad 1 forward, float32: N={n} C={c} K={k} H=W={hw}; {flops / 1e9:.2f} GFLOP, "
          f"{nbytes / 1e6:.1f} MB min traffic; netcl device: {dev.describe()}")
    print(f"{'impl':34s} {'device':28s} {'ms':>9s} {'GFLOP/s':>9s} "
          f"{'vs ' + (first['impl'][:14] if first else '-'):>18s}"
          f" {'rel err':>9s}  note")
    for r in rows:
        ratio = r["gflops"] / first["gflops"] if r["gflops"] and first else None
        r["ratio_vs_first"] = ratio
        print(f"{r['impl'][:34]:34s} {str(r['device'])[:28]:28s} "
              f"{r['ms'] if r['ms'] is not None else float('nan'):9.3f} "
              f"{r['gflops'] if r['gflops'] else float('nan'):9.1f} {ratio if ratio else float('nan'):18.3f} "
              f"{r['max_rel_err_vs_first'] if r['max_rel_err_vs_first'] is not None else float('nan'):9.1e}  "
              f"{r['note']}")
    if "winograd" in timings and "im2col" in timings:
        print(f"Winograd / im2col speed: {timings['im2col'] / timings['winograd']:.2f}x; "
              f"Winograd does 2.25x fewer multiplies than the {flops / 1e9:.2f} GFLOP counted here "
              "(GFLOP/s are 'effective', direct-convolution FLOPs over time)")
    caps = dev.capabilities
    print(
        f"limits: FLOPs/peak and bytes/bandwidth of the device; this device has {caps.compute_units} compute "
        f"units at {caps.max_clock_mhz} MHz; minimum traffic {nbytes / 1e6:.1f} MB "
        f"(at 100 GB/s: {nbytes / 1e8:.3f} ms), so the work is compute-bound"
    )
    backward = backward_rows(args, dev, q, x, w, repeat, skip)
    result = {"bench": "conv", "backward": backward,
              "shape": {"N": n, "C": c, "K": k, "H": hw, "W": hw, "kernel": 3, "padding": 1},
              "flops": flops, "min_bytes": nbytes, "netcl_device": dev.describe(), "gpu": args.gpu,
              "repeat": repeat, "host": platform.node(), "rows": rows}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
