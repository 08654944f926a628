"""A netcl command (argv[3:]) run in a rank of `netcl run`, with rank argv[1]'s model slowed by argv[2]
seconds a sample in the forward DistributedDataParallel times (a device far slower than the other: the
Balancer leaves it out). For the tests of the commands' data parallelism (tests/train/test_lm.py,
test_train.py)."""

from __future__ import annotations

import sys
import time

import netcl.distributed as dist
from netcl.cli import main
from netcl.distributed.ddp import DistributedDataParallel

slow_rank, slow_s = int(sys.argv[1]), float(sys.argv[2])
wrap = DistributedDataParallel.__init__


def slowed_init(self, module, *args, **kwargs):
    wrap(self, module, *args, **kwargs)
    if dist.rank() != slow_rank:
        return
    forward = module.forward

    def slowed(x, *rest, **named):
        time.sleep(slow_s * x.shape[0])
        return forward(x, *rest, **named)

    module.forward = slowed  # an instance attribute: Module.__call__ finds it first


DistributedDataParallel.__init__ = slowed_init
sys.exit(main(sys.argv[3:]))
