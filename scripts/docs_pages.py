#!/usr/bin/env python
"""Run the guide's pages on this machine's default device and print what each block prints.

    .venv/bin/python scripts/docs_pages.py                          # every page of docs/
    python3 scripts/docs_pages.py paths/kernels/gemm.md paths/numpy/transfers.md   # some pages

The same runner as the site build and tests/docs (docs/hooks/run_code.py: a page's python blocks in order
in one namespace, in a temporary directory), but a failing page is reported and the next one runs, so the
guide can be tried on another device (NETCL_DEVICE=gpu) in one go. Exit status 1 if any page failed.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def load_runner():
    spec = importlib.util.spec_from_file_location("netcl_docs_run_code", DOCS / "hooks" / "run_code.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    runner = load_runner()
    pages = argv or sorted(
        p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "hooks" not in p.parts
    )
    failed = []
    for page in pages:
        markdown = (DOCS / page).read_text()
        if not runner.python_blocks(markdown):
            continue
        start = time.perf_counter()
        print(f"===== {page}", flush=True)
        try:
            results = runner.run_page(page, markdown)
        except Exception:  # a page that fails is reported; the others still run
            traceback.print_exc(limit=3, file=sys.stdout)
            failed.append(page)
            continue
        for block, result in zip(runner.python_blocks(markdown), results):
            if result["stdout"].strip():
                print(f"--- line {block.line}\n{result['stdout'].rstrip()}")
            if result["figures"]:
                print(f"--- line {block.line}: {len(result['figures'])} figure(s)")
        print(f"({time.perf_counter() - start:.1f} s)", flush=True)
    print(
        f"{len(pages) - len(failed)} pages ran, {len(failed)} failed"
        + (f": {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
