"""A small generic tuner: time each candidate define set of a kernel family, keep the fastest.

Any op can use it (GEMM does, convolution can): give it the family name, a problem key, a list of
candidate define sets and a benchmark closure that builds and runs the kernel with one define set and
returns seconds (or raises when the configuration cannot build or launch on this device).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from netcl.errors import NetclError
from netcl.kernels.tuning import database_for

Candidate = dict[str, Any]


@dataclass
class TuneResult:
    """What tune_family measured: every candidate's seconds (inf when it failed) and the winner."""

    family: str
    key: str
    best: Candidate | None
    best_seconds: float
    timings: list[tuple[Candidate, float]] = field(default_factory=list)
    errors: list[tuple[Candidate, str]] = field(default_factory=list)


def time_callable(
    run: Callable[[], Any], finish: Callable[[], Any], repeats: int = 5, warmup: int = 1
) -> float:
    """Median wall seconds of `run` followed by `finish` (which waits for the device), after warm-up."""
    for _ in range(warmup):
        run()
    finish()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        finish()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def tune_family(
    device: Any,
    family: str,
    key: str,
    candidates: Sequence[Candidate],
    benchmark: Callable[[Candidate], float],
    *,
    store: bool = True,
    verbose: bool = False,
    extra: dict[str, Any] | None = None,
) -> TuneResult:
    """Run `benchmark(c)` for each candidate; store the fastest under (family, key) for `device`.

    `benchmark` returns seconds; a NetclError it raises (build or launch failure, e.g. a work-group
    too large for the device) just disqualifies that candidate.
    """
    result = TuneResult(family, key, None, math.inf)
    for cand in candidates:
        try:
            seconds = float(benchmark(cand))
        except NetclError as exc:
            result.errors.append((cand, str(exc).splitlines()[0]))
            result.timings.append((cand, math.inf))
            if verbose:
                print(f"  {family}/{key} {cand}: failed ({str(exc).splitlines()[0][:100]})")
            continue
        result.timings.append((cand, seconds))
        if verbose:
            print(f"  {family}/{key} {cand}: {seconds * 1e3:.3f} ms")
        if seconds < result.best_seconds:
            result.best, result.best_seconds = dict(cand), seconds
    if store and result.best is not None:
        database_for(device).put(
            family, key, result.best, seconds=result.best_seconds, candidates=len(candidates), **(extra or {})
        )
    return result
