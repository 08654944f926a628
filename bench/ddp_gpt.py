"""Where a data-parallel GPT step spends its time: lm-train's model and step (forward, cross entropy, backward
with DistributedDataParallel's all-reduce, clipping, AdamW), timed per rank, beside the same step without
communication (DDP's no_sync) and a one-process run. Launch one process per device:

    python bench/ddp_gpt.py --preset 25m --batch-size 16                 # one process, no DDP
    netcl run --nproc 2 bench/ddp_gpt.py --preset 25m --batch-size 16    # two ranks (one GPU each)

Each rank prints its device, the median step time with DDP and with no_sync (no all-reduce: what the step
costs when the ranks only compute), and the time backward waits for the last buckets at its end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import netcl.distributed as dist  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.models import GPT  # noqa: E402
from netcl.train.lm import PRESETS, _model_config, lm_step, make_optimizer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--batch-size", type=int, default=None, help="per rank (default: the preset's)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval in seconds (how soon the collective worker gets the GIL)")
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    s = dict(PRESETS[args.preset], weight_decay=0.1, arch="llama", kv_heads=None, dropout=0.0)
    batch = args.batch_size or s["batch_size"]
    distributed = "NETCL_RANK" in os.environ
    if distributed:
        dist.init()
    q = manager.default("auto").queue
    model = GPT(q, _model_config(s, args.vocab))
    opt = make_optimizer(model, s)
    ddp = dist.DistributedDataParallel(model) if distributed else None
    rng = np.random.default_rng(dist.rank() if distributed else 0)
    data = rng.integers(0, args.vocab, (batch, s["context"] + 1)).astype(np.int32)
    ids, targets = Tensor.from_host(q, data[:, :-1].copy()), Tensor.from_host(q, data[:, 1:].copy())

    def timed(n: int, sync: bool) -> list[float]:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            if ddp is not None and not sync:
                with ddp.no_sync():
                    loss = lm_step(model, opt, ids, targets, 1.0, None, ddp)
            else:
                loss = lm_step(model, opt, ids, targets, 1.0, None, ddp)
            loss.to_host()
            times.append(time.perf_counter() - t0)
        return times

    timed(args.warmup, True)
    with_comm, exposed, reduce_s = [], [], []
    for _ in range(args.steps):
        with_comm += timed(1, True)
        if ddp is not None:
            exposed.append(ddp.last_pass["exposed_s"])
            reduce_s.append(sum(ddp.last_pass["reduce_s"]))
    without = timed(args.steps, False) if ddp is not None else []
    if distributed:
        dist.barrier()
    rank = dist.rank() if distributed else 0
    med = statistics.median(with_comm) * 1e3
    rate = batch * s["context"] / med * 1e3
    line = f"rank {rank} on {q.device.describe()}: step {med:.1f} ms ({rate:,.0f} tok/s)"
    if without:
        line += f", no_sync {statistics.median(without) * 1e3:.1f} ms"
        line += f"; {ddp.extra_repr()}, buckets started {ddp.started}"
        line += (f"; all-reduce {statistics.median(reduce_s) * 1e3:.1f} ms a step, of which backward waited "
                 f"{statistics.median(exposed) * 1e3:.1f} ms at its end")
    if ddp is not None:
        lp = ddp.last_pass
        ms = lambda xs: "[" + ", ".join(f"{x * 1e3:.1f}" for x in xs) + "]"  # noqa: E731
        line += (f"\n  rank {rank} last pass (ms from its first gradient): "
                 f"buckets submitted {ms(lp['submitted'])}, "
                 f"ready {ms(lp['ready'])}, "
                 f"reduced {ms(lp['done'])}; backward enqueued {lp['enqueued'] * 1e3:.1f}, "
                 f"all done {lp['end'] * 1e3:.1f}")
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
