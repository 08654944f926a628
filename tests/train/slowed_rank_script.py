"""A netcl command (argv[2:]) run in a rank of `netcl run`, with rank argv[1]'s GPT forward slowed by SLOW_S
a sample (a device far slower than the other: the Balancer leaves it out). For the tests of the commands'
data parallelism (tests/train/test_lm.py)."""

from __future__ import annotations

import sys
import time

import netcl.distributed as dist
from netcl.cli import main
from netcl.models import GPT

SLOW_S = 0.2

slow_rank = int(sys.argv[1])
forward = GPT.forward


def slowed(self, x, *args, **kwargs):
    if dist.rank() == slow_rank:
        time.sleep(SLOW_S * x.shape[0])
    return forward(self, x, *args, **kwargs)


GPT.forward = slowed
sys.exit(main(sys.argv[2:]))
