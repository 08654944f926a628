"""Rebuilding an NVIDIA OpenCL program from its own PTX for an arch-specific target (sm_90a: wgmma).

NVIDIA's OpenCL compiler targets the plain architecture (sm_90) and its ptxas refuses the instructions of
the arch-specific one (wgmma, setmaxnreg need sm_90a). A kernel writes such instructions behind the
comment prefix MARK in inline asm; the compiler fills in their operands like any inline asm, and
`retarget` uncomments them and raises `.target` (and `.version`, to 8.0 at least) in the PTX the driver
returns as the program's binary, which the driver then builds (bench/wgmma_probe.py showed this works).
"""

from __future__ import annotations

import re

MARK = "//NCWG "
_TARGET = re.compile(r"^(\s*\.target\s+)(sm_\d+)\b", re.MULTILINE)
_VERSION = re.compile(r"^(\s*\.version\s+)(\d+)\.(\d+)", re.MULTILINE)
_SHARED_ALIGN = re.compile(r"(\.shared\s+\.align\s+)(\d+)")


def retarget(ptx: str, target: str, shared_align: int = 0) -> str:
    """`ptx` with MARK-prefixed lines uncommented, `.target` set to `target` (e.g. "sm_90a") and
    `.version` raised to 8.0 where lower; with `shared_align`, every `.shared` variable aligned to at
    least that many bytes. ValueError if the PTX names no target (not an NVIDIA binary)."""
    if not _TARGET.search(ptx):
        raise ValueError("not PTX: no .target line (ptx.retarget takes NVIDIA OpenCL program binaries)")
    ptx = ptx.replace(MARK, "")
    ptx = _TARGET.sub(lambda m: m.group(1) + target, ptx, count=1)

    def version(m: re.Match) -> str:
        return m.group(0) if (int(m.group(2)), int(m.group(3))) >= (8, 0) else m.group(1) + "8.0"

    ptx = _VERSION.sub(version, ptx, count=1)
    if shared_align:
        ptx = _SHARED_ALIGN.sub(lambda m: m.group(1) + str(max(int(m.group(2)), shared_align)), ptx)
    return ptx
