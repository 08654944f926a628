"""Can an OpenCL program on NVIDIA's driver run Hopper's wgmma? A probe (issue 25).

NVIDIA's OpenCL compiler targets plain sm_90, and its ptxas refuses sm_90a instructions (wgmma,
setmaxnreg) written as inline PTX. The driver also builds programs from PTX text
(clCreateProgramWithBinary; CL_PROGRAM_BINARIES returns PTX). So: write the sm_90a instructions behind a
"//NCWG " comment prefix in OpenCL C (the compiler passes inline asm through with its operands filled in),
take the PTX the driver made, uncomment them, raise `.target` to sm_90a, and build that PTX as a binary.

The probe checks, in order, each on one work-group of 128 work-items (one warpgroup):
  1. a trivial kernel rebuilt from its own PTX retargeted to sm_90a (does the driver take sm_90a at all?);
  2. wgmma.mma_async m64nNk16 bf16/f16 (k8 tf32) from local-memory images laid out by the host in each
     canonical layout (K-major with no swizzle / 32 / 64 / 128-byte swizzle; MN-major = transposed
     operands with 64 / 128-byte swizzle), against float64 NumPy; which descriptor fields (LBO/SBO)
     give the right product is printed, so the GEMM kernel can be written against what was seen.

    python3 bench/wgmma_probe.py [--out bench/results/wgmma_probe.json] [--ptx DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from netcl.core import ptx  # noqa: E402

MARK = ptx.MARK


def retarget(text: str) -> str:
    """netcl's own rebuild step (netcl.core.ptx): the //NCWG lines uncommented, .target sm_90a."""
    return ptx.retarget(text, "sm_90a")


def build_patched(ctx: cl.Context, dev: cl.Device, src: str, options: str = "") -> tuple[cl.Program, str]:
    first = cl.Program(ctx, src).build(options=options)
    text = first.get_info(cl.program_info.BINARIES)[0].decode()
    patched = retarget(text)
    prg = cl.Program(ctx, [dev], [patched.encode()]).build(options=options)
    return prg, patched


TRIVIAL = """
__kernel void twice(__global float *x) { const int i = get_global_id(0); x[i] = 2.0f * x[i]; }
"""


