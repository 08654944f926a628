"""GEMM benchmark: netcl against PyTorch, NumPy and tinygrad on the same device, in one run.

CPU (PoCL):  .venv/bin/python bench/gemm.py                 # 1024^3, torch on the same core count
GPU:         python bench/gemm.py --gpu                        # 4096^3, 8192x8192x1024, 256x4096x4096
Sweep:       python bench/gemm.py --gpu --configs auto --store-best   # tile candidates, keep the best
             python bench/gemm.py --configs '[{"BM":128,"BN":128,"BK":8}]'   (JSON list, or a file)

Prints one table (median GFLOP/s over repeats after warm-up, and netcl's ratio to each peer) and
writes JSON to bench/results/gemm.json. In-process contenders are timed round-robin (one run of each
per round, each timed call preceded by one untimed call of the same contender so the switch between
OpenCL's and torch's GPU contexts is not charged to either; --no-settle times it too) so a busy machine
slows them alike; tinygrad runs in a subprocess on the same OpenCL
platform (DEV=CL). On CUDA machines torch runs with TF32 off (true FP32), like netcl.
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

from netcl.core.device import manager
from netcl.core.tensor import Tensor
from netcl.ops.gemm import choose_variant, flops, gemm, tuned_params
from netcl.ops.gemm import variants as gemm_variants

CPU_SHAPES = [(1024, 1024, 1024)]
GPU_SHAPES = [(4096, 4096, 4096), (8192, 8192, 1024), (256, 4096, 4096)]
# Published FP32 (non-tensor-core) peaks and memory bandwidths, for the "how close to the limit" line.
KNOWN_PEAKS = {"H200": (67e12, 4.8e12), "H100": (67e12, 3.35e12), "A100": (19.5e12, 2.0e12)}
TARGETS_CPU = {"torch": 0.5, "tinygrad": 3.0}
TARGETS_GPU = {(4096, 4096, 4096): 0.85, "other": 0.7}


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = [int(x) for x in text.lower().split("x")]
    return (parts[0],) * 3 if len(parts) == 1 else tuple(parts)  # type: ignore[return-value]


def median_time(fn, sync, repeats: int) -> float:
    fn()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


# -- contenders ---------------------------------------------------------------------------------------
def _stored(q, arr, transposed: bool) -> Tensor:
    """arr on the device; transposed=True keeps arr.T in memory and views it back (read in place)."""
    if transposed:
        return Tensor.from_host(q, np.ascontiguousarray(arr.T)).T
    return Tensor.from_host(q, arr)


class Netcl:
    def __init__(self, device, shape, dtype, params=None, label="netcl", layout="NN"):
        m, n, k = shape
        q = device.queue
        rng = np.random.default_rng(0)
        self.a_host = rng.standard_normal((m, k), dtype=np.float32).astype(dtype)
        self.b_host = rng.standard_normal((k, n), dtype=np.float32).astype(dtype)
        self.a = _stored(q, self.a_host, layout[0] == "T")
        self.b = _stored(q, self.b_host, layout[1] == "T")
        self.q, self.params, self.label = q, params, label
        self.variant = choose_variant(device, m, n, k)

    def run(self):
        if (
            self.params is None
        ):  # netcl's own choice: exactly what matmul() runs (replayed after the first call)
            self.out = gemm(self.a, self.b)
        else:
            self.out = gemm(self.a, self.b, variant=self.variant, params=self.params)

    def sync(self):
        self.q.finish()

    def check(self) -> float:
        """Largest error of a few rows against float64 NumPy, relative to the row scale."""
        rows = np.linspace(0, self.a_host.shape[0] - 1, 4).astype(int)
        got = self.out.to_host()[rows].astype(np.float64)
        want = self.a_host[rows].astype(np.float64) @ self.b_host.astype(np.float64)
        return float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))


class Torch:
    label = "torch"

    def __init__(self, shape, dtype, cuda: bool, threads: int, layout: str = "NN"):
        import torch

        self.torch = torch
        m, n, k = shape
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            dev = "cuda"
            self.label = f"torch-cuda ({torch.cuda.get_device_name(0)}, tf32 off)"
        else:
            torch.set_num_threads(threads)
            dev = "cpu"
            self.label = f"torch-cpu ({threads} threads)"
        tdt = {np.float32: torch.float32, np.float16: torch.float16, np.float64: torch.float64}[
            np.dtype(dtype).type
        ]
        self.a = torch.randn(k, m, device=dev, dtype=tdt).T if layout[0] == "T" else torch.randn(
            m, k, device=dev, dtype=tdt)
        self.b = torch.randn(n, k, device=dev, dtype=tdt).T if layout[1] == "T" else torch.randn(
            k, n, device=dev, dtype=tdt)
        self.cuda = cuda

    def run(self):
        self.out = self.a @ self.b

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()


class Numpy:
    label = "numpy"

    def __init__(self, shape, dtype):
        m, n, k = shape
        rng = np.random.default_rng(1)
        self.a = rng.standard_normal((m, k)).astype(dtype)
        self.b = rng.standard_normal((k, n)).astype(dtype)

    def run(self):
        self.out = self.a @ self.b

    def sync(self):
        pass


_TINYGRAD_WORKER = r"""
import json, os, statistics, sys, time
import numpy as np
from tinygrad import Tensor, Device, TinyJit
m, n, k, repeats, dt = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = np.random.default_rng(0)
a = Tensor(rng.standard_normal((m, k), dtype=np.float32).astype(dt)).realize()
b = Tensor(rng.standard_normal((k, n), dtype=np.float32).astype(dt)).realize()
dev = Device[Device.DEFAULT]
@TinyJit
def f(a, b): return (a @ b).realize()
for _ in range(3): f(a, b)
dev.synchronize()
ts = []
for _ in range(repeats):
    t0 = time.perf_counter(); f(a, b); dev.synchronize(); ts.append(time.perf_counter() - t0)
