"""Data parallelism: one process per device, gradients averaged across them.

    import netcl.distributed as dist
    dist.init()                                  # joins the job `netcl run --nproc N` (or mpiexec) started
    model = dist.DistributedDataParallel(model)  # rank 0's weights everywhere; backward averages gradients
    sampler = DistributedSampler(len(x), shuffle=True, seed=0)   # netcl.data: this rank's share of each epoch
    balancer = dist.Balancer(model, global_batch)  # or: rows of each global batch by measured speed,
    for xb, yb in balancer.batches(loader): ...    # the gradients weighted by the ranks' shares

Backends: `shm` (one host: POSIX shared memory and Unix sockets, started by `netcl run`), `mpi` (mpi4py,
started
by `mpiexec`), and a job of one process when neither launched the script. NETCL_DIST_BACKEND overrides the
choice.
"""

from netcl.distributed.balance import Balancer, batch_shares, plan_shares, proportional_shares
from netcl.distributed.collectives import all_gather, all_reduce, barrier, broadcast
from netcl.distributed.ddp import DistributedDataParallel
from netcl.distributed.group import ProcessGroup
from netcl.distributed.runtime import backend, destroy, group, init, is_initialized, rank, world_size
from netcl.errors import DistributedError

__all__ = [
    "Balancer",
    "DistributedDataParallel",
    "DistributedError",
    "ProcessGroup",
    "all_gather",
    "all_reduce",
    "backend",
    "barrier",
    "batch_shares",
    "broadcast",
    "plan_shares",
    "proportional_shares",
    "destroy",
    "group",
    "init",
    "is_initialized",
    "rank",
    "world_size",
]
