"""Elementwise / reduction benchmark: netcl against the device's copy bandwidth, NumPy, PyTorch and
tinygrad, in one run.

CPU (PoCL):  .venv/bin/python bench/elementwise.py
GPU:         python bench/elementwise.py --gpu          (bash bench/gpu_run.sh 300 elementwise)
GPU sweep:   python bench/elementwise.py --gpu --sweep  (or NETCL_BENCH_SWEEP=1 bash bench/gpu_run.sh 300
elementwise)
             times netcl's launch knobs (NETCL_EW_*, NETCL_RED_*, NETCL_SOFTMAX_REG: see netcl/jit/runner.py
             and reduce.py) for add / chain / sum / softmax, each variant in a child process (a crashing
             variant cannot end the run), checks its answers, prints the best per workload.

Workloads (float32): large add (x + y), a 9-op chain (fused: one kernel; unfused: NETCL_FUSION=0,
one kernel per op), sum of a large vector, softmax over rows. Each is reported as achieved GB/s
(logical bytes: inputs read once + output written once, divided by the median time) beside the
device's own buffer->buffer copy bandwidth (enqueue_copy, 2 x bytes / time) measured in the same
run; the bound for all of them is memory bandwidth (FLOPs are a few per byte). Prints one table and
writes JSON to bench/results/elementwise.json (or --out).

Host cost only:  python bench/elementwise.py --host   (tiny tensors, so the device time is negligible:
             Python + driver enqueue time per call of add / (a * 2).relu() / the relu mask
             where(a > 0, b, 0) / 9-op chain (build + realize) / sum / softmax, best of 5 rounds of 300
             calls; on PoCL set POCL_MAX_PTHREAD_COUNT=1 so PoCL's worker threads do not compete with
             Python for the 2 cores). Writes
             bench/results/elementwise_host.json (or --out).
"""

from __future__ import annotations

import argparse
import glob
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

from netcl import ops  # noqa: E402
from netcl.core.backend import enqueue_copy  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402

TARGETS_GPU = {"add": 0.85, "chain_fused": 0.85, "sum": 0.80, "softmax": 0.70}


def chain(x, y, lib):
    """The same 9 elementwise ops for every library (`lib` supplies exp/tanh/abs/sqrt)."""
    t = x * 2.0
    t = t + y
    t = lib.exp(t * -0.5)
    t = t - 1.0
    t = lib.tanh(t)
    t = t * y
    t = lib.abs(t)
    return lib.sqrt(t)


def median_time(fn, sync, repeats: int, inner: int = 1) -> float:
    fn()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def sizes(gpu: bool) -> dict:
    if gpu:
        return {"n": 1 << 26, "rows": 16384, "cols": 4096, "repeats": 20, "inner": 5}
    return {"n": 1 << 24, "rows": 4096, "cols": 1024, "repeats": 7, "inner": 1}


def bytes_of(work: str, cfg: dict) -> int:
    n, rc = cfg["n"], cfg["rows"] * cfg["cols"]
    return {"add": 3 * n * 4, "chain_fused": 3 * n * 4, "chain_unfused": 3 * n * 4, "sum": n * 4,
            "softmax": 2 * rc * 4}[work]


