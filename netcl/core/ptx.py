"""Rebuilding an NVIDIA OpenCL program from its own PTX: for an arch-specific target (sm_90a: wgmma), or with
a kernel's registers capped (`cap_registers`).

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


_ENTRY = re.compile(r"^\s*\.entry\s+(\w+)\s*\(", re.MULTILINE)


def cap_registers(ptx: str, caps: dict[str, int]) -> str:
    """`ptx` with each entry named in `caps` ("*": every entry; a name overrides it) given `.maxnreg N`
    (replacing one it had), on the line after the entry's parameter list: ptxas then allocates that entry
    within N registers by its own choice of what to keep, which can differ from the allocation it picks
    unasked at the same count (gemv_layers with the decode preload: unasked 80 registers, 8 bytes of spills
    and the work-item id read again in its GEMV loop; the same 80 asked for, none:
    netcl.ops.gemm.chain.CAP_REGISTERS). ValueError for an entry the PTX does not have or a count outside
    1-255."""
    if "*" in caps:
        caps = {**{m.group(1): caps["*"] for m in _ENTRY.finditer(ptx)},
                **{e: n for e, n in caps.items() if e != "*"}}
    for entry, n in caps.items():
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 255:
            raise ValueError(f"ptx.cap_registers: {entry}'s cap must be 1 to 255 registers, got {n!r}")
        at = next((m for m in _ENTRY.finditer(ptx) if m.group(1) == entry), None)
        if at is None:
            raise ValueError(f"ptx.cap_registers: the PTX has no entry {entry!r}")
        close = ptx.find(")", at.end())
        body = ptx.find("{", close)
        if close < 0 or body < 0:
            raise ValueError(f"ptx.cap_registers: entry {entry!r} has no body")
        head = re.sub(r"^\s*\.maxnreg\s+\d+\s*\n", "", ptx[close + 1:body], flags=re.MULTILINE).rstrip(" \t")
        ptx = ptx[:close + 1] + head + ("" if head.endswith("\n") else "\n") + f".maxnreg {n}\n" + ptx[body:]
    return ptx

