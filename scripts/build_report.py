#!/usr/bin/env python
"""Where a cold test run's time goes: the build profile that scripts/test_matrix.py writes, summed per file.

    .venv/bin/python scripts/build_report.py LOGS/pocl-system.jsonl [--top 30]
    .venv/bin/python scripts/build_report.py A.jsonl --only-in B.jsonl     # programs A builds and B does not

Each line of a profile (scripts/matrix_progress.py, --build-profile) is one test: its wall and CPU
seconds, the programs it compiled from source (netcl.core.backend.build_stats; the subprocesses a test
starts are not counted) and the programs (kernel file or generated source, options) it was the first test
of its process to ask for. The report sums them per test file, largest build seconds first, then counts
the distinct programs per kernel file. --only-in lists the programs of the first profile that the second
never asks for: what a configuration would stop building if it ran the second's tests instead.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def programs(rows: list[dict]) -> dict[tuple[str, str], str]:
    """(kernel file, options) -> the first test that asked for it."""
    out: dict[tuple[str, str], str] = {}
    for row in rows:
        for name, options in row.get("programs", []):
            out.setdefault((name, options), row["test"])
    return out


def per_file(rows: list[dict]) -> list[tuple[str, list[float]]]:
    sums: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0, 0.0, 0.0])
    for row in rows:
        s = sums[row["test"].split("::")[0]]
        s[0] += 1
        s[1] += row["seconds"]
        s[2] += row["cpu"]
        s[3] += row["builds"]
        s[4] += row["build_seconds"]
        s[5] += row.get("children_cpu", 0.0)  # (profiles older than the field: 0)
    return sorted(sums.items(), key=lambda kv: -kv[1][4])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile", type=Path, help="a .jsonl build profile")
    p.add_argument("--top", type=int, default=30, help="test files to list (largest build seconds first)")
    p.add_argument("--only-in", type=Path, default=None, help="list the programs the profile builds and "
                   "this second profile does not")
    args = p.parse_args(argv)
    rows = load(args.profile)
    files = per_file(rows)
    total = [sum(s[i] for _, s in files) for i in range(6)]
    print(f"{args.profile}: {len(rows)} tests, {total[1]:.0f} s wall, {total[2]:.0f} s CPU "
          f"(+ {total[5]:.0f} s of subprocesses), {total[3]:.0f} programs built from source in "
          f"{total[4]:.0f} s")
    print(f"{'test file':<52} {'tests':>5} {'wall s':>7} {'CPU s':>6} {'sub s':>6} {'builds':>6} "
          f"{'build s':>7}")
    for name, (n, wall, cpu, builds, build_s, sub) in files[:args.top]:
        print(f"{name:<52} {n:>5} {wall:>7.1f} {cpu:>6.1f} {sub:>6.1f} {builds:>6.0f} {build_s:>7.1f}")
    if len(files) > args.top:
        rest = [sum(s[i] for _, s in files[args.top:]) for i in range(6)]
        label = f"({len(files) - args.top} more files)"
        print(f"{label:<52} {rest[0]:>5.0f} {rest[1]:>7.1f} {rest[2]:>6.1f} {rest[5]:>6.1f} {rest[3]:>6.0f} "
              f"{rest[4]:>7.1f}")
    held = programs(rows)
    kinds = Counter("generated (JIT)" if name.startswith("gen:") else name for name, _ in held)
    print(f"\n{len(held)} distinct programs (kernel file, options), by file: "
          + ", ".join(f"{k} {v}" for k, v in kinds.most_common()))
    if args.only_in is not None:
        other = programs(load(args.only_in))
        missing = {k: t for k, t in held.items() if k not in other}
        print(f"\n{len(missing)} of them never asked for in {args.only_in}:")
        for (name, options), test in sorted(missing.items()):
            print(f"  {name} {options}\n      first: {test}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