# -- netcl --------------------------------------------------------------------------------------------
def bench_netcl(q, cfg) -> dict:
    rng = np.random.default_rng(0)
    n = cfg["n"]
    a = Tensor.from_host(q, rng.standard_normal(n, dtype=np.float32))
    b = Tensor.from_host(q, rng.standard_normal(n, dtype=np.float32))
    s = Tensor.from_host(q, rng.standard_normal((cfg["rows"], cfg["cols"]), dtype=np.float32))
    sync = q.finish
    out = {}
    out["add"] = median_time(lambda: (a + b).realize(), sync, cfg["repeats"], cfg["inner"])
    out["chain_fused"] = median_time(lambda: chain(a, b, ops).realize(), sync, cfg["repeats"], cfg["inner"])
    os.environ["NETCL_FUSION"] = "0"
    try:
        out["chain_unfused"] = median_time(
            lambda: chain(a, b, ops).realize(), sync, cfg["repeats"], cfg["inner"]
        )
    finally:
        del os.environ["NETCL_FUSION"]
    out["sum"] = median_time(lambda: ops.sum(a), sync, cfg["repeats"], cfg["inner"])
    out["softmax"] = median_time(lambda: ops.softmax(s, -1), sync, cfg["repeats"], cfg["inner"])
    # correctness spot checks (the benchmark must measure right answers)
    np.testing.assert_allclose(float(ops.sum(a).to_host()), float(a.to_host().astype(np.float64).sum()),
                               rtol=1e-4, atol=1e-1)
    return out


