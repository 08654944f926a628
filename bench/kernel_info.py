"""What NVIDIA's OpenCL compiler made of netcl's kernels: registers, spills and stack (ptxas's own report,
through the driver's -cl-nv-verbose), the PTX (CL_PROGRAM_BINARIES) and, where a CUDA toolkit's or
Triton's `ptxas` and `cuobjdump` are on the machine, the SASS with per-kernel instruction counts.

Every program netcl builds while a small workload runs is rebuilt from source with -cl-nv-verbose (the disk
cache is bypassed for the run); the programs whose name matches --match are written to --out:
NAME.log (ptxas info), NAME.ptx, NAME.sass and a summary table on stdout.

    python3 bench/kernel_info.py --what attention --dtype bfloat16 --out /tmp/kinfo
    python3 bench/kernel_info.py --what gemm --dtype float16 --match gemm
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

os.environ["NETCL_DISK_CACHE"] = "0"  # every program built from source, so the verbose log exists
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyopencl as cl  # noqa: E402

from netcl.core import backend, dtypes  # noqa: E402

BUILT: list[tuple[str, str, str]] = []  # (name, log, ptx)


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    try:
        import triton  # a PyTorch install brings Triton, which ships ptxas and cuobjdump
        for p in Path(triton.__file__).parent.rglob(name):
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    except Exception:
        pass
    return None


def _install_hook(match: re.Pattern) -> None:
    original = backend._build_from_source

    def build(device, source, options, name):
        if not match.search(name):
            return original(device, source, options, name)
        prg = original(device, source, tuple(options) + ("-cl-nv-verbose",), name)
        log = prg.get_build_info(device.cl_device, cl.program_build_info.LOG)
        binaries = prg.get_info(cl.program_info.BINARIES)
        ptx = bytes(binaries[0]).rstrip(b"\0").decode("utf-8", "replace") if binaries and binaries[0] else ""
        BUILT.append((name, log, ptx))
        return prg

    backend._build_from_source = build


def _attention(dtype: str, d: int) -> None:
    from netcl.core.device import manager
    from netcl.core.tensor import Tensor
    from netcl.ops import attention as attn

    q = manager.default().queue
    rng = np.random.default_rng(0)
    shape = (1, 2, 256, d)
    ts = [Tensor.from_host(q, rng.standard_normal(shape).astype(dtypes.normalize(dtype))) for _ in range(4)]
    for causal in (False, True):
        out, lse = attn.flash_attention_forward(*ts[:3], causal=causal)
        attn.flash_attention_backward(*ts[:3], out, lse, ts[3], causal=causal)
    q.finish()


def _gemm(dtype: str) -> None:
    from netcl.core.device import manager
    from netcl.core.tensor import Tensor

    q = manager.default().queue
    rng = np.random.default_rng(0)
    for m, n, k in ((1024, 1024, 1024), (512, 384, 1376)):
        a = Tensor.from_host(q, rng.standard_normal((m, k)).astype(dtypes.normalize(dtype)))
        b = Tensor.from_host(q, rng.standard_normal((k, n)).astype(dtypes.normalize(dtype)))
        (a @ b).numpy()


def _sass(ptx: str, stem: Path) -> str:
    ptxas, cuobjdump = _tool("ptxas"), _tool("cuobjdump")
    if not ptxas or not cuobjdump:
        return "no ptxas/cuobjdump on this machine"
    target = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.M)
    arch = target.group(1) if target else "sm_90"
    stem.with_suffix(".ptx").write_text(ptx)
    cubin = stem.with_suffix(".cubin")
    r = subprocess.run([ptxas, f"-arch={arch}", "-v", str(stem.with_suffix(".ptx")), "-o", str(cubin)],
                       capture_output=True, text=True)
    if r.returncode:
        return "ptxas failed: " + r.stderr[-2000:]
    d = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True)
    stem.with_suffix(".sass").write_text(d.stdout)
    return r.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", choices=("attention", "gemm"), default="attention")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--d", type=int, default=64, help="attention head dim")
    ap.add_argument("--match", default="", help="regex on program names (default: the --what's kernels)")
    ap.add_argument("--wgmma-128", default="",
                    help="attention at head dim 128: these passes on wgmma (a comma list of forward, dq, "
                    "dkdv, or none: netcl.ops.attention.WGMMA_128)")
    ap.add_argument("--out", default="bench/results/kernel_info")
    a = ap.parse_args()
    if a.wgmma_128:
        from netcl.ops import attention as attn
        passes = () if a.wgmma_128 == "none" else tuple(a.wgmma_128.split(","))
        if not set(passes) <= {"forward", "dq", "dkdv"}:
            ap.error(f"--wgmma-128: a comma list of forward, dq, dkdv, got {a.wgmma_128!r}")
        attn.WGMMA_128 = passes
    match = re.compile(a.match or ("attention" if a.what == "attention" else "gemm"))
    _install_hook(match)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.what == "attention":
        _attention(a.dtype, a.d)
    else:
        _gemm(a.dtype)
    print(f"{len(BUILT)} programs built matching {match.pattern!r}")
    for i, (name, log, ptx) in enumerate(BUILT):
        stem = out / f"{i:02d}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:60]}"
        stem.with_suffix(".log").write_text(log)
        stem.with_suffix(".ptx").write_text(ptx)
        info = [ln for ln in log.splitlines() if "ptxas" in ln or "registers" in ln or "spill" in ln]
        print(f"== {name}")
        print("\n".join("   " + ln.strip() for ln in info[-12:]) or "   (no ptxas lines in the log)")
        counts = {k: len(re.findall(k, ptx)) for k in (r"mma\.sync", r"ldmatrix", r"ex2\.approx", r"shfl",
                                                        r"\bld\.local", r"\bst\.local", r"bar\.sync")}
        print("   PTX: " + ", ".join(f"{k.replace(chr(92), '')} {v}" for k, v in counts.items()))
        sass_log = _sass(ptx, stem)
        keep = [ln.strip() for ln in sass_log.splitlines() if re.search("registers|spill|failed", ln)]
        print("   ptxas (offline): " + " | ".join(keep)[:1500])


if __name__ == "__main__":
    main()
