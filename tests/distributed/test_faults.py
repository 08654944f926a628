"""Faults: a rank that crashes, fails or hangs makes the others raise DistributedError naming it; `netcl run`
ends
the rest and exits non-zero; no shared memory is left in /dev/shm on any of these ways out (kill -9
included)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.distributed.launching import HERE, ROOT, environment, netcl_run, shm_names


def _job(res) -> str:
    jobs = {m.group(1) for m in re.finditer(r"job (\S+) named-segments 0", res.stdout)}
    assert len(jobs) == 1, res.stdout  # every rank ran, and no segment was named after the first collective
    return jobs.pop()


@pytest.mark.parametrize("mode,status,nproc", [("crash", 128 + signal.SIGKILL, 3), ("exit", 1, 2)])
def test_a_rank_that_dies_is_named_by_the_others(mode, status, nproc):
    res = netcl_run(nproc, "fault_script.py", mode, NETCL_DIST_TIMEOUT="30")
    # the launcher exits with the first failure it sees: the dead rank's status, or on a loaded machine the
    # status (3) of a rank that named it first (their waits race); never 0
    assert res.returncode in (status, 3), (res.stdout, res.stderr[-2000:])
    errors = res.lines("rank 0 DistributedError") + res.lines("rank 2 DistributedError")
    assert len(errors) == nproc - 1, (res.stdout, res.stderr[-2000:])
    for line in errors:
        assert "ranks=[1]" in line and "rank 1" in line
        # seen when the rank died, not at the 30 s timeout (generous: CI machines are loaded)
        assert float(re.search(r"after ([\d.]+)s", line).group(1)) < 20
    kind = "was killed by signal 9" if mode == "crash" else "exited with status 1"
    assert "rank 1 (pid" in res.stderr and kind in res.stderr
    assert shm_names(_job(res)) == []


def test_a_hung_rank_is_named_within_the_timeout_and_ended():
    res = netcl_run(2, "fault_script.py", "hang", NETCL_DIST_TIMEOUT="1.5")
    assert res.returncode == 3, (res.stdout, res.stderr[-2000:])  # rank 0's exit status: the first failure
    (line,) = res.lines("rank 0 DistributedError")
    assert "ranks=[1]" in line and "did not reach all_reduce" in line and "within 1.5 s" in line
    assert 1.4 < float(re.search(r"after ([\d.]+)s", line).group(1)) < 20  # the 1.5 s timeout, not a hang
    assert "ending rank 1" in res.stderr  # the launcher killed the hung rank
    assert res.seconds < 90  # ended, not left hanging to the 120 s run limit
    assert shm_names(_job(res)) == []


def test_killing_the_launcher_takes_the_ranks_and_leaves_no_shared_memory():
    cmd = [sys.executable, "-m", "netcl.cli", "run", "--nproc", "2", str(HERE / "fault_script.py"), "hang"]
    proc = subprocess.Popen(cmd, env=environment(NETCL_DIST_TIMEOUT="60"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 60
    while len(lines) < 2 and time.monotonic() < deadline:
        lines.append(
            proc.stdout.readline()
        )  # both ranks have done a collective (segments made, then unlinked)
    job = re.search(r"job (\S+)", lines[0]).group(1)
    ranks = [
        int(p)
        for p in subprocess.run(
            ["pgrep", "-f", str(HERE / "fault_script.py")], capture_output=True, text=True
        ).stdout.split()
        if int(p) != proc.pid
    ]
    proc.kill()  # kill -9 of the launcher: no cleanup code of its own runs
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in ranks):
        time.sleep(0.05)
    assert ranks and not any(_alive(pid) for pid in ranks)
    assert shm_names(job) == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False