def copy_bandwidth(q, nbytes: int, repeats: int) -> float:
    src = Tensor.empty(q, (nbytes // 4,), np.float32)
    dst = Tensor.empty(q, (nbytes // 4,), np.float32)
    t = median_time(lambda: enqueue_copy(q, dst.buffer, src.buffer, byte_count=nbytes), q.finish, repeats, 5)
    return 2 * nbytes / t


# -- knob sweep (GPU) ---------------------------------------------------------------------------------
SWEEP = [
    # (label, env, works)
    ("default", {}, "add,chain_fused,sum,softmax"),
    ("ew cap 8 groups/CU", {"NETCL_EW_GROUPS_PER_CU": "8"}, "add,chain_fused"),
    ("ew cap 16 groups/CU", {"NETCL_EW_GROUPS_PER_CU": "16"}, "add,chain_fused"),
    ("ew cap 32 groups/CU", {"NETCL_EW_GROUPS_PER_CU": "32"}, "add,chain_fused"),
    ("ew unaligned vload4", {"NETCL_EW_ALIGNED": "0"}, "add,chain_fused"),
    ("ew unaligned vload4, cap 8/CU (old)", {"NETCL_EW_ALIGNED": "0", "NETCL_EW_GROUPS_PER_CU": "8"},
     "add,chain_fused"),
    ("ew vec 8", {"NETCL_EW_VEC": "8"}, "add,chain_fused"),
    ("ew vec 2", {"NETCL_EW_VEC": "2"}, "add,chain_fused"),
    ("ew vec 1", {"NETCL_EW_VEC": "1"}, "add,chain_fused"),
    ("ew local 128", {"NETCL_EW_LOCAL": "128"}, "add,chain_fused"),
    ("ew local 512", {"NETCL_EW_LOCAL": "512"}, "add,chain_fused"),
    ("red 2 groups/CU", {"NETCL_RED_GROUPS_PER_CU": "2"}, "sum"),
    ("red 8 groups/CU", {"NETCL_RED_GROUPS_PER_CU": "8"}, "sum"),
    ("red 16 groups/CU", {"NETCL_RED_GROUPS_PER_CU": "16"}, "sum"),
    ("red 32 groups/CU", {"NETCL_RED_GROUPS_PER_CU": "32"}, "sum"),
    ("red unroll 1", {"NETCL_RED_UNROLL": "1"}, "sum"),
    ("red unroll 8", {"NETCL_RED_UNROLL": "8"}, "sum"),
    ("red vec 8", {"NETCL_RED_VEC": "8"}, "sum,softmax"),
    ("red vec 8, 8 groups/CU", {"NETCL_RED_VEC": "8", "NETCL_RED_GROUPS_PER_CU": "8"}, "sum"),
    ("red unaligned vload", {"NETCL_RED_ALIGNED": "0"}, "sum,softmax"),
    ("softmax two passes (old)", {"NETCL_SOFTMAX_REG": "0"}, "softmax"),
    ("softmax two passes, vec 8", {"NETCL_SOFTMAX_REG": "0", "NETCL_RED_VEC": "8"}, "softmax"),
]


def worker(works: list[str], cfg: dict) -> dict:
    """Time netcl only for `works` (knobs come from the environment) and check the answers."""
    q = manager.default("auto").queue
    rng = np.random.default_rng(0)
    n = cfg["n"]
    ha = rng.standard_normal(n, dtype=np.float32)
    hb = rng.standard_normal(n, dtype=np.float32)
    a, b = Tensor.from_host(q, ha), Tensor.from_host(q, hb)
    res: dict = {}
    r, i = cfg["repeats"], cfg["inner"]

    def host_us(name: str, fn) -> None:
        """Enqueue-only host time per call: when it nears the device time the run is host-bound."""
        q.finish()
        t0 = time.perf_counter()
        for _ in range(10):
            fn()
        res[name + "_host_us"] = (time.perf_counter() - t0) / 10 * 1e6
        q.finish()
    if "add" in works:
        res["add"] = median_time(lambda: (a + b).realize(), q.finish, r, i)
        got = (a + b).realize().to_host()
        res["add_ok"] = bool(np.array_equal(got, ha + hb))
        host_us("add", lambda: (a + b).realize())
    if "chain_fused" in works:
        res["chain_fused"] = median_time(lambda: chain(a, b, ops).realize(), q.finish, r, i)
        got = chain(a, b, ops).realize().to_host()[: 1 << 20]
        want = chain(ha[: 1 << 20].astype(np.float64), hb[: 1 << 20].astype(np.float64), np)
        host_us("chain_fused", lambda: chain(a, b, ops).realize())
        # compare squares: the final sqrt turns an absolute float32 error near 0 into a large relative one
        res["chain_fused_ok"] = bool(np.allclose(got.astype(np.float64) ** 2, want**2, rtol=1e-5, atol=1e-6))
    if "sum" in works:
        res["sum"] = median_time(lambda: ops.sum(a), q.finish, r, i)
        got = float(ops.sum(a).to_host())
        host_us("sum", lambda: ops.sum(a))
        res["sum_ok"] = bool(abs(got - ha.astype(np.float64).sum()) < 1e-5 * np.abs(ha).sum())
    if "softmax" in works:
        hs = rng.standard_normal((cfg["rows"], cfg["cols"]), dtype=np.float32)
        s = Tensor.from_host(q, hs)
        res["softmax"] = median_time(lambda: ops.softmax(s, -1), q.finish, r, i)
        got = ops.softmax(s, -1).to_host()
        rows = hs[[0, 1, -1]].astype(np.float64)
        e = np.exp(rows - rows.max(1, keepdims=True))
        host_us("softmax", lambda: ops.softmax(s, -1))
        res["softmax_ok"] = bool(
            np.allclose(got[[0, 1, -1]], e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-8)
        )
    return res


def sweep(cfg: dict, copy_bw: float, timeout: int, gpu: bool) -> list[dict]:
    rows = []
    print(f"knob sweep (netcl only, GB/s, % of copy {copy_bw / 1e9:.0f} GB/s; '!' = wrong answer):")
    for label, env, works in SWEEP:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", works] + (["--gpu"] if gpu else [])
        try:
            proc = subprocess.run(
                cmd, env=dict(os.environ, **env), capture_output=True, text=True, timeout=timeout, check=False
            )
            out = next(
                (json.loads(ln[7:]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None
            )
            err = None if out else f"exit {proc.returncode}: " + " | ".join(
                (proc.stderr or "").strip().splitlines()[-2:])[:200]
        except subprocess.TimeoutExpired:
            out, err = None, f"timed out after {timeout} s"
        row = {"label": label, "env": env, "works": works.split(","), "error": err, "gbps": {}, "ok": {},
               "device_us": {}, "host_us": {}}
        if out:
            for w in row["works"]:
                row["gbps"][w] = bytes_of(w, cfg) / out[w] / 1e9
                row["ok"][w] = out.get(w + "_ok", True)
                row["device_us"][w] = out[w] * 1e6
                row["host_us"][w] = out.get(w + "_host_us")
        rows.append(row)
        cells = "  ".join(f"{w} {row['gbps'][w]:7.1f} ({100 * row['gbps'][w] * 1e9 / copy_bw:3.0f}%)"
                          f"{'' if row['ok'][w] else '!'}" for w in row["gbps"])
        print(f"  {label:<38} {cells or err}", flush=True)
        if label == "default" and out:
            print(
                "  "
                + " " * 38
                + " per call: "
                + "  ".join(
                    f"{w} {row['device_us'][w]:.0f} us (host enqueue {row['host_us'][w]:.0f} us)"
                    for w in row["gbps"]
                ),
                flush=True,
            )
    print("best per workload (correct answers only):")
    for w in ("add", "chain_fused", "sum", "softmax"):
        cands = [r for r in rows if w in r["gbps"] and r["ok"][w]]
        if cands:
            best = max(cands, key=lambda r: r["gbps"][w])
            print(
                f"  {w:<12} {best['gbps'][w]:7.1f} GB/s "
                f"({100 * best['gbps'][w] * 1e9 / copy_bw:.0f}% of copy)  "
                f"{best['label']}  env={best['env']}"
            )
    return rows


# -- peers --------------------------------------------------------------------------------------------
def bench_numpy(cfg) -> dict:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(cfg["n"], dtype=np.float32)
    b = rng.standard_normal(cfg["n"], dtype=np.float32)
    s = rng.standard_normal((cfg["rows"], cfg["cols"]), dtype=np.float32)

    def softmax(x):
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    r, nothing = cfg["repeats"], (lambda: None)
    return {
        "add": median_time(lambda: a + b, nothing, r),
        "chain_unfused": median_time(lambda: chain(a, b, np), nothing, r),
        "sum": median_time(lambda: a.sum(), nothing, r),
        "softmax": median_time(lambda: softmax(s), nothing, r),
    }


def bench_torch(cfg, gpu: bool) -> dict:
    import torch

    dev = "cuda" if gpu and torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(cfg["n"], generator=g).to(dev)
    b = torch.randn(cfg["n"], generator=g).to(dev)
    s = torch.randn(cfg["rows"], cfg["cols"], generator=g).to(dev)
    r, i = cfg["repeats"], cfg["inner"]
    out = {"device": f"torch {torch.__version__} {dev} ({torch.get_num_threads()} threads)"}
    out["add"] = median_time(lambda: a + b, sync, r, i)
    out["chain_unfused"] = median_time(lambda: chain(a, b, torch), sync, r, i)
    try:
        compiled = torch.compile(lambda x, y: chain(x, y, torch))
        out["chain_fused"] = median_time(lambda: compiled(a, b), sync, r, i)
    except Exception as exc:  # torch.compile needs a C compiler / triton; not everywhere
        out["chain_fused_error"] = str(exc).splitlines()[0][:160]
    out["sum"] = median_time(lambda: a.sum(), sync, r, i)
    out["softmax"] = median_time(lambda: torch.softmax(s, -1), sync, r, i)
    return out


_TINYGRAD_WORKER = r"""
import json, statistics, sys, time
import pyopencl  # sets up the wheel's bundled ICD loader
from tinygrad import Tensor, Device, TinyJit
n, rows, cols, repeats = map(int, sys.argv[1:5])
dev = Device[Device.DEFAULT]
a = Tensor.randn(n).realize(); b = Tensor.randn(n).realize(); s = Tensor.randn(rows, cols).realize()
def chain(x, y):
    t = x * 2.0; t = t + y; t = (t * -0.5).exp(); t = t - 1.0  # noqa: E702
    t = t.tanh(); t = t * y; t = t.abs(); return t.sqrt()  # noqa: E702
work = {"add": TinyJit(lambda: (a + b).realize()), "chain_fused": TinyJit(lambda: chain(a, b).realize()),
        "sum": TinyJit(lambda: a.sum().realize()), "softmax": TinyJit(lambda: s.softmax(-1).realize())}
res = {"device": f"tinygrad {Device.DEFAULT} {getattr(dev, 'device_name', '')}".strip()}
for name, fn in work.items():
    for _ in range(3): fn()
    dev.synchronize(); ts = []
    for _ in range(repeats):
        t0 = time.perf_counter(); fn(); dev.synchronize(); ts.append(time.perf_counter() - t0)
    res[name] = statistics.median(ts)
print("RESULT " + json.dumps(res))
"""


def _opencl_env(platform_name: str) -> dict:
    """Point tinygrad's OpenCL backend at netcl's platform (pyopencl's bundled loader + the ICD)."""
    import pyopencl

    env = dict(os.environ, DEV="CL")
    libs = os.path.join(os.path.dirname(pyopencl.__file__), ".libs")
    loader = next(iter(glob.glob(os.path.join(libs, "libOpenCL*"))), None)
    if loader and "OPENCL_PATH" not in env:
        env["OPENCL_PATH"] = loader
    key = next((v for k, v in {"portable": "pocl", "nvidia": "nvidia", "amd": "amd", "intel": "intel"}.items()
                if k in platform_name.lower()), None)
    for icd in glob.glob(os.path.join(libs, "*.icd")) + glob.glob("/etc/OpenCL/vendors/*.icd"):
        lib = Path(icd).read_text().strip()
        if key and (key in lib.lower() or key in Path(icd).name.lower()):
            full = lib if os.path.isabs(lib) else os.path.join(os.path.dirname(icd), lib)
            env["OCL_ICD_FILENAMES"] = full if os.path.exists(full) else lib
            break
    return env


def bench_tinygrad(device, cfg, timeout: int) -> dict:
    cmd = [sys.executable, "-c", _TINYGRAD_WORKER, str(cfg["n"]), str(cfg["rows"]), str(cfg["cols"]),
           str(cfg["repeats"])]
    try:
        proc = subprocess.run(cmd, env=_opencl_env(device.platform_name), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
    return {"error": f"exit {proc.returncode}: {' | '.join(tail)[:300]}"}


def host_only(out: str) -> None:
    """Per-call host time of the repeated-structure workloads on tiny tensors (see the docstring)."""
    device = manager.default("auto")
    q = device.queue
    rng = np.random.default_rng(0)
    a = Tensor.from_host(q, rng.standard_normal(256, dtype=np.float32))
    b = Tensor.from_host(q, rng.standard_normal(256, dtype=np.float32))
    s = Tensor.from_host(q, rng.standard_normal((8, 32), dtype=np.float32))
    works = {
        "add": lambda: (a + b).realize(),
        "mul_relu": lambda: (a * 2).relu().realize(),
        "relu_mask": lambda: ops.where(ops.gt(a, 0), b, 0.0).realize(),  # autograd's relu backward
        "chain_fused": lambda: chain(a, b, ops).realize(),
        "chain_build_only": lambda: chain(a, b, ops),
        "sum": lambda: ops.sum(a),
        "softmax": lambda: ops.softmax(s, -1),
    }
    res = {}
    for name, fn in works.items():
        for _ in range(30):
            fn()
        q.finish()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(300):
                fn()
            best = min(best, (time.perf_counter() - t0) / 300 * 1e6)
            q.finish()
        res[name] = best
        print(f"{name:18s} host {best:7.1f} us per call")
    print(f"device: {device.describe()}")
    path = Path(out if out != str(ROOT / "bench" / "results" / "elementwise.json")
                else ROOT / "bench" / "results" / "elementwise_host.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device.describe(), "host_us": res}, indent=2))
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", action="store_true", help="GPU sizes (64M-element vectors, 16384x4096 softmax)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "elementwise.json"))
    p.add_argument("--peers", default="numpy,torch,tinygrad")
    p.add_argument("--tinygrad-timeout", type=int, default=300)
    p.add_argument(
        "--sweep",
        action="store_true",
        default=os.environ.get("NETCL_BENCH_SWEEP", "") not in ("", "0"),
        help="also time netcl's launch knobs, one child process per variant (NETCL_BENCH_SWEEP=1)",
    )
    p.add_argument("--sweep-timeout", type=int, default=60, help="seconds per sweep variant")
    p.add_argument("--host", action="store_true", help="only the host cost per call, on tiny tensors")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.host:
        host_only(args.out)
        return
    if args.worker:
        dev = manager.default("auto")
        cfg = sizes(args.gpu or dev.capabilities.kind == "gpu")
        cfg["repeats"] = min(cfg["repeats"], 10)
        print("RESULT " + json.dumps(worker(args.worker.split(","), cfg)))
        return
    device = manager.default("auto")
    q = device.queue
    gpu = args.gpu or device.capabilities.kind == "gpu"
    cfg = sizes(gpu)
    print(f"device: {device.describe()}  sizes: {cfg}")
    copy_bw = copy_bandwidth(q, cfg["n"] * 4, cfg["repeats"])
    results = {"netcl": bench_netcl(q, cfg)}
    peers = args.peers.split(",")
    if "numpy" in peers:
        results["numpy"] = bench_numpy(cfg)
    if "torch" in peers:
        try:
            results["torch"] = bench_torch(cfg, gpu)
        except Exception as exc:
            results["torch"] = {"error": str(exc)[:200]}
    if "tinygrad" in peers:
        results["tinygrad"] = bench_tinygrad(device, cfg, args.tinygrad_timeout)
    works = ["add", "chain_fused", "chain_unfused", "sum", "softmax"]
    names = [k for k in results]
    header = f"{'work':<14}{'netcl GB/s':>11}{'% copy':>8}" + "".join(
        f"{k + ' GB/s':>16}{'x':>7}" for k in names[1:]
    )
    print(f"copy bandwidth (enqueue_copy buffer->buffer): {copy_bw / 1e9:.1f} GB/s")
    print(header)
    rows = {}
    for w in works:
        nb = bytes_of(w, cfg)
        t = results["netcl"][w]
        row = {"seconds": t, "gbps": nb / t / 1e9, "fraction_of_copy": nb / t / copy_bw, "peers": {}}
        line = f"{w:<14}{row['gbps']:>11.1f}{100 * row['fraction_of_copy']:>7.0f}%"
        for k in names[1:]:
            pt = results[k].get(w) if isinstance(results[k].get(w), float) else None
            if pt is None:
                line += f"{'-':>16}{'':>7}"
                continue
            row["peers"][k] = {"seconds": pt, "gbps": nb / pt / 1e9, "netcl_speedup": pt / t}
            line += f"{nb / pt / 1e9:>16.1f}{pt / t:>6.2f}x"
        rows[w] = row
        print(line)
    fused_gain = results["netcl"]["chain_unfused"] / results["netcl"]["chain_fused"]
    print(f"fused chain vs unfused (netcl): {fused_gain:.2f}x")
    for k in names[1:]:
        if "error" in results[k]:
            print(f"{k}: {results[k]['error']}")
        if "device" in results[k]:
            print(f"{k}: {results[k]['device']}")
    sweep_rows = sweep(cfg, copy_bw, args.sweep_timeout, gpu) if args.sweep else None
    report = {
        "device": device.describe(),
        "sweep": sweep_rows,
        "kind": device.capabilities.kind,
        "sizes": cfg,
        "copy_bandwidth_gbps": copy_bw / 1e9,
        "work": rows,
        "fused_vs_unfused": fused_gain,
        "raw": results,
        "targets": {
            "gpu_fraction_of_copy": TARGETS_GPU,
            "gpu_fused_vs_unfused": 4.0,
            "cpu_vs_numpy": {"add": 0.8, "sum": 0.8},
        },
        "limits": "all workloads are memory-bound: the ceiling is copy bandwidth (bytes = inputs + output)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