print("RESULT " + json.dumps({"seconds": statistics.median(ts), "device": Device.DEFAULT,
                              "name": getattr(dev, "device_name", "?")}))
"""


def _icd_library_for(platform_name: str) -> tuple[str | None, str | None]:
    """(libOpenCL loader to use, ICD library of `platform_name`) so tinygrad opens netcl's platform."""
    import pyopencl

    libs = os.path.join(os.path.dirname(pyopencl.__file__), ".libs")
    loader = next(iter(glob.glob(os.path.join(libs, "libOpenCL*"))), None)
    keys = {"portable": "pocl", "nvidia": "nvidia", "oclgrind": "oclgrind", "amd": "amd", "intel": "intel"}
    key = next((v for k, v in keys.items() if k in platform_name.lower()), None)
    if key is None:
        return loader, None
    for icd in glob.glob(os.path.join(libs, "*.icd")) + glob.glob("/etc/OpenCL/vendors/*.icd"):
        lib = Path(icd).read_text().strip()
        if key in lib.lower() or key in Path(icd).name.lower():
            full = lib if os.path.isabs(lib) else os.path.join(os.path.dirname(icd), lib)
            return loader, full if os.path.exists(full) else lib
    return loader, None


def run_tinygrad(device, shape, dtype, repeats: int, timeout: int) -> dict:
    """Time tinygrad's a @ b in a subprocess on netcl's OpenCL platform (tinygrad opens platform 0)."""
    import tempfile

    env = dict(os.environ, DEV="CL")
    loader, icd = _icd_library_for(device.platform_name)
    if loader and "OPENCL_PATH" not in env:
        env["OPENCL_PATH"] = loader
    if icd and loader:
        # pyopencl's bundled ICD loader reads the vendor files in $PYOPENCL_HOME/.libs: point it at a
        # folder that names only netcl's platform, so platform 0 is the device netcl measured
        home = Path(tempfile.mkdtemp(prefix="netcl-tinygrad-"))
        (home / ".libs").mkdir()
        (home / ".libs" / "netcl-platform.icd").write_text(icd + "\n")
        env["PYOPENCL_HOME"] = str(home)
        env["OCL_ICD_VENDORS"] = str(home / ".libs")
    cmd = [sys.executable, "-c", _TINYGRAD_WORKER, *map(str, shape), str(repeats), np.dtype(dtype).name]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    finally:
        if "PYOPENCL_HOME" in env and env["PYOPENCL_HOME"] != os.environ.get("PYOPENCL_HOME"):
            import shutil

            shutil.rmtree(env["PYOPENCL_HOME"], ignore_errors=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}: {' | '.join(tail)[:300]}"}


# -- the run -----------------------------------------------------------------------------------------
def load_configs(spec: str | None, device, dtype, quick: bool) -> list[dict] | None:
    if not spec:
        return None
    if spec in ("auto", "quick"):
        from netcl.tune.gemm import candidates

        variant = "cpu" if device.capabilities.kind == "cpu" else "tiled"
        return candidates(device, variant, dtype, quick=spec == "quick" or quick)
    text = Path(spec).read_text() if os.path.exists(spec) else spec
    configs = json.loads(text)
    return [configs] if isinstance(configs, dict) else configs


