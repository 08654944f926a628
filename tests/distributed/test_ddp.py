"""DistributedDataParallel: 2 (and 3) ranks, each on its share of every batch, end with the parameters one
process
gets on the concatenated batch (5 AdamW steps, float32 tolerance); over shared memory and over MPI."""

from __future__ import annotations

import re

import numpy as np
import pytest

from netcl import optim
from netcl.data import DataLoader, DistributedSampler
from tests.distributed import ddp_script
from tests.distributed.launching import mpi_available, mpiexec, netcl_run


@pytest.fixture(scope="module")
def single_process(queue):
    """The parameters after 5 steps of one process on the whole batch of 24."""
    model = ddp_script.build(queue)
    x, y = ddp_script.data()
    batch = ddp_script.BATCH * 2
    sampler = DistributedSampler(len(x), 1, 0, shuffle=True, seed=5, shares=[batch])
    ddp_script.train(
        model, DataLoader((x, y), batch, queue, sampler=sampler), optim.AdamW(model.parameters(), lr=0.05)
    )
    return {k: v.to_host() for k, v in model.state_dict().items()}


def _check(path, reference):
    got = np.load(path)
    assert sorted(got.files) == sorted(reference)
    for name, want in reference.items():
        # Adam divides by sqrt(v): a near-zero gradient turns float32 rounding of the mean into ~1e-4 relative
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("nproc,bucket_mb", [(2, "0.0005")])  # 3 processes: test_collectives.py
def test_ddp_matches_one_process_on_the_whole_batch(tmp_path, single_process, nproc, bucket_mb):
    out = tmp_path / "params.npz"
    res = netcl_run(nproc, "ddp_script.py", str(out), bucket_mb)  # 512-byte buckets: several per backward
    assert res.returncode == 0, res.stderr[-3000:]
    _check(out, single_process)
    # the ranks' lines are searched in the whole output (their writes can interleave in the shared pipe)
    assert res.stdout.count("no_sync and unused parameters ok") == nproc, res.stdout
    stats = re.findall(r"buckets (\d+) .*? during backward (\d+) at its end (\d+)", res.stdout)
    assert len(stats) == nproc, res.stdout
    # every bucket of each of the 5 steps started while backward still ran
    for buckets, during, at_end in (map(int, s) for s in stats):
        assert buckets >= 3 and during == buckets * 5 and at_end == 0, res.stdout


NO_MPI = "mpi4py and an MPI runtime (pip install 'netcl[mpi]') are not installed"


@pytest.mark.skipif(not mpi_available(), reason=NO_MPI)
def test_ddp_over_mpi_matches_one_process(tmp_path, single_process):
    out = tmp_path / "params.npz"
    res = mpiexec(2, "ddp_script.py", str(out), "0.0005")
    assert res.returncode == 0, res.stderr[-3000:]
    _check(out, single_process)
