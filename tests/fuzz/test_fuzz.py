"""The fuzz of the public API (tests/fuzz/cases.py) as part of the suite: every case, run in a worker
process (a crash or hang is charged to its case), must do what its table row says. The areas of one test
process share a worker (a fresh one after a crash or hang): a case must not pass or fail by what ran before
it in that process (the layout caches' (2.0,) == (2,) was such a case, tests/core/test_shapes.py)."""

from __future__ import annotations

import pytest

from tests.fuzz.cases import all_cases
from tests.fuzz.runner import new_worker, run_cases, table

CASES = all_cases()
AREAS = sorted({c.area for c in CASES})


@pytest.fixture(scope="module")
def worker():
    shared = new_worker()
    yield shared
    shared.stop()


@pytest.mark.parametrize("area", AREAS)
def test_fuzz_area(area, worker):
    results = run_cases([c for c in CASES if c.area == area], timeout=300, worker=worker)
    bad = [r for r in results if r.outcome != "ok"]
    assert not bad, f"{len(bad)} of {len(results)} {area} cases misbehave:\n" + "\n".join(
        f"  [{r.outcome}] {r.case.name}: {r.detail.strip()[:400]}" for r in bad) + "\n" + table(results)


def test_the_table_is_well_formed():
    names = [f"{c.area}/{c.name}" for c in CASES]
    assert len(names) == len(set(names)), "case names repeat"
    assert len(CASES) >= 400
