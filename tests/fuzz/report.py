"""`python -m tests.fuzz.report [--area A] [--show OUTCOME ...]`: run the fuzz table and print the counts per
area and outcome, then the cases whose outcome is not `ok` (for whichever netcl is first on PYTHONPATH, so
an older checkout can be measured with the same table)."""

from __future__ import annotations

import argparse
import json
import sys

from tests.fuzz.cases import all_cases
from tests.fuzz.runner import run_cases, table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--area", action="append", help="only these areas")
    p.add_argument("--json", help="write every outcome here")
    p.add_argument("--quiet", action="store_true", help="counts only")
    args = p.parse_args(argv)
    cases = [c for c in all_cases() if not args.area or c.area in args.area]
    results = run_cases(cases)
    print(table(results))
    if not args.quiet:
        for r in results:
            if r.outcome != "ok":
                print(f"\n[{r.outcome}] {r.case.area}/{r.case.name}: "
                      f"{r.detail.strip().splitlines()[0][:300] if r.detail else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"area": r.case.area, "name": r.case.name, "outcome": r.outcome, "detail": r.detail}
                       for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
