"""netcl.distributed collectives across processes on the PoCL CPU device: every op on odd sizes, host arrays
and
tensors, host and device sums, against float64 NumPy (tests/distributed/collectives_script.py does the checks
inside each rank)."""

from __future__ import annotations

import pytest

from tests.distributed.launching import mpi_available, mpiexec, netcl_run


@pytest.mark.parametrize("nproc", [3])  # 2 processes: test_ddp.py and the MPI case below
def test_collectives_on_shared_memory(nproc):
    res = netcl_run(nproc, "collectives_script.py")
    # the first rank to fail writes first: its error heads the output, the others' ("rank R exited") end it
    err = res.stderr
    assert res.returncode == 0, err if len(err) <= 6000 else err[:4000] + "\n...\n" + err[-2000:]
    # every rank names the mismatch and finishes (searched in the whole output: the ranks share one pipe,
    # so one rank's line can land inside another's on a loaded machine)
    for r in range(nproc):
        assert f"rank {r} mismatch named: " in res.stdout and f"rank {r} ok" in res.stdout, res.stdout[-3000:]


NO_MPI = "mpi4py and an MPI runtime (pip install 'netcl[mpi]') are not installed"


@pytest.mark.skipif(not mpi_available(), reason=NO_MPI)
def test_collectives_over_mpi():
    res = mpiexec(2, "collectives_script.py")
    assert res.returncode == 0, res.stderr[-3000:]
    # searched in the whole output: mpiexec forwards the ranks' writes in pieces ("rank 0 okrank 1 ok")
    assert "rank 0 ok" in res.stdout and "rank 1 ok" in res.stdout, res.stdout
