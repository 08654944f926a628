"""GEMM on matrix units (issue 18; netcl/kernels/gemm_mma.cl) on an NVIDIA GPU of compute capability 8.0+.

Each tile/loader configuration runs through netcl's API (what ships): first checked on odd shapes and
layouts against float64 NumPy (TF32-rounded inputs for float32), then timed at 4096^3 and 8192^3 (median
of 5 after 2 warm-ups). Then netcl's automatic choice under both matmul precisions, and PyTorch's cuBLAS
float16, bfloat16, TF32 and FP32 on the same GPU in the same run. Limits: H200 dense float16/bfloat16
~990 TFLOP/s (wgmma; mma.sync reaches less), TF32 ~495, FP32 (no matrix units) ~67.

    python3 bench/gemm_mma.py [--out bench/results/gemm_mma.json]
    python3 bench/gemm_mma.py --sweep [--budget 75] [--ptx DIR]

--sweep: a handful of configurations of gemm_mma.cl's named knobs (block BM x BN x BK, warp patch WM x WN,
STAGES of the cp.async ring, SWIZZLE of the local tiles instead of padding, GROUP_M block order, DBUF
double-buffered fragments), float16/bfloat16/TF32 at 8192^3 only, each checked on two odd shapes first, with
the registers/spills NVIDIA's compiler reports (-cl-nv-verbose), a probe of how much dynamic local memory
(a __local kernel argument) a work-group gets, and cuBLAS at 8192^3 beside them; --ptx writes each
configuration's PTX there. Configurations after --budget seconds are left out (said so).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import netcl
from netcl.core import dtypes
from netcl.core.device import manager
from netcl.core.tensor import Tensor
from netcl.ops import gemm as mm
from netcl.ops.gemm import launch as gemm_launch
from netcl.ops.gemm import variants

BF16 = dtypes.bfloat16
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
HALF = {"PAD": 8, "PADB": 8, "EMULATE": 0}
CONFIGS = [  # (dtype, tile and loader); the first of each dtype is the kernel before cp.async/ldmatrix
    (F16, dict(BM=128, BN=256, BK=32, WM=64, WN=64, ASYNC=0, LDMATRIX=0)),
    (F16, dict(BM=128, BN=256, BK=32, WM=64, WN=64, ASYNC=0, LDMATRIX=1)),
    (F16, dict(BM=128, BN=128, BK=32, WM=64, WN=64, ASYNC=1, STAGES=2, LDMATRIX=1)),
    (F16, dict(BM=128, BN=128, BK=32, WM=64, WN=32, ASYNC=1, STAGES=2, LDMATRIX=1)),
    (F16, dict(BM=128, BN=128, BK=32, WM=32, WN=64, ASYNC=1, STAGES=2, LDMATRIX=1)),
    (F16, dict(BM=128, BN=128, BK=16, WM=64, WN=64, ASYNC=1, STAGES=4, LDMATRIX=1)),
    (F16, dict(BM=128, BN=128, BK=32, WM=64, WN=32, ASYNC=1, STAGES=2, LDMATRIX=0)),
    (BF16, dict(BM=128, BN=256, BK=32, WM=64, WN=64, ASYNC=0, LDMATRIX=0)),
    (BF16, dict(BM=128, BN=128, BK=32, WM=32, WN=64, ASYNC=1, STAGES=2, LDMATRIX=1)),
    (BF16, dict(BM=128, BN=128, BK=16, WM=64, WN=32, ASYNC=1, STAGES=4, LDMATRIX=1)),
    (F32, dict(BM=128, BN=256, BK=16, WM=64, WN=64, PAD=4, ASYNC=0, LDMATRIX=0)),
    (F32, dict(BM=128, BN=128, BK=16, WM=64, WN=64, PAD=4, ASYNC=1, STAGES=2, LDMATRIX=0)),
    (F32, dict(BM=128, BN=128, BK=8, WM=64, WN=32, PAD=4, ASYNC=1, STAGES=4, LDMATRIX=0)),
]


# --sweep: (dtype, label, knobs over the base of its dtype); first the shipped default, then one lever at
# a time, then larger blocks / warp patches; 48 KB of static local memory bounds STAGES x stage size
BASE16 = dict(BM=128, BN=128, BK=32, WM=32, WN=64, PAD=8, PADB=8, ASYNC=1, STAGES=2, LDMATRIX=1, SWIZZLE=0,
              GROUP_M=0, DBUF=0, EMULATE=0)
BASE32 = dict(BM=128, BN=128, BK=16, WM=64, WN=64, PAD=4, PADB=8, ASYNC=1, STAGES=2, LDMATRIX=0, SWIZZLE=0,
              GROUP_M=0, DBUF=0, EMULATE=0)
S3 = dict(SWIZZLE=1, STAGES=3, GROUP_M=8, DBUF=1)
PADDED = dict(SWIZZLE=0, STAGES=2, GROUP_M=0, DBUF=0)
W64 = dict(WM=64, WN=64)
D = {**PADDED, "GROUP_M": 8, **W64}  # the float16/bfloat16 default since round 2
# Rounds 1-2 (bench/NOTES.md): every shape within ~15%, swizzled three-stage rings 6-12% slower than padded
# two-stage ones; the default (D) measured twice, interleaved with the others (noise ~5%).
SWEEP = [  # most telling first: --budget may leave the tail out
    (F16, "D default: padded x2 + GROUP_M8, warp 64x64 (4 warps)", D),
    (BF16, "D default", D),
    (F16, "D but swizzled (x2): the swizzle alone", {**D, "SWIZZLE": 1}),
    (F16, "A old default: padded x2, warp 32x64", PADDED),
    (BF16, "A old default", PADDED),
    (F32, "TF32 default: swizzled x3 + GROUP_M8, ldmatrix, warp 64x64", {**S3, "LDMATRIX": 1}),
    (F16, "D default (again)", D),
    (BF16, "D default (again)", D),
    (F16, "D + DBUF", {**D, "DBUF": 1}),
]


def tf32(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def local_bytes(p: dict, dt: np.dtype) -> int:
    if p.get("ASYNC") and p.get("SWIZZLE"):
        return (p["BM"] + p["BN"]) * p["BK"] * np.dtype(dt).itemsize * p.get("STAGES", 2)
    a = p["BM"] * (p["BK"] + p["PAD"])
    b = max(p["BK"] * (p["BN"] + p["PADB"]), p["BN"] * (p["BK"] + p["PAD"]))
    return (a + b) * np.dtype(dt).itemsize * (p.get("STAGES", 2) if p.get("ASYNC") else 1)


def median_seconds(fn, queue, repeat: int = 5, inner: int = 1) -> float:
    """Median seconds of one call of `fn`, after 2 warm-ups; each sample times `inner` calls back to back (the
    host's launch work then overlaps the device's, as in a model's step) and divides."""
    for _ in range(2):
        fn()
    queue.finish()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        queue.finish()
        times.append((time.perf_counter() - t0) / inner)
    return float(np.median(times))


def operand(queue, x: np.ndarray, transposed: bool) -> Tensor:
    return Tensor.from_host(queue, np.ascontiguousarray(x.T)).T if transposed else Tensor.from_host(queue, x)


def check(queue, rng, dt, params) -> float:
    worst = 0.0
    for m, n, k, layout in (
        (37, 29, 45, "nn"),
        (130, 270, 70, "nn"),
        (256, 256, 256, "nt"),
        (1000, 999, 517, "nn"),
        (64, 96, 200, "tn"),
    ):
        a, b = rng.standard_normal((m, k)).astype(dt), rng.standard_normal((k, n)).astype(dt)
        got = mm.gemm(operand(queue, a, layout[0] == "t"), operand(queue, b, layout[1] == "t"), variant="mma",
                      params=params).to_host().astype(np.float64)
        ref = tf32(a) @ tf32(b) if dt == F32 else a.astype(np.float64) @ b.astype(np.float64)
        worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
    return worst


PROBE = """__kernel void probe(__global float *out, __local float *s, const int n) {
    for (int i = get_local_id(0); i < n; i += get_local_size(0)) s[i] = (float)i;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) out[0] = s[n - 1];
}"""


def probe_local_memory(dev) -> dict[str, str]:
    """Whether a work-group gets `kb` KB of dynamic local memory (a __local kernel argument sized at launch):
    NVIDIA's OpenCL reports 48 KB (CL_DEVICE_LOCAL_MEM_SIZE); the H200's SM has 228 KB."""
    ctx, q = dev.context, dev.queue.cl
    probe = cl.Kernel(cl.Program(ctx, PROBE).build(), "probe")
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4)
    res = {}
    for kb in (48, 64, 96, 160, 227):
        n = kb * 1024 // 4
        try:
            probe(q, (128,), (128,), out, cl.LocalMemory(kb * 1024), np.int32(n))
            got = np.zeros(1, np.float32)
            cl.enqueue_copy(q, got, out)
            q.finish()
            res[f"{kb}KB"] = "ok" if got[0] == n - 1 else f"wrong value {got[0]}"
        except Exception as exc:  # the answer is the point: report it
            res[f"{kb}KB"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return res


# The ceiling of mma.sync itself on this device (no memory traffic: NACC independent accumulators a warp,
# register operands), and how many work-groups of a given static local memory an SM holds at once.
PEAK = """
#define MMA_F16 "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#define MMA_BF16 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#define MMA_TF32 "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
__kernel void mma_peak(__global float *out, const int iters, const uint seed) {
    const uint a0 = seed ^ 0x3c003c00u, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, b0 = a0 + 4, b1 = a0 + 5;
    float d[NACC][4];
    for (int j = 0; j < NACC; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
    for (int it = 0; it < iters; ++it) {
        #pragma unroll
        for (int j = 0; j < NACC; ++j)
            asm volatile(OP " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    float s = 0.0f;
    for (int j = 0; j < NACC; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    out[get_global_id(0)] = s;
}
"""

OCCUPANCY = """
__kernel void occupancy(__global int *count, __global int *most, const ulong spin_ns) {
    __local uint4 pad[LOCAL_BYTES / 16];
    uint sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    pad[get_local_id(0) * (LOCAL_BYTES / 16 / get_local_size(0))] = (uint4)(sm);
    if (get_local_id(0) == 0) atomic_max(&most[sm], atomic_inc(&count[sm]) + 1);
    ulong t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < spin_ns);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) atomic_dec(&count[pad[0].x]);
}
"""


def probe_mma_peak(dev) -> dict[str, object]:
    """TFLOP/s of back-to-back mma.sync (register operands, 8 independent accumulators a warp) with 8 or 16
    warps an SM: the most this instruction gives through NVIDIA's OpenCL on this device."""
    ctx, q = dev.context, dev.queue.cl
    sms = dev.cl_device.max_compute_units
    out = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * sms * 64 * 1024)
    res: dict[str, object] = {}
    for name, k in (("MMA_F16", 16), ("MMA_BF16", 16), ("MMA_TF32", 8)):
        nacc = 8
        try:
            prg = cl.Program(ctx, PEAK).build(options=[f"-DOP={name}", f"-DNACC={nacc}"])
            knl = cl.Kernel(prg, "mma_peak")
        except Exception as exc:  # reported, not fatal
            res[name] = f"build failed: {str(exc)[:200]}"
            continue
        for warps_per_sm in (8, 16, 32):
            threads, iters = 256, 4096
            groups = sms * warps_per_sm // 8
            gsize = groups * threads
            knl(q, (gsize,), (threads,), out, np.int32(iters), np.uint32(0))
            q.finish()
            t0 = time.perf_counter()
            knl(q, (gsize,), (threads,), out, np.int32(iters), np.uint32(0))
            q.finish()
            sec = time.perf_counter() - t0
            flop = gsize // 32 * iters * nacc * 16 * 8 * k * 2
            res[f"{name[4:].lower()} {warps_per_sm} warps/SM"] = round(flop / sec / 1e12, 1)
    return res


