"""The many-host backend: the same collectives over MPI (mpi4py), for jobs launched with
`mpiexec -n N python script.py`. netcl writes no networking of its own; MPI moves and sums the bytes.

MPI's blocking collectives cannot be interrupted, so each is started non-blocking and polled: a rank that
does not arrive within the timeout makes the others raise DistributedError (MPI cannot say which rank it
is: MPI reports crashed ranks itself and mpiexec ends the job).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.distributed.group import ProcessGroup, c_order, check_op
from netcl.errors import DistributedError


def load_mpi() -> Any:
    """mpi4py's MPI module (importing it initialises MPI, so it is imported only when this backend is
    chosen)."""
    try:
        from mpi4py import MPI  # noqa: PLC0415  (optional dependency: the `mpi` extra; importing it starts MPI)
    except ImportError as exc:
        raise DistributedError(
            f"NETCL_DIST_BACKEND=mpi needs mpi4py and an MPI library: pip install 'netcl[mpi]' (mpi4py and "
            f"MPICH's wheels), or mpi4py against your cluster's MPI ({exc})") from None
    return MPI


class MpiGroup(ProcessGroup):
    """MPI.COMM_WORLD as a ProcessGroup."""

    backend = "mpi"

    def __init__(self, timeout: float, comm: Any = None):
        self.MPI = load_mpi()
        self.comm = comm if comm is not None else self.MPI.COMM_WORLD
        super().__init__(self.comm.Get_rank(), self.comm.Get_size())
        self.timeout = timeout
        self.calls = 0
        self._ops = {"sum": self.MPI.SUM, "mean": self.MPI.SUM, "max": self.MPI.MAX, "min": self.MPI.MIN,
                     "prod": self.MPI.PROD}

    def _wait(self, request: Any, what: str) -> None:
        """Poll a non-blocking collective until it completes or the timeout runs out."""
        call = self.calls
        self.calls += 1
        if request.Test():
            return
        deadline = time.monotonic() + self.timeout
        pause = 1e-5
        while not request.Test():
            if time.monotonic() > deadline:
                raise DistributedError(
                    f"{what} (collective #{call}) did not complete within {self.timeout:g} s "
                    f"(NETCL_DIST_TIMEOUT) "
                    f"on rank {self.rank} of {self.world_size}: another rank is hung, has failed, or made a "
                    "different call (MPI cannot tell which)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def all_reduce(self, array: np.ndarray, op: str = "sum", weights: Sequence[float] | None = None) -> None:
        array = self.check_array(array, "all_reduce")
        op = check_op(op, array.dtype, weights)
        if weights is not None:
            np.multiply(array, weights[self.rank], out=array)
        self._wait(self.comm.Iallreduce(self.MPI.IN_PLACE, array, self._ops[op]), f"all_reduce({op})")
        if op == "mean":
            np.multiply(array, 1.0 / self.world_size, out=array, casting="unsafe")

    def broadcast(self, array: np.ndarray, root: int = 0) -> None:
        array = self.check_array(array, "broadcast")
        root = self.check_root(root)
        self._wait(self.comm.Ibcast(array, root=root), f"broadcast from rank {root}")

    def all_gather(self, array: np.ndarray) -> np.ndarray:
        array = c_order(array)
        out = np.empty((self.world_size,) + array.shape, array.dtype)
        self._wait(self.comm.Iallgather(array, out), "all_gather")
        return out

    def barrier(self) -> None:
        self._wait(self.comm.Ibarrier(), "barrier")
