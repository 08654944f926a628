"""Data parallelism: one process per device, gradients averaged across them.

    import netcl.distributed as dist
    dist.init()                                  # joins the job `netcl run --nproc N` (or mpiexec) started
    model = dist.DistributedDataParallel(model)  # rank 0's weights everywhere; backward averages gradients
    sampler = DistributedSampler(len(x), shuffle=True, seed=0)   # netcl.data: this rank's share of each epoch

Backends: `shm` (one host: POSIX shared memory and Unix sockets, started by `netcl run`), `mpi` (mpi4py,
started
by `mpiexec`), and a job of one process when neither launched the script. NETCL_DIST_BACKEND overrides the
choice.
"""

from netcl.distributed.collectives import all_gather, all_reduce, barrier, batch_shares, broadcast
from netcl.distributed.ddp import DistributedDataParallel
from netcl.distributed.group import ProcessGroup
from netcl.distributed.runtime import backend, destroy, group, init, is_initialized, rank, world_size
from netcl.errors import DistributedError

__all__ = [
    "DistributedDataParallel",
    "DistributedError",
    "ProcessGroup",
    "all_gather",
    "all_reduce",
    "backend",
    "barrier",
    "batch_shares",
    "broadcast",
    "destroy",
    "group",
    "init",
    "is_initialized",
    "rank",
    "world_size",
]