def probe_occupancy(dev) -> dict[str, object]:
    """Most work-groups of 256 work-items one SM held at once, by static local memory per work-group."""
    ctx, q = dev.context, dev.queue.cl
    sms = dev.cl_device.max_compute_units
    res: dict[str, object] = {}
    for kb in (16, 24, 32, 40, 47):
        try:
            prg = cl.Program(ctx, OCCUPANCY).build(options=[f"-DLOCAL_BYTES={kb * 1024}"])
            knl = cl.Kernel(prg, "occupancy")
            flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
            count = cl.Buffer(ctx, flags, hostbuf=np.zeros(1024, np.int32))
            most = cl.Buffer(ctx, flags, hostbuf=np.zeros(1024, np.int32))
            knl(q, (sms * 8 * 256,), (256,), count, most, np.uint64(200_000))
            got = np.zeros(1024, np.int32)
            cl.enqueue_copy(q, got, most)
            q.finish()
            res[f"{kb}KB"] = int(got.max())
        except Exception as exc:  # reported, not fatal
            res[f"{kb}KB"] = f"{type(exc).__name__}: {str(exc)[:150]}"
    return res


def cublas(torch, name: str, s: int, inner: int = 3) -> float:
    """PyTorch's matmul (cuBLAS) TFLOP/s at s^3, timed like netcl's (`inner` calls a sample)."""
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(name, torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
    a = torch.randn(s, s, device="cuda", dtype=tdt)
    b = torch.randn(s, s, device="cuda", dtype=tdt)
    sec = median_seconds(lambda: a @ b, cuda_stream(torch), inner=inner)
    torch.backends.cuda.matmul.allow_tf32 = False
    return round(2 * s**3 / sec / 1e12, 1)


def cuda_stream(torch):
    """What median_seconds waits on for PyTorch's work: its `finish` synchronizes the CUDA device."""
    return SimpleNamespace(finish=torch.cuda.synchronize)


def sweep(dev, args) -> dict[str, object]:
    """--sweep: each configuration checked (two odd shapes, layout nn: the program timed) then timed at
    8192^3, beside cuBLAS; registers/spills from NVIDIA's build log; PTX into --ptx."""
    import torch  # noqa: PLC0415 (GPU-only peer, imported when run)

    t_start = time.perf_counter()
    q = dev.queue
    out: dict[str, object] = {"local_memory_probe": probe_local_memory(dev)}
    print("dynamic local memory (a __local argument) per work-group:", out["local_memory_probe"], flush=True)
    out["mma_peak_probe"] = probe_mma_peak(dev)
    print("mma.sync alone (no memory), TFLOP/s:", out["mma_peak_probe"], flush=True)
    out["occupancy_probe"] = probe_occupancy(dev)
    print("work-groups of 256 held by one SM, by static local memory:", out["occupancy_probe"], flush=True)
    variants.NV_VERBOSE = True
    built: list = []
    real_program = gemm_launch._program

    def program(device, variant, defines):  # the program each configuration builds, for its PTX
        prg = real_program(device, variant, defines)
        built.append(prg)
        return prg

    gemm_launch._program = program
    rng = np.random.default_rng(0)
    s = args.size
    operands: dict[np.dtype, tuple] = {}
    netcl.set_matmul_precision("high")
    for dt, label, knobs in SWEEP:
        name = f"{dt.name if dt != F32 else 'tf32'}: {label}"
        params = {**(BASE32 if dt == F32 else BASE16), **knobs}
        if time.perf_counter() - t_start > args.budget:
            print(f"{name}: left out (past --budget {args.budget} s)")
            continue
        need = local_bytes(params, dt)
        if params.get("DYN_LOCAL"):
            granted = [int(kb[:-2]) * 1024 for kb, ok in out["local_memory_probe"].items() if ok == "ok"]
            if not granted or need > max(granted):
                print(f"{name}: skipped, {need} bytes of dynamic local memory not granted (probe)")
                continue
        elif need > dev.capabilities.local_mem:
            print(f"{name}: skipped, {need} bytes of local memory")
            continue
        if dt not in operands:
            operands[dt] = tuple(Tensor.from_host(q, rng.standard_normal((s, s), dtype=np.float32).astype(dt))
                                 for _ in range(2))
        try:
            built.clear()
            err = 0.0
            for m, n, k in ((37, 29, 45), (1000, 999, 517)):
                a, b = rng.standard_normal((m, k)).astype(dt), rng.standard_normal((k, n)).astype(dt)
                got = mm.gemm(Tensor.from_host(q, a), Tensor.from_host(q, b), variant="mma",
                              params=params).to_host().astype(np.float64)
                ref = tf32(a) @ tf32(b) if dt == F32 else a.astype(np.float64) @ b.astype(np.float64)
                err = max(err, float(np.abs(got - ref).max() / np.abs(ref).max()))
            a, b = operands[dt]
            sec = median_seconds(lambda a=a, b=b: mm.gemm(a, b, variant="mma", params=params), q, inner=3)
            row: dict[str, object] = {"max_rel_err": float(f"{err:.2g}"),
                                      "tflops": round(2 * s**3 / sec / 1e12, 1)}
        except Exception as exc:  # a configuration this device cannot build or run is reported, not fatal
            row = {"failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
        if args.ptx and built:
            try:
                Path(args.ptx).mkdir(parents=True, exist_ok=True)
                fname = "".join(c if c.isalnum() else "_" for c in name)[:90] + ".ptx"
                Path(args.ptx, fname).write_bytes(built[-1].cl.get_info(cl.program_info.BINARIES)[0])
            except Exception as exc:  # the PTX is a diagnostic: say why it is missing
                print(f"{name}: no PTX ({type(exc).__name__}: {exc})")
        print(f"{name}: {row}", flush=True)
        out[name] = row
    gemm_launch._program = real_program
    for dt, a_b in operands.items():  # what users get: netcl.ops.gemm.matmul's automatic choice
        if time.perf_counter() - t_start > args.budget + 15:
            break
        sec = median_seconds(lambda a_b=a_b: mm.matmul(*a_b), q, inner=3)
        key = f"{dt.name if dt != F32 else 'tf32'}: netcl matmul (automatic choice)"
        out[key] = {"tflops": round(2 * s**3 / sec / 1e12, 1)}
        print(f"{key}: {out[key]}", flush=True)
    netcl.set_matmul_precision("highest")
    for name in ("float16", "bfloat16", "tf32"):
        out[f"cuBLAS {name} {s}"] = v = cublas(torch, name, s)
        print(f"PyTorch {torch.__version__} cuBLAS {name} {s}^3: {v} TFLOP/s", flush=True)
    print(f"\nTFLOP/s at {s}^3 (ratio to cuBLAS of the same input type):")
    for key, row in out.items():
        if isinstance(row, dict) and "tflops" in row:
            ref = out[f"cuBLAS {key.split(':')[0]} {s}"]
            print(f"  {row['tflops']:7.1f}  {row['tflops'] / ref:5.2f}x  {key}")
    print(f"sweep took {time.perf_counter() - t_start:.0f} s")
    return out


# --wgmma: Hopper's warpgroup MMA (gemm_wgmma.cl) configurations, each checked and timed in its own process
# (a wrong descriptor faults the context: the next configuration must not inherit it)
WG_BASE = {"WGMMA": 1, "EMULATE": 0, "BM": 128, "BN": 128, "BK": 32, "WGS": 1, "WSTAGES": 2, "GROUP_M": 8}
WG_SWEEP = [
    (F16, {"WSTAGES": 3}),
    (F16, {"WSTAGES": 3, "WPIPE": 1}),
    (F16, {"WSTAGES": 3, "WPIPE": 1, "GROUP_M": 0}),
    (F16, {"BN": 256, "WGS": 2, "WSTAGES": 2}),
    (F16, {"BN": 256, "WGS": 2, "BK": 16, "WSTAGES": 4, "WPIPE": 1}),
    (F16, {"BM": 256, "WGS": 2, "WSTAGES": 2}),
    (BF16, {"WSTAGES": 3}),
    (BF16, {"WSTAGES": 3, "WPIPE": 1}),
    (F32, {"BK": 16, "WSTAGES": 3}),
    (F32, {"BK": 16, "WSTAGES": 3, "WPIPE": 1}),
    (F32, {"BK": 16, "WSTAGES": 3, "TF32_ROUND": 0}),
    (F32, {"BN": 64, "BK": 32, "WSTAGES": 2, "TF32_ROUND": 0}),
]


def wgmma_one(dev, dt: np.dtype, params: dict, sizes: list[int]) -> dict[str, object]:
    """One wgmma configuration: max relative error over odd shapes in each layout it takes (float32: TF32,
    K-major "nt" only), then TFLOP/s at each size, layouts nn (B MN-major) and nt (both K-major)."""
    q = dev.queue
    rng = np.random.default_rng(0)
    netcl.set_matmul_precision("high")
    layouts = ("nt",) if dt == F32 else ("nn", "nt", "tn", "tt")
    row: dict[str, object] = {}
    err = 0.0
    for m, n, k in ((136, 200, 72), (1000, 1000, 520), (64, 64, 4096)):
        for layout in layouts:
            a, b = rng.standard_normal((m, k)).astype(dt), rng.standard_normal((k, n)).astype(dt)
            got = mm.gemm(operand(q, a, layout[0] == "t"), operand(q, b, layout[1] == "t"), variant="mma",
                          params=params).to_host().astype(np.float64)
            ref = tf32(a) @ tf32(b) if dt == F32 else a.astype(np.float64) @ b.astype(np.float64)
            e = float(np.abs(got - ref).max() / np.abs(ref).max())
            row[f"err_{layout}_{m}"] = float(f"{e:.2g}")
            err = max(err, e)
    row["max_rel_err"] = float(f"{err:.2g}")
    for s in sizes:
        x = rng.standard_normal((s, s), dtype=np.float32)
        a = Tensor.from_host(q, x.astype(dt))
        for layout in layouts[:2]:
            b = operand(q, x.astype(dt), layout[1] == "t")
            sec = median_seconds(lambda a=a, b=b: mm.gemm(a, b, variant="mma", params=params), q, inner=3)
            row[f"tflops_{layout}_{s}"] = round(2 * s**3 / sec / 1e12, 1)
    return row


def wgmma_sweep(args) -> dict[str, object]:
    """--wgmma: every WG_SWEEP configuration in a child process, then cuBLAS at the same sizes."""
    import subprocess  # noqa: PLC0415

    import torch  # noqa: PLC0415 (GPU-only peer, imported when run)

    out: dict[str, object] = {}
    for dt, knobs in WG_SWEEP:
        params = {**WG_BASE, **knobs}
        name = f"{dt.name if dt != F32 else 'tf32'} " + " ".join(f"{k}{v}" for k, v in knobs.items())
        cmd = [sys.executable, __file__, "--wgmma-one", json.dumps([dt.name if dt != BF16 else "bfloat16",
                                                                     params, args.sizes])]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"failed": (done.stderr or done.stdout)[-600:]}
        except subprocess.TimeoutExpired:
            row = {"failed": f"timed out after {args.budget} s"}
        print(f"{name or 'base'}: {row}", flush=True)
        out[name or f"{dt.name} base"] = row
    for name in ("float16", "bfloat16", "tf32"):
        for s in args.sizes:
            out[f"cuBLAS {name} {s}"] = v = cublas(torch, name, s)
            print(f"PyTorch {torch.__version__} cuBLAS {name} {s}^3: {v} TFLOP/s", flush=True)
    return out


# --gpt: every GEMM shape of the 25M GPT's training step (netcl lm-train --preset 25m: llama, dim 512, SwiGLU
# hidden 1376, vocabulary 4096, batch 32 x 512 = 16384 tokens), forward y = x W^T ("nt"), grad input
# dx = g W ("nn") and grad weight dW = g^T x ("tn"), through netcl's automatic choice and torch's matmul;
# "replayed": netcl's launches recorded and replayed (device time, without the per-call host work), and
# the mma.sync kernel forced, replayed too
GPT_TOKENS = 16384
GPT_LINEARS = {"attn q/k/v/o": (512, 512), "mlp w1/w3": (512, 1376), "mlp w2": (1376, 512),
               "lm_head": (512, 4096)}


def gpt_shapes() -> list[tuple[str, int, int, int, str]]:
    rows = []
    for name, (d_in, d_out) in GPT_LINEARS.items():
        rows.append((f"{name} forward", GPT_TOKENS, d_out, d_in, "nt"))
        rows.append((f"{name} grad input", GPT_TOKENS, d_in, d_out, "nn"))
        rows.append((f"{name} grad weight", d_out, d_in, GPT_TOKENS, "tn"))
    return rows


def replay_seconds(fn, queue, repeat: int = 7, inner: int = 5) -> float:
    """Median seconds of `fn`'s device work alone: its launches recorded once (netcl.graph.Graph) and
    replayed, so that the host's per-call work (argument checks, the variant's choice) is left out."""
    from netcl.graph import Graph  # noqa: PLC0415

    fn()
    queue.finish()
    graph = Graph()
    with graph.capture():
        fn()
    seconds = median_seconds(graph.replay, queue, repeat=repeat, inner=inner)
    graph.close()
    return seconds


def gpt_tiles(dev, dt: np.dtype, tiles: list[dict], only: str = "") -> dict[str, object]:
    """--gpt --tiles: TFLOP/s of each wgmma tile (over the defaults) on each GPT GEMM shape (--only: the
    shapes whose name holds that text). A tile's "splits" is split-K's slice count (mm.gemm's `splits`)."""
    q = dev.queue
    rng = np.random.default_rng(0)
    out: dict[str, object] = {}
    print("tiles: " + " | ".join(json.dumps(t) for t in tiles))
    for name, m, n, k, layout in gpt_shapes():
        if only not in name:
            continue
        ta = operand(q, rng.standard_normal((m, k), dtype=np.float32).astype(dt), layout[0] == "t")
        tb = operand(q, rng.standard_normal((k, n), dtype=np.float32).astype(dt), layout[1] == "t")
        row = []
        for tile in tiles:
            try:
                params = {key: value for key, value in tile.items() if key != "splits"}
                splits = tile.get("splits")

                def call(ta=ta, tb=tb, params=params, splits=splits):
                    return mm.gemm(ta, tb, variant="mma", params=params, splits=splits)
                sec = replay_seconds(call, q)
                row.append(round(2.0 * m * n * k / sec / 1e12, 1))
            except Exception as exc:  # a tile this device cannot run is reported, not fatal
                row.append(f"{type(exc).__name__}")
        out[name] = row
        print(f"{name:34s} {m:6d} {n:6d} {k:6d}  " + "  ".join(f"{v:>7}" for v in row), flush=True)
    return out


def gpt_splits(dev, dt: np.dtype, slices: list[int | None]) -> dict[str, object]:
    """--gpt-splits: the GPT's weight gradients (split-K) with each slice count (None: netcl's choice), the
    GEMM launch and the slices' reduction apart: each kernel's mean event time over 20 eager calls."""
    from netcl import profiling  # noqa: PLC0415

    q = dev.queue
    rng = np.random.default_rng(0)
    out: dict[str, object] = {}
    for name, m, n, k, layout in gpt_shapes():
        if "grad weight" not in name:
            continue
        ta = operand(q, rng.standard_normal((m, k), dtype=np.float32).astype(dt), layout[0] == "t")
        tb = operand(q, rng.standard_normal((k, n), dtype=np.float32).astype(dt), layout[1] == "t")
        for s in slices:
            for _ in range(5):
                mm.gemm(ta, tb, variant="mma", splits=s)
            q.finish()
            with profiling.profile() as prof:
                for _ in range(20):
                    mm.gemm(ta, tb, variant="mma", splits=s)
                q.finish()
            kernels = {r.name: round(r.mean * 1e6, 1) for r in prof.rows("kernel")}
            total = sum(kernels.values())
            out[f"{name} S={s or 'auto'}"] = {**kernels, "us": round(total, 1),
                                               "tflops": round(2.0 * m * n * k / total / 1e6, 1)}
            parts = "  ".join(f"{key} {v} us" for key, v in kernels.items())
            print(f"{name:28s} S={str(s or 'auto'):4s} {parts}  = {total:.1f} us, "
                  f"{2.0 * m * n * k / total / 1e6:.0f} TFLOP/s", flush=True)
    return out


def torch_graphed_seconds(torch, fn, repeat: int = 7, inner: int = 5) -> float:
    """Median seconds of `fn`'s device work alone on PyTorch's side: `inner` calls captured in a CUDA graph
    and replayed (the peer of netcl's replayed figure: eager calls of a 20 us GEMM are host-bound there)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    return median_seconds(graph.replay, cuda_stream(torch), repeat=repeat) / inner


def gpt_gemms(dev, dt: np.dtype) -> dict[str, object]:
    import torch  # noqa: PLC0415 (GPU-only peer, imported when run)

    q = dev.queue
    rng = np.random.default_rng(0)
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dt.name if dt != BF16 else "bfloat16"]
    out: dict[str, object] = {}
    print(f"{'GEMM (' + str(dt) + ')':34s} {'M':>6s} {'N':>6s} {'K':>6s}  netcl TF/s  torch TF/s  ratio"
          "  replayed TF/s  torch graph  ratio  mma.sync TF/s")
    for name, m, n, k, layout in gpt_shapes():
        a = rng.standard_normal((m, k), dtype=np.float32).astype(dt)
        b = rng.standard_normal((k, n), dtype=np.float32).astype(dt)
        ta, tb = operand(q, a, layout[0] == "t"), operand(q, b, layout[1] == "t")
        sec = median_seconds(lambda ta=ta, tb=tb: mm.matmul(ta, tb), q, repeat=7, inner=5)
        dev_sec = replay_seconds(lambda ta=ta, tb=tb: mm.matmul(ta, tb), q)
        sync = replay_seconds(lambda ta=ta, tb=tb: mm.gemm(ta, tb, variant="mma", params={"WGMMA": 0}), q)
        xa = torch.tensor(a.astype(np.float32)).to("cuda", tdt)
        xb = torch.tensor(b.astype(np.float32)).to("cuda", tdt)
        if layout[0] == "t":
            xa = xa.t().contiguous().t()
        if layout[1] == "t":
            xb = xb.t().contiguous().t()
        tsec = median_seconds(lambda xa=xa, xb=xb: xa @ xb, cuda_stream(torch), repeat=7, inner=5)
        tdev = torch_graphed_seconds(torch, lambda xa=xa, xb=xb: xa @ xb)
        flops = 2.0 * m * n * k
        row = {"m": m, "n": n, "k": k, "layout": layout, "netcl_tflops": round(flops / sec / 1e12, 1),
               "torch_tflops": round(flops / tsec / 1e12, 1), "ratio": round(tsec / sec, 2),
               "replayed_tflops": round(flops / dev_sec / 1e12, 1),
               "torch_graphed_tflops": round(flops / tdev / 1e12, 1),
               "replayed_ratio": round(tdev / dev_sec, 2),
               "mma_sync_tflops": round(flops / sync / 1e12, 1)}
        out[name] = row
        print(f"{name:34s} {m:6d} {n:6d} {k:6d}  {row['netcl_tflops']:10.1f}  {row['torch_tflops']:10.1f}  "
              f"{row['ratio']:5.2f}x  {row['replayed_tflops']:13.1f}  {row['torch_graphed_tflops']:12.1f}  "
              f"{row['replayed_ratio']:4.2f}x  {row['mma_sync_tflops']:13.1f}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/gemm_mma.json")
    ap.add_argument(
        "--gpu", action="store_true", help="accepted for bench/gpu_run.sh (this bench is GPU-only)"
    )
    ap.add_argument("--sweep", action="store_true", help="the configuration sweep at 8192^3 (see above)")
    ap.add_argument("--budget", type=float, default=75.0,
                    help="--sweep: seconds after which configurations are left out")
    ap.add_argument("--size", type=int, default=8192, help="--sweep: the square problem's size")
    ap.add_argument("--ptx", default="", help="--sweep: a folder for each configuration's PTX")
    ap.add_argument("--wgmma", action="store_true", help="wgmma configurations (WG_SWEEP)")
    ap.add_argument("--sizes", type=int, nargs="*", default=[4096, 8192], help="--wgmma: square sizes timed")
    ap.add_argument("--wgmma-one", default="", help=argparse.SUPPRESS)
    ap.add_argument("--gpt", action="store_true", help="each GEMM shape of the 25M GPT's step beside torch")
    ap.add_argument("--only", default="", help="--gpt --tiles: only the shapes whose name holds this text")
    ap.add_argument("--tiles", default="", help="--gpt: a JSON list of mma tile params to time instead")
    ap.add_argument("--gpt-splits", action="store_true",
                    help="the GPT's weight gradients in 4, 8, 16 slices and netcl's choice: the GEMM and "
                         "the reduction apart")
    args = ap.parse_args()
    if args.wgmma_one:
        name, params, sizes = json.loads(args.wgmma_one)
        dt = BF16 if name == "bfloat16" else np.dtype(name)
        print(json.dumps(wgmma_one(manager.get("gpu"), dt, params, sizes)))
        return
    if args.gpt_splits:
        result = gpt_splits(manager.get("gpu"), BF16, [None, 4, 8, 16])
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        return
    if args.gpt and args.tiles:
        result = gpt_tiles(manager.get("gpu"), BF16, json.loads(args.tiles), args.only)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        return
    if args.gpt:
        dev = manager.get("gpu")
        result = {name: gpt_gemms(dev, dt) for name, dt in (("bfloat16", BF16), ("float16", F16))}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print("wrote", args.out)
        return
    if args.wgmma:
        result = wgmma_sweep(args)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print("wrote", args.out)
        return
    import torch  # noqa: PLC0415 (GPU-only peer, imported when run)

    dev = manager.get("gpu")
    q = dev.queue
    print(dev.device_name, "compute capability", dev.capabilities.nv_compute_capability, "local memory",
          dev.capabilities.local_mem)
    if args.sweep:
        result = sweep(dev, args)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print("wrote", args.out)
        return
    rng = np.random.default_rng(0)
    out: dict[str, object] = {}
    netcl.set_matmul_precision("high")
    for dt, tile in CONFIGS:
        params = {**HALF, **tile}
        name = f"{dt.name} " + " ".join(f"{k}{v}" for k, v in tile.items())
        need = local_bytes(params, dt)
        if params.get("DYN_LOCAL"):
            granted = [int(kb[:-2]) * 1024 for kb, ok in out["local_memory_probe"].items() if ok == "ok"]
            if not granted or need > max(granted):
                print(f"{name}: skipped, {need} bytes of dynamic local memory not granted (probe)")
                continue
        elif need > dev.capabilities.local_mem:
            print(f"{name}: skipped, {need} bytes of local memory")
            continue
        try:
            row: dict[str, object] = {"max_rel_err": check(q, rng, dt, params)}
            for s in (4096, 8192):
                a = Tensor.from_host(q, rng.standard_normal((s, s)).astype(dt))
                b = Tensor.from_host(q, rng.standard_normal((s, s)).astype(dt))
                sec = median_seconds(lambda a=a, b=b: mm.gemm(a, b, variant="mma", params=params), q)
                row[f"tflops_{s}"] = round(2 * s**3 / sec / 1e12, 1)
        except Exception as exc:  # a configuration this device cannot build or run is reported, not fatal
            row = {"failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(name, row, flush=True)
        out[name] = row
    for dt in (F16, BF16, F32):
        s = 4096
        a = Tensor.from_host(q, rng.standard_normal((s, s)).astype(dt))
        b = Tensor.from_host(q, rng.standard_normal((s, s)).astype(dt))
        for precision in ("highest", "high"):
            netcl.set_matmul_precision(precision)
            v = round(2 * s**3 / median_seconds(lambda a=a, b=b: mm.matmul(a, b), q) / 1e12, 1)
            out[f"auto {dt.name} {precision}"] = v
            print(f"netcl matmul (automatic choice) {dt.name} precision {precision}: {v} TFLOP/s at {s}^3")
    netcl.set_matmul_precision("highest")
    for name, tdt, allow_tf32 in (("float16", torch.float16, False), ("bfloat16", torch.bfloat16, False),
                                  ("tf32", torch.float32, True), ("float32", torch.float32, False)):
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        for s in (4096, 8192):
            a = torch.randn(s, s, device="cuda", dtype=tdt)
            b = torch.randn(s, s, device="cuda", dtype=tdt)
            for _ in range(3):
                a @ b
            torch.cuda.synchronize()
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                a @ b
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            v = round(2 * s**3 / float(np.median(times)) / 1e12, 1)
            out[f"torch {name} {s}"] = v
            print(f"PyTorch {torch.__version__} {name} {s}^3: {v} TFLOP/s", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