def bf16_bits(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def tf32_value(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32).astype(np.float64)


SWZ = {0: 0, 32: 1, 64: 3, 128: 7}  # 16-byte chunk index ^= (address >> 7) & mask
MODE = {0: 0, 128: 1, 64: 2, 32: 3}  # descriptor bits 62-63


def swizzle_image(lin: bytes, width: int) -> bytes:
    """Apply the wgmma swizzle of `width` bytes to a linear (row of `width` bytes) image."""
    if width == 0:
        return lin
    mask = SWZ[width]
    arr = np.frombuffer(lin, dtype=np.uint8).reshape(-1, 16)
    out = np.empty_like(arr)
    for c in range(arr.shape[0]):
        addr = c * 16
        phys = addr ^ (((addr >> 7) & mask) << 4)
        out[phys // 16] = arr[c]
    return out.tobytes()


def kmajor_image(tile: np.ndarray, width: int) -> tuple[bytes, int, int]:
    """tile: R x K (element bits, uint16 or uint32), K contiguous. Returns (image, lbo, sbo): the
    canonical K-major layout. Swizzled: rows of `width` bytes, K split into column blocks of width bytes,
    block b of all R rows at b * R * width (LBO, unused when one wgmma's K fits one block); 8-row groups
    width * 8 apart (SBO). No swizzle: 8 x 16-byte core matrices, [row group][k chunk], LBO = K-adjacent."""
    r, k = tile.shape
    esz = tile.dtype.itemsize
    if width == 0:
        kc = k * esz // 16
        parts = []
        for rg in range(r // 8):
            for c in range(kc):
                parts.append(tile[rg * 8:(rg + 1) * 8, c * 16 // esz:(c + 1) * 16 // esz].tobytes())
        return b"".join(parts), 128, kc * 128
    per_row = width // esz
    blocks = [np.ascontiguousarray(tile[:, b * per_row:(b + 1) * per_row]).tobytes()
              for b in range(k // per_row)]
    return swizzle_image(b"".join(blocks), width), r * width, 8 * width


def mnmajor_image(tile: np.ndarray, width: int) -> tuple[bytes, int, int]:
    """tile: K x R (R contiguous: the transposed operand). Swizzled MN-major: R split into blocks of width
    bytes, each block all K rows of `width` bytes (8-row K groups 8 * width apart); blocks K * width apart.
    Returns (image, block stride, 8-row-group stride)."""
    k, r = tile.shape
    esz = tile.dtype.itemsize
    per_row = width // esz
    blocks = [np.ascontiguousarray(tile[:, b * per_row:(b + 1) * per_row]).tobytes()
              for b in range(r // per_row)]
    return swizzle_image(b"".join(blocks), width), k * width, 8 * width


def desc_fields(lbo: int, sbo: int, width: int) -> int:
    return ((lbo >> 4) & 0x3FFF) << 16 | ((sbo >> 4) & 0x3FFF) << 32 | MODE[width] << 62


def wgmma_source(n: int, kind: str, ksteps: int, trans_a: int, trans_b: int, smem_vecs: int) -> str:
    nreg = n // 2
    ab = {"bf16": "bf16.bf16", "f16": "f16.f16", "tf32": "tf32.tf32"}[kind]
    k = 8 if kind == "tf32" else 16
    regs = ",".join(f"%{i}" for i in range(nreg))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nreg))
    wg = (f"{{ .reg .pred p; setp.ne.b32 p, %{nreg + 2}, 0; "
          f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ab} "
          f"{{{regs}}}, %{nreg}, %{nreg + 1}, p, 1, 1"
          + ("" if kind == "tf32" else f", {trans_a}, {trans_b}") + "; }")
    fence_ops = ", ".join(f'"+f"(d[{i}])' for i in range(nreg))
    return f"""
#define NCW(x) "{MARK}" x
__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void probe(__global const uint4 *img, const int nvec, const ulong fa, const ulong fb, const int b_off,
           __global const int *koffs, __global float *out) {{
    __local uint4 smem[{smem_vecs} + 64] __attribute__((aligned(16)));
    const int t = get_local_id(0);
    const uint raw = (uint)(ulong)smem;
    const uint off = (1024u - (raw & 1023u)) & 1023u;   /* the image starts 1024-byte aligned */
    __local uint4 *s = smem + off / 16;
    for (int i = t; i < nvec; i += 128) s[i] = img[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    asm volatile(NCW("fence.proxy.async.shared::cta;") ::: "memory");
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint base = raw + off;
    float d[{nreg}];
    for (int i = 0; i < {nreg}; ++i) d[i] = 0.0f;
    asm volatile(NCW("wgmma.fence.sync.aligned;") ::: "memory");
    for (int kk = 0; kk < {ksteps}; ++kk) {{
        const ulong da = fa | (ulong)(((base + koffs[2 * kk]) >> 4) & 0x3fffu);
        const ulong db = fb | (ulong)(((base + b_off + koffs[2 * kk + 1]) >> 4) & 0x3fffu);
        asm volatile(NCW("{wg}") : {outs} : "l"(da), "l"(db), "r"(1) : "memory");
    }}
    asm volatile(NCW("wgmma.commit_group.sync.aligned;") ::: "memory");
    asm volatile(NCW("wgmma.wait_group.sync.aligned 0;") : {fence_ops} :: "memory");
    for (int i = 0; i < {nreg}; ++i) out[t * {nreg} + i] = d[i];
}}
"""


def fragment_to_matrix(raw: np.ndarray, n: int) -> np.ndarray:
    """Accumulator registers (128 threads x n/2) to the 64 x n matrix, by mma's C-fragment layout per
    8-column chunk: warp w rows 16w.., lane l: (l/4, 2(l%4)+{0,1}), then the same rows + 8."""
    out = np.full((64, n), np.nan)
    for t in range(128):
        w, lane = divmod(t, 32)
        for i in range(n // 2):
            j, q = divmod(i, 4)
            row = 16 * w + lane // 4 + 8 * (q // 2)
            col = 8 * j + 2 * (lane % 4) + (q % 2)
            out[row, col] = raw[t, i]
    return out


def run_case(ctx, dev, queue, rng, kind, n, width_a, width_b, trans_a, trans_b, kdim, swap, ptx_dir):
    """One layout case: returns the relative error against float64, or raises."""
    esz = 4 if kind == "tf32" else 2
    kstep = 8 if kind == "tf32" else 16
    a = rng.standard_normal((64, kdim)).astype(np.float32)
    b = rng.standard_normal((n, kdim)).astype(np.float32)
    if kind == "bf16":
        abits, bbits = bf16_bits(a), bf16_bits(b)
        av, bv = bf16_value(abits), bf16_value(bbits)
    elif kind == "f16":
        abits, bbits = a.astype(np.float16).view(np.uint16), b.astype(np.float16).view(np.uint16)
        av, bv = a.astype(np.float16).astype(np.float64), b.astype(np.float16).astype(np.float64)
    else:
        abits, bbits = a.view(np.uint32), b.view(np.uint32)
        av, bv = tf32_value(a), tf32_value(b)
    ref = av @ bv.T
    ksteps = kdim // kstep

    def layout(bits, rows, trans, width):
        if trans:  # MN-major: k steps walk kstep rows of `width` bytes
            img, blk, grp = mnmajor_image(np.ascontiguousarray(bits.T), width)
            lbo, sbo = (grp, blk) if swap else (blk, grp)
            offs = [kk * kstep * width for kk in range(ksteps)]
        else:
            img, lbo, sbo = kmajor_image(bits, width)
            if swap:
                lbo, sbo = sbo, lbo
            offs = []
            for kk in range(ksteps):
                byte = kk * kstep * esz  # logical K byte offset of this step
                if width == 0:
                    offs.append(byte // 16 * 128)  # core matrices 128 bytes apart along K
                else:
                    offs.append(byte // width * rows * width + byte % width)
        return img, lbo, sbo, offs

    img_a, lbo_a, sbo_a, offs_a = layout(abits, 64, trans_a, width_a)
    img_b, lbo_b, sbo_b, offs_b = layout(bbits, n, trans_b, width_b)
    koffs = np.array([v for pair in zip(offs_a, offs_b) for v in pair], dtype=np.int32)
    pad = (-len(img_a)) % 1024
    b_off = len(img_a) + pad
    img = img_a + b"\0" * pad + img_b
    img += b"\0" * ((-len(img)) % 16)
    nvec = len(img) // 16
    src = wgmma_source(n, kind, ksteps, trans_a, trans_b, nvec)
    prg, text = build_patched(ctx, dev, src)
    if ptx_dir:
        fname = f"wgmma_{kind}_n{n}_a{width_a}{'t' if trans_a else ''}_b{width_b}{'t' if trans_b else ''}.ptx"
        Path(ptx_dir, fname).write_text(text)
    mf = cl.mem_flags
    img_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR,
                        hostbuf=np.frombuffer(img, dtype=np.uint8).copy())
    koffs_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=koffs)
    out = np.full((128, n // 2), np.nan, dtype=np.float32)
    out_buf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=out)
    prg.probe(queue, (128,), (128,), img_buf, np.int32(nvec), np.uint64(desc_fields(lbo_a, sbo_a, width_a)),
              np.uint64(desc_fields(lbo_b, sbo_b, width_b)), np.int32(b_off), koffs_buf, out_buf)
    cl.enqueue_copy(queue, out, out_buf)
    queue.finish()
    got = fragment_to_matrix(out, n)
    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    return err if np.isfinite(err) else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/wgmma_probe.json")
    ap.add_argument("--ptx", default="", help="a folder for the patched PTX of each case")
    ap.add_argument("--case", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ptx:
        Path(args.ptx).mkdir(parents=True, exist_ok=True)
    dev = next(d for p in cl.get_platforms() for d in p.get_devices() if d.type & cl.device_type.GPU)
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx)
    if args.case < 0:
        print(f"device: {dev.name} | {dev.platform.name} | driver {dev.driver_version}")
    result: dict[str, object] = {"device": dev.name, "driver": dev.driver_version}
    try:
        if args.case >= 0:
            raise StopIteration
        prg, text = build_patched(ctx, dev, TRIVIAL)
        x = np.arange(256, dtype=np.float32)
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
        prg.twice(queue, (256,), None, buf)
        y = np.empty_like(x)
        cl.enqueue_copy(queue, y, buf)
        ok = bool(np.array_equal(y, 2 * x))
        head = [ln for ln in text.splitlines() if ln.startswith((".version", ".target"))]
        print(f"1. trivial kernel rebuilt as sm_90a PTX: {'ok' if ok else 'WRONG'} ({' / '.join(head)})")
        result["sm_90a_binary"] = ok
        result["ptx_head"] = head
    except StopIteration:
        pass
    except Exception as exc:  # noqa: BLE001 (the probe reports what the driver says)
        print("1. sm_90a PTX build failed:", repr(exc)[:2000])
        result["sm_90a_binary"] = repr(exc)[:4000]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        return
    cases = probe_cases()
    if args.case >= 0:  # one case in this process (the parent runs each in its own: a fault kills a context)
        kind, n, wa, wb, ta, tb, kdim, swap = cases[args.case]
        err = run_case(ctx, dev, queue, np.random.default_rng(args.case), kind, n, wa, wb, ta, tb, kdim, swap,
                       args.ptx)
        print(json.dumps({"rel_err": err}))
        return
    import subprocess  # noqa: PLC0415

    rows = []
    for i, (kind, n, wa, wb, ta, tb, _, swap) in enumerate(cases):
        layout = f"A{'mn' if ta else 'k'}{wa} B{'mn' if tb else 'k'}{wb}"
        name = f"{kind} n{n} {layout} {'swap' if swap else 'lbo/sbo'}"
        cmd = [sys.executable, __file__, "--case", str(i)] + (["--ptx", args.ptx] if args.ptx else [])
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            row = {"case": name, **json.loads(lines[-1])} if lines else {
                "case": name, "error": (done.stderr or done.stdout).strip()[-500:]}
        except subprocess.TimeoutExpired:
            row = {"case": name, "error": "timed out"}
        rows.append(row)
        said = f"rel err {row['rel_err']:.3g}" if "rel_err" in row else f"ERROR {row['error']}"
        print(f"  {name:40s} {said}", flush=True)
    result["cases"] = rows
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


def probe_cases() -> list[tuple]:
    """(kind, n, A swizzle, B swizzle, A MN-major, B MN-major, K, LBO/SBO exchanged): K-major in each
    swizzle gemm_wgmma.cl uses, and MN-major (128-byte blocks) with both readings of LBO and SBO."""
    cases = [("bf16", 128, 128, 128, 0, 0, 64, False), ("f16", 128, 64, 64, 0, 0, 64, False),
             ("tf32", 128, 128, 128, 0, 0, 32, False), ("tf32", 64, 64, 64, 0, 0, 32, False)]
    for ta, tb in ((0, 1), (1, 0), (1, 1)):
        for swap in (False, True):
            cases.append(("bf16", 128, 128, 128, ta, tb, 64, swap))
    cases.append(("f16", 256, 128, 128, 1, 1, 64, False))
    return cases


if __name__ == "__main__":
    main()
