"""The job this process belongs to: init() picks the backend and joins the other ranks; rank(), world_size(),
the group, and the one worker thread that runs collectives started in the background (gradient buckets).

Backend choice: NETCL_DIST_BACKEND (`shm` or `mpi`) when set; otherwise mpiexec's variables mean MPI, the
variables `netcl run` sets mean shared memory, and neither means a job of one process (every collective is
then the identity, so the same script runs alone or under `netcl run`).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from netcl import config
from netcl.distributed.group import ProcessGroup, SingleGroup
from netcl.distributed.mpi import MpiGroup
from netcl.distributed.shm import ShmGroup
from netcl.errors import DistributedError

# variables that MPI launchers set in each process they start (MPICH/Hydra, Open MPI, PMIx, Slurm's PMI)
MPI_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID")


class Work:
    """A collective running on the worker thread: wait() returns its result or raises its error."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def wait(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class Dispatcher:
    """Runs collectives in the order they are asked for: started ones (`submit`) on one worker thread, while
    `run` waits for those, then runs its own on the calling thread. Every rank asks in the same order, so the
    ranks' calls match."""

    def __init__(self) -> None:
        self._queue: deque[Work] = deque()
        self._cv = threading.Condition()
        self._pending: list[Work] = []
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], Any]) -> Work:
        work = Work(fn)
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="netcl-distributed", daemon=True)
                self._thread.start()
            self._queue.append(work)
            self._pending.append(work)
            self._cv.notify()
        return work

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                work = self._queue.popleft()
            try:
                work.result = work.fn()
            except BaseException as exc:  # handed to whoever waits on it
                work.error = exc
            work.done.set()

    def drain(self) -> None:
        """Wait for every started collective; raise the first error one of them met."""
        with self._cv:
            pending, self._pending = self._pending, []
        first: BaseException | None = None
        for work in pending:
            work.done.wait()
            if work.error is not None and first is None:
                first = work.error
        if first is not None:
            raise first

    def run(self, fn: Callable[[], Any]) -> Any:
        self.drain()
        return fn()


class _Job:
    group: ProcessGroup | None = None
    dispatcher: Dispatcher | None = None


_job = _Job()


def _choose_backend(backend: str | None) -> str:
    if backend is not None:
        if backend not in ("shm", "mpi", "single"):
            raise ValueError(f"backend {backend!r}: expected shm, mpi or single")
        return backend
    chosen = config.dist_backend()
    if chosen is not None:
        return chosen
    if any(v in os.environ for v in MPI_VARIABLES):
        return "mpi"
    if config.dist_launch() is not None:
        return "shm"
    return "single"


def init(backend: str | None = None, timeout: float | None = None) -> ProcessGroup:
    """Join this process's job (once; later calls return the same group). `backend`: shm, mpi, single or None
    (NETCL_DIST_BACKEND, else from the environment); `timeout`: seconds to wait for another rank before
    raising DistributedError (default NETCL_DIST_TIMEOUT, 60)."""
    if _job.group is not None:
        return _job.group
    kind = _choose_backend(backend)
    limit = config.dist_timeout() if timeout is None else float(timeout)
    if not limit > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if kind == "mpi":
        group: ProcessGroup = MpiGroup(limit)
    elif kind == "shm":
        launch = config.dist_launch()
        if launch is None:
            raise DistributedError(
                "the shm backend needs NETCL_RANK, NETCL_WORLD_SIZE and NETCL_DIST_ID: start the script with "
                "`netcl run --nproc N script.py`")
        rank, world, job = launch
        group = ShmGroup(rank, world, job, limit)
    else:
        group = SingleGroup()
    _job.group = group
    _job.dispatcher = Dispatcher()
    # Nothing is closed at exit on purpose: the sockets close when the process ends, so the other ranks (and
    # `netcl run`, which waits for the exit status) see a failing rank go at the moment it is gone, after its
    # traceback, not earlier from an exit handler; a worker thread still in a collective ends with it.
    return group


def is_initialized() -> bool:
    return _job.group is not None


def group() -> ProcessGroup:
    """The current job's group (init() first)."""
    if _job.group is None:
        raise DistributedError("netcl.distributed is not initialised: call netcl.distributed.init() first")
    return _job.group


def dispatcher() -> Dispatcher:
    group()
    return _job.dispatcher


def check_joined(what: str) -> None:
    """Raise when this process was started as one rank of several but has not called init() yet (rank() and
    world_size() would then answer 0 and 1)."""
    if _job.group is None and (
        any(v in os.environ for v in MPI_VARIABLES) or config.dist_launch() is not None
    ):
        raise DistributedError(
            f"{what}: this process is one rank of a job; call netcl.distributed.init() first"
        )


def rank() -> int:
    """This process's rank, 0 .. world_size() - 1 (0 before init(): a job of one)."""
    return 0 if _job.group is None else _job.group.rank


def world_size() -> int:
    """How many processes the job has (1 before init())."""
    return 1 if _job.group is None else _job.group.world_size


def backend() -> str:
    """The backend of the current job: shm, mpi or single."""
    return group().backend


def destroy() -> None:
    """Leave the job: finish the started collectives, close the sockets and shared memory (the end of the
    process
    does the same; init() may then join a new job)."""
    grp, disp = _job.group, _job.dispatcher
    _job.group = _job.dispatcher = None
    if grp is None:
        return
    try:
        if disp is not None:
            disp.drain()
    except BaseException:  # leaving anyway: the error was (or will be) raised where it was waited for
        pass
    finally:
        grp.close()
