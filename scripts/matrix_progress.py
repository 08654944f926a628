"""pytest plugin of scripts/test_matrix.py: the run's progress in a file, and what each test costs to build.

    pytest -p matrix_progress --progress-file P [--build-profile J.json] [--gpu-shaped-only PATH ...]

--progress-file: rewritten after each test as one line, "DONE TOTAL FAILED SOURCE_BUILDS BUILD_SECONDS",
so the matrix can say where each configuration is (pytest's own output goes to a log file, in blocks).
--build-profile: one JSON line per test as it finishes: its seconds (wall and CPU; children_cpu, that of the
subprocesses it waited for: launches, scripts, the docs' builds), the programs it compiled from source in this
process (netcl.core.backend.build_stats; a subprocess's builds are not counted) and the programs (kernel
file, options) it was the first test to ask for, to find where a cold run's time goes
(scripts/build_report.py sums a profile per file).
--gpu-shaped-only PATH (repeatable): of the tests under PATH (a file or folder, from the rootdir), run only
those marked gpu_shaped (the configuration that runs the GPU-shaped tests takes them from the run-once paths,
whose other tests another configuration runs).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import time
from pathlib import Path

import pytest

from netcl import kernels
from netcl.core.backend import build_stats


def _programs_held() -> list[tuple]:
    """The keys of netcl's program cache that name a build (not the per-call shortcuts), in order."""
    return [k for k in list(kernels._programs) if k[0] != "args"]


def _children_cpu() -> float:
    """User + system seconds of the subprocesses this process has waited for (a test's launches, scripts)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _program_name(key: tuple) -> str:
    """A kernel file's name, or for generated source "gen:" and a digest of its structural key (so two
    profiles can be compared program by program)."""
    if key[0] != "gen":
        return str(key[2])
    return "gen:" + hashlib.sha1(repr(key[2]).encode()).hexdigest()[:16]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("matrix_progress")
    group.addoption("--progress-file", default=None, help="write DONE TOTAL FAILED BUILDS SECONDS here")
    group.addoption("--build-profile", default=None, help="append each test's costs (JSON lines)")
    group.addoption("--gpu-shaped-only", action="append", default=[], metavar="PATH",
                    help="under PATH, run only the tests marked gpu_shaped (repeatable)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--gpu-shaped-only: deselect the tests under those paths that are not marked gpu_shaped."""
    paths = [p.rstrip("/") for p in config.getoption("--gpu-shaped-only")]
    if not paths:
        return
    keep, drop = [], []
    for item in items:
        try:
            rel = item.path.relative_to(config.rootpath).as_posix()
        except ValueError:
            rel = ""
        under = any(rel == p or rel.startswith(p + "/") for p in paths)
        (drop if under and item.get_closest_marker("gpu_shaped") is None else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


class _Progress:
    def __init__(self, progress: str | None, profile: str | None) -> None:
        self.progress = Path(progress) if progress else None
        self.profile = Path(profile) if profile else None
        self.total = 0
        self.done = 0
        self.failed = 0
        self._start: dict[str, tuple] = {}

    def write(self) -> None:
        if self.progress is None:
            return
        line = (f"{self.done} {self.total} {self.failed} {build_stats.counts['source']} "
                f"{build_stats.seconds['source']:.1f}\n")
        tmp = self.progress.with_suffix(".tmp")
        tmp.write_text(line)
        os.replace(tmp, self.progress)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.total = len(items)
        self.write()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._start[nodeid] = (time.perf_counter(), time.process_time(), build_stats.counts["source"],
                               build_stats.seconds["source"], len(_programs_held()), _children_cpu())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failed += 1

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.done += 1
        t0, c0, n0, s0, p0, k0 = self._start.pop(
            nodeid, (time.perf_counter(), time.process_time(), 0, 0.0, 0, _children_cpu()))
        row = {
            "test": nodeid, "seconds": round(time.perf_counter() - t0, 3),
            "cpu": round(time.process_time() - c0, 3),
            "children_cpu": round(_children_cpu() - k0, 3),
            "builds": build_stats.counts["source"] - n0,
            "build_seconds": round(build_stats.seconds["source"] - s0, 3),
        }
        if self.profile is not None:  # the programs this test was the first to ask for: (file, options)
            row["programs"] = [[_program_name(k), " ".join(k[3])] for k in _programs_held()[p0:]]
            with open(self.profile, "a") as f:
                f.write(json.dumps(row) + "\n")
        self.write()

    def pytest_sessionfinish(self) -> None:
        self.write()


def pytest_configure(config: pytest.Config) -> None:
    progress, profile = config.getoption("--progress-file"), config.getoption("--build-profile")
    if progress or profile:
        config.pluginmanager.register(_Progress(progress, profile), "matrix_progress_state")
