"""One rank of the fault tests (tests/distributed/test_faults.py), started by `netcl run`: argv[1] says how
rank 1
misbehaves after a first all_reduce (which creates the shared segments): crash (SIGKILL itself), hang (sleep),
exit (an exception); the other ranks then all_reduce again and report what they got on stdout."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import netcl.distributed as dist
from tests.distributed.launching import say


def main() -> None:
    mode = sys.argv[1]
    dist.init()
    x = np.arange(5000, dtype=np.float32)
    dist.all_reduce(x)
    names = [n for n in os.listdir("/dev/shm") if n.startswith(os.environ["NETCL_DIST_ID"])]
    say(f"rank {dist.rank()} job {os.environ['NETCL_DIST_ID']} named-segments {len(names)}")
    if dist.rank() == 1:
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "hang":
            time.sleep(60)
        elif mode == "exit":
            raise RuntimeError("rank 1 fails on purpose")
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
    except dist.DistributedError as exc:
        say(
            f"rank {dist.rank()} DistributedError after {time.monotonic() - t0:.1f}s "
            f"ranks={list(exc.ranks)}: "
            f"{exc}"
        )
        sys.exit(3)
    say(f"rank {dist.rank()} finished")


if __name__ == "__main__":
    main()