def device_limits(device, gflop: float, nbytes: int) -> dict:
    name = device.device_name
    peak_flops, bandwidth = next((v for k, v in KNOWN_PEAKS.items() if k in name), (None, None))
    caps = device.capabilities
    if peak_flops is None and caps.kind == "cpu":
        # AVX2/AVX-512 class core: 2 FMA pipes x float8 x 2 flops per cycle (an assumption, stated)
        peak_flops = caps.compute_units * caps.max_clock_mhz * 1e6 * 32
    if bandwidth is None:
        q = device.queue
        n = 64 << 20
        src, dst = Tensor.empty(q, (n // 4,)), Tensor.empty(q, (n // 4,))
        t = median_time(lambda: dst.copy_(src), q.finish, 5)
        bandwidth = 2 * n / t  # read + write
    return {
        "peak_gflops": peak_flops / 1e9 if peak_flops else None,
        "bandwidth_gbs": bandwidth / 1e9,
        "compute_bound_ms": gflop / (peak_flops / 1e9) * 1e3 if peak_flops else None,
        "memory_bound_ms": nbytes / bandwidth * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="GPU shapes (default when the device is a GPU)")
    p.add_argument("--cpu", action="store_true", help="CPU shapes even on a GPU")
    p.add_argument("--quick", action="store_true", help="fewer repeats (and quick candidate lists)")
    p.add_argument("--shapes", nargs="+", type=parse_shape, help="MxNxK (or N) problem sizes")
    p.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--layout", default="NN", choices=["NN", "NT", "TN", "TT"],
                   help="T = operand stored transposed and read in place (NT is linear's x @ W.T)")
    p.add_argument(
        "--configs",
        default=None,
        help="tile configs for netcl: JSON list/dict, a JSON file, 'auto' or 'quick' (tuning lists)",
    )
    p.add_argument(
        "--store-best", action="store_true", help="store the best --configs entry in the tuning DB"
    )
    p.add_argument("--peers", default="torch,numpy,tinygrad", help="comma list of torch,numpy,tinygrad")
    p.add_argument("--tinygrad-timeout", type=int, default=900)
    p.add_argument("--no-settle", dest="settle", action="store_false",
                   help="time each contender's first call of a round too (no untimed call before it)")
    p.add_argument("--nv-verbose", action="store_true",
                   help="NVIDIA: build with -cl-nv-verbose and print registers/spills of each GEMM build")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "gemm.json"))
    args = p.parse_args(argv)

    device = manager.default("auto")
    caps = device.capabilities
    if args.nv_verbose:
        gemm_variants.NV_VERBOSE = True
    on_gpu = (caps.kind != "cpu" or args.gpu) and not args.cpu
    shapes = args.shapes or (GPU_SHAPES if on_gpu else CPU_SHAPES)
    dtype = np.dtype(args.dtype)
    repeats = args.repeats or (5 if args.quick else (10 if on_gpu else 7))
    peers = [s.strip() for s in args.peers.split(",") if s.strip()]
    configs = load_configs(args.configs, device, dtype, args.quick)
    variant_default = "cpu" if caps.kind == "cpu" else "tiled"
    print(f"device: {device.describe()} | {device.backend} | {caps.compute_units} compute units")
    print(f"dtype {dtype.name}, {repeats} repeats (median), default tile params: "
          f"{tuned_params(device, variant_default, dtype)}")

    cuda = False
    torch_mod = None
    if "torch" in peers:
        try:
            import torch as torch_mod

            cuda = torch_mod.cuda.is_available() and caps.kind != "cpu"
        except ImportError:
            print("torch: not installed, skipped")
            peers.remove("torch")
    if "numpy" in peers and on_gpu and not args.shapes:
        peers.remove("numpy")  # NumPy on the host CPU at GPU sizes takes minutes and says nothing new

    results = []
    best_config = None
    for shape in shapes:
        m, n, k = shape
        gflop = flops(m, n, k) / 1e9
        nbytes = dtype.itemsize * (m * k + k * n + m * n)
        row = {
            "shape": list(shape),
            "gflop": gflop,
            "bytes": nbytes,
            "dtype": dtype.name,
            "layout": args.layout,
            "gflops": {},
        }
        contenders = []
        nets = [Netcl(device, shape, dtype, c, f"netcl cfg{i}", args.layout) for i, c in enumerate(configs)] \
            if configs else [Netcl(device, shape, dtype, layout=args.layout)]
        contenders += nets
        if "torch" in peers:
            contenders.append(Torch(shape, dtype, cuda, caps.compute_units, args.layout))
        if "numpy" in peers:
            contenders.append(Numpy(shape, dtype))
        # warm-up (builds kernels), then round-robin timing
        ok = []
        for c in contenders:
            try:
                c.run()
                c.sync()
                ok.append(c)
            except Exception as exc:  # noqa: BLE001  (a config that cannot build or launch here)
                print(f"  {c.label}: failed ({str(exc).splitlines()[0][:120]})")
        samples: dict[str, list[float]] = {c.label: [] for c in ok}
        for _ in range(repeats):
            for c in ok:
                if args.settle:
                    # one untimed call first: on a GPU shared by OpenCL (netcl, tinygrad) and torch's CUDA
                    # context, the first launch after the other context ran pays a context switch (about
                    # 0.2 ms on the H200), which would be charged to whoever follows the other in the round
                    c.run()
                    c.sync()
                t0 = time.perf_counter()
                c.run()
                c.sync()
                samples[c.label].append(time.perf_counter() - t0)
        for c in ok:
            row["gflops"][c.label] = gflop / statistics.median(samples[c.label])
        if "tinygrad" in peers:
            tg = run_tinygrad(device, shape, dtype, repeats, args.tinygrad_timeout)
            if "seconds" in tg:
                row["gflops"][f"tinygrad ({tg.get('device')}: {tg.get('name')})"] = gflop / tg["seconds"]
            else:
                row["tinygrad_error"] = tg["error"]
                print(f"  tinygrad: {tg['error']}")
        net_ok = [c for c in nets if c in ok]
        if not net_ok:
            results.append(row)
            continue
        best = max(net_ok, key=lambda c: row["gflops"][c.label])
        row["netcl_error"] = best.check()
        row["netcl_best"] = {"label": best.label, "variant": best.variant,
                             "params": best.params or tuned_params(device, best.variant, dtype),
                             "gflops": row["gflops"][best.label]}
        if configs:
            row["configs"] = [{"params": c.params, "gflops": row["gflops"].get(c.label)} for c in nets]
        row["limits"] = device_limits(device, gflop, nbytes)
        results.append(row)
        print_row(row)

    if configs:
        # the config with the best geometric mean over all shapes (a failed run counts as 0.01 GFLOP/s)
        rows = [r for r in results if r.get("configs")]
        scores = [
            statistics.geometric_mean([max(r["configs"][i]["gflops"] or 0.01, 0.01) for r in rows])
            for i in range(len(configs))
        ] if rows else []
        if scores:
            best_index = max(range(len(configs)), key=scores.__getitem__)
            best_config = configs[best_index]
            print(f"\nbest config over {len(rows)} shape(s): {json.dumps(best_config)} "
                  f"(geometric mean {scores[best_index]:.1f} GFLOP/s)")
    if args.store_best and best_config is not None:
        from netcl.kernels.tuning import database_for

        variant = "cpu" if caps.kind == "cpu" else "tiled"
        database_for(device).put(f"gemm_{variant}", dtype.name, best_config, source="bench/gemm.py",
                                 shape=list(shapes[0]))
        print(f"stored {best_config} for gemm_{variant}/{dtype.name} in {database_for(device).path}")

    out = {"device": device.describe(), "backend": device.backend, "dtype": dtype.name, "results": results,
           "targets": "CPU: >= 0.5x torch (same cores), >= 3x tinygrad; GPU: >= 0.85x cuBLAS FP32 at 4096^3, "
                      ">= 0.7x on the other shapes", "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


def print_row(row: dict) -> None:
    m, n, k = row["shape"]
    best = row["netcl_best"]
    net = best["gflops"]
    print(
        f"\n{m}x{n}x{k} {row['dtype']} {row['layout']} ({row['gflop']:.1f} GFLOP, {row['bytes'] / 1e6:.1f} "
        f"MB)  "
        f"netcl kernel {best['variant']} {best['params']}  max rel. error {row['netcl_error']:.1e}"
    )
    print(f"  {'contender':58s} {'GFLOP/s':>10s} {'netcl / it':>11s}")
    for label, gf in sorted(row["gflops"].items(), key=lambda kv: -kv[1]):
        ratio = net / gf if gf else float("nan")
        print(f"  {label[:58]:58s} {gf:10.1f} {ratio:11.2f}")
    lim = row["limits"]
    if lim["peak_gflops"]:
        print(
            f"  limits: compute {lim['peak_gflops']:.0f} GFLOP/s peak (netcl at "
            f"{net / lim['peak_gflops']:.0%}), "
            f"memory {lim['bandwidth_gbs']:.0f} GB/s -> at least {lim['memory_bound_ms']:.2f} ms "
            f"(netcl {row['gflop'] / net * 1e3:.2f} ms)"
        )
    if row.get("configs"):
        print("  configs:")
        for c in row["configs"]:
            gf = c["gflops"]
            print(f"    {json.dumps(c['params'])}: {gf:.1f} GFLOP/s" if gf
                  else f"    {json.dumps(c['params'])}: failed")


if __name__ == "__main__":
    sys.exit(main())
