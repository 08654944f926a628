"""What ptxas makes of the matrix-unit attention passes, without a GPU: registers, spills, local memory.

The passes' build options are taken from netcl.ops.attention as it would build them on a Hopper GPU (the
wgmma passes, NVIDIA's fast exponentials); the expanded kernel source is compiled by clang for the nvcl
target with stand-ins for the few OpenCL built-ins that have no library there, retargeted for sm_90a as
netcl.core.ptx does with the driver's PTX, and assembled by a local ptxas. The driver's own compiler is not
this clang, so the counts are estimates (the k-means kernel's registers came within ~4% of the driver's;
bench/NOTES.md), but a kernel that does not assemble here, or spills here, is worth knowing about before a
device call.

    python bench/ptx_offline.py [--d 128] [--dtype bfloat16] [--switches JSON] [--keep DIR]
                                [--clang clang-15] [--ptxas ptxas]

--switches sets netcl.ops.attention's switches first, e.g. '{"TILES_128": {"dkdv": 16}}' (the two-stage
dk/dv pass) or '{"MMA_TILES": {"dkdv_wg": {"NAME": 1}}}' (a build define of that pass).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention import check_switches, switched  # noqa: E402  (bench/attention.py)

import netcl.ops.attention as attn  # noqa: E402
from netcl import kernels  # noqa: E402
from netcl.core import ptx  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402

# clang's nvptx target has no OpenCL library: the built-ins these kernels call, written out
PRELUDE = """
#define asm __asm__
#define SREG_(name, d) ((d) == 0 ? __nvvm_read_ptx_sreg_##name##_x()                                  \\
                       : (d) == 1 ? __nvvm_read_ptx_sreg_##name##_y() : __nvvm_read_ptx_sreg_##name##_z())
#define get_local_id(d) SREG_(tid, d)
#define get_group_id(d) SREG_(ctaid, d)
#define get_local_size(d) SREG_(ntid, d)
#define get_global_id(d) (get_group_id(d) * get_local_size(d) + get_local_id(d))
#define barrier(f) __syncthreads()
#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))
#define clamp(x, lo, hi) min(max((x), (lo)), (hi))
#define mul_hi(a, b) __nvvm_mulhi_ui((a), (b))
#define fma(a, b, c) __builtin_fmaf((a), (b), (c))
#define fmax(a, b) __builtin_fmaxf((a), (b))
#define log(x) (__nvvm_lg2_approx_f(x) * 0.69314718f)
"""


class _Captured(Exception):
    pass


def attention_builds(d: int, dtype: str) -> list[tuple[str, str, dict]]:
    """(pass, file, defines) of the three matrix-unit passes at head dim d as a wgmma device builds them."""
    q = manager.default("auto").queue
    seen: list[tuple[str, dict]] = []

    def capture(device, filename, *, dtype=None, act=None, options=(), ptx_target=None, **defines):
        seen.append((filename, {**kernels.dtype_defines(dtype), **defines, "NATIVE_EXP": None}))
        raise _Captured

    x = Tensor.from_host(q, np.zeros((1, 2, 256, d), np.float32)).astype(dtype)
    saved = attn.kernels.program, attn.WGMMA_PASSES
    attn.kernels.program, attn.WGMMA_PASSES = capture, ("forward", "dq", "dkdv")
    out = []
    try:
        problem = attn._Problem("ptx_offline", x, x, x, True, None, None, 0.0, None)
        for name in ("forward", "dq", "dkdv"):
            try:
                problem.launch_mma(name)
            except _Captured:
                out.append((name, *seen[-1]))
    finally:
        attn.kernels.program, attn.WGMMA_PASSES = saved
    return out


def assemble(filename: str, defines: dict, clang: str, ptxas: str, work: Path) -> str:
    """ptxas's report (-v) for the kernel file under these defines, or the first errors."""
    lines = [f"#define {k}" if v is None else f"#define {k} {v}" for k, v in defines.items()]
    src = work / "k.cl"
    src.write_text(PRELUDE + "\n".join(lines) + "\n" + kernels.source(filename))
    out = work / "k.ptx"
    run = subprocess.run([clang, "-x", "cl", "-cl-std=CL1.2", "-Xclang", "-finclude-default-header",
                          "-target", "nvptx64-nvidia-nvcl", "-mcpu=sm_86", "-O3", "-cl-mad-enable", "-S",
                          "-o", str(out), str(src)], capture_output=True, text=True)
    if run.returncode:
        return "clang: " + " | ".join(line for line in run.stderr.splitlines() if "error" in line)[:600]
    text = out.read_text()
    calls = sorted(set(re.findall(r"call\.uni[^\n]*\n\s*(\w+)", text)))
    if calls:
        return f"calls left (add stand-ins to PRELUDE): {calls}"
    out.write_text(ptx.retarget(text, "sm_90a"))
    run = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(out), "-o", str(work / "k.cubin")],
                         capture_output=True, text=True)
    keep = [line.strip() for line in (run.stdout + run.stderr).splitlines()
            if re.search(r"error|warning|Used|spill|Performance", line)]
    return " | ".join(keep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=128, help="attention head dim (64 or 128)")
    ap.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16"))
    ap.add_argument("--switches", type=json.loads, default=None,
                    help="netcl.ops.attention's switches as a JSON object (an object's value merged into the "
                    "switch's default, a list a tuple), e.g. '{\"TILES_128\": {\"dkdv\": 16}}'")
    ap.add_argument("--clang", default="clang-15")
    ap.add_argument("--ptxas", default="ptxas")
    ap.add_argument("--keep", type=Path, default=None,
                    help="a folder for each pass's PTX and cubin (PASS.ptx, PASS.cubin: nvdisasm reads it)")
    args = ap.parse_args()
    for tool in (args.clang, args.ptxas):
        if shutil.which(tool) is None:
            sys.exit(f"bench/ptx_offline.py: {tool} is not on PATH (--clang / --ptxas name another)")
    if args.d not in (64, 128):
        sys.exit(f"bench/ptx_offline.py: --d must be 64 or 128 (the wgmma passes' head dims), got {args.d}")
    try:
        check_switches([args.switches or {}])
    except ValueError as exc:
        sys.exit(f"bench/ptx_offline.py: --switches: {exc}")
    for name, value in (args.switches or {}).items():
        setattr(attn, name, switched(getattr(attn, name), value))
    with tempfile.TemporaryDirectory() as tmp:
        for name, filename, defines in attention_builds(args.d, args.dtype):
            names = ("BM", "BN", "BQ", "KV_STAGES", "DKDV_STAGES", "WG_SS")
            tiles = {k: defines[k] for k in names if k in defines}
            report = assemble(filename, defines, args.clang, args.ptxas, Path(tmp))
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                for ext in ("ptx", "cubin"):
                    if (Path(tmp) / f"k.{ext}").exists():
                        shutil.copyfile(Path(tmp) / f"k.{ext}", args.keep / f"{name}.{ext}")
            print(f"{name:8} {tiles}\n         {report}")


if __name__ == "__main__":
    main()
