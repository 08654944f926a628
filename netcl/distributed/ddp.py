"""DistributedDataParallel: the model replicated on every rank, its gradients averaged during backward.

Parameters are packed into buckets (NETCL_DIST_BUCKET_MB, 64 MiB; in reverse order of registration, roughly
the order backward finishes their gradients); a bucket is one flat device Tensor. When the last gradient of a
bucket is final (autograd's post-accumulate hook), the gradients are copied into it on the device, and the
bucket's all-reduce starts on the collective worker thread while backward goes on (the same path as
`all_reduce` of one Tensor, on a second queue where the device is not the CPU: on the shared-memory backend
between the device and the shared segments through a pinned buffer, the sums on the device for GPUs);
buckets start in order, so every rank starts the same collectives in the same order. At the end of backward
(a queued callback) the rest are started, every bucket is waited for and the averages are copied into
`.grad` on the device. Parameters that got no gradient on this rank take part with zeros. PyTorch's
`torch.nn.parallel.DistributedDataParallel` is the model.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyopencl as cl

from netcl import config
from netcl.autograd.engine import Parameter, queue_callback
from netcl.core import capture
from netcl.core.backend import Queue, enqueue_copy, handoff
from netcl.core.tensor import Tensor
from netcl.distributed import collectives, runtime
from netcl.distributed.runtime import Work
from netcl.errors import GraphCaptureError
from netcl.nn.module import Module


class _Bucket:
    """Parameters whose gradients travel as one all-reduce, laid end to end in one flat device Tensor."""

    def __init__(self, index: int, params: list[Parameter], queue: Queue):
        self.index = index
        self.params = params
        self.offsets = np.cumsum([0] + [p.size for p in params]).tolist()
        self.dtype = np.dtype(params[0].dtype)
        self.flat = Tensor.empty(queue, (self.offsets[-1],), self.dtype)
        self.reset()

    def reset(self) -> None:
        self.ready: set[int] = set()
        self.events: list[Any] = []
        self.work: Work | None = None
        self.submitted = 0.0  # perf_counter when its last gradient was enqueued (the all-reduce submitted)
        self.times = (0.0, 0.0, 0.0)  # perf_counter: worker started it, gradients in place, all-reduce done

    @property
    def complete(self) -> bool:
        return len(self.ready) == len(self.params)

    def slot(self, i: int) -> Tensor:
        return self.flat[self.offsets[i] : self.offsets[i + 1]]


class DistributedDataParallel(Module):
    """Wrap `module` so that backward leaves every rank with the same gradients: the mean over ranks (or, with
    `sample_share` = this rank's fraction of the global batch, the sum weighted by those fractions, for
    per-rank batches of different sizes). At construction, rank 0's parameters and buffers are copied to
    every rank. `bucket_mb`: bucket size in MiB (default NETCL_DIST_BUCKET_MB); `broadcast_buffers`: copy
    rank 0's buffers (BatchNorm's running statistics) to every rank at each training forward.
    Call netcl.distributed.init() first; every rank wraps the same model."""

    def __init__(self, module: Module, bucket_mb: float | None = None, broadcast_buffers: bool = True,
                 sample_share: float | None = None):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel wraps a netcl Module, got {type(module).__name__}")
        cap_mb = config.dist_bucket_mb() if bucket_mb is None else float(bucket_mb)
        if not cap_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {bucket_mb!r}")
        self.module = module
        self.group = runtime.group()
        self.broadcast_buffers = bool(broadcast_buffers)
        self.bucket_bytes = int(cap_mb * (1 << 20))
        params = [p for p in module.parameters() if p.requires_grad]
        state = [p.value for p in module.parameters()] + module.buffers()
        if state:
            collectives.broadcast(state, src=0)
        self.op, self.weights, self.source, self.solo = "mean", None, 0, False
        if sample_share is not None:
            share = float(sample_share)
            if not 0 < share <= 1:
                raise ValueError(f"sample_share is this rank's fraction of the global batch, in (0, 1]; got "
                                 f"{sample_share!r}")
            self.set_shares(collectives.all_gather(np.array([share], np.float64)).reshape(-1).tolist())
        device = params[0].value.device if params else None
        self._copy_queue = device.new_queue() if device is not None and device.kind != "cpu" else None
        self.buckets = self._make_buckets(params)
        self._bucket_of = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._handles = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]
        self._sync = True
        self._pass_open = False
        self._ending = False
        # buckets whose all-reduce started from a gradient hook, while backward still ran ("during"), or only
        # at its end ("at_end": the last bucket, and those behind a gradient that never came)
        self.started = {"during": 0, "at_end": 0}
        # the last synchronised backward, in seconds from its first gradient hook: when each bucket's last
        # gradient was enqueued ("submitted"), when its gradients were in place on the device and when its
        # all-reduce ended ("ready", "done"), when backward's last
        # kernel was enqueued ("enqueued") and when backward had all results ("end"); "reduce_s": each
        # bucket's all-reduce time, "exposed_s": how long backward waited for them at its end;
        # "compute_s": from this rank's forward to its last gradient on the device (its own work only),
        # "sync_s": from then until every all-reduce had ended (waiting for the other ranks included)
        self.last_pass: dict[str, Any] = {"reduce_s": [], "exposed_s": 0.0}
        self._pass_t0 = 0.0
        self._forward_t0: float | None = None
        self._next = 0

    def set_shares(self, fractions: list[float] | None) -> None:
        """Each rank's fraction of the global batch (the same list on every rank; it must add up to 1): from
        the next backward on, the gradients are summed weighted by them (netcl.distributed.Balancer calls
        it when the shares move). None: the plain mean (equal shares). A rank with fraction 0 is left out: it
        runs no forward or backward and calls idle_pass() instead; when one rank alone has a fraction (1),
        a step has no collective at all (its gradients are already the whole batch's)."""
        if fractions is None:
            self.op, self.weights, self.source, self.solo = "mean", None, 0, False
            return
        shares = np.asarray(fractions, np.float64).reshape(-1)
        if len(shares) != self.group.world_size:
            raise ValueError(f"{len(shares)} shares for {self.group.world_size} ranks")
        if not np.all(shares >= 0) or not np.any(shares > 0) or abs(shares.sum() - 1) > 1e-6:
            raise ValueError(
                f"the ranks' shares {shares.round(6).tolist()} must be >= 0 and add up to 1"
            )
        self.op, self.weights = "sum", shares.tolist()
        self.source = int(np.flatnonzero(shares > 0)[0])  # the first working rank: its buffers go to all
        self.solo = int(np.count_nonzero(shares)) == 1

    def idle_pass(self) -> None:
        """On a rank left out of a step (fraction 0): take part in the collectives the working ranks' forward
        and backward run (the buffers' broadcast, each bucket's all-reduce, adding zeros; the results are not
        used), in the same order. Nothing when one rank works alone."""
        if self.solo or self.weights is None or self.group.world_size == 1:
            return
        self._close_pass()
        if self.broadcast_buffers and self.training:
            buffers = self.module.buffers()
            if buffers:
                collectives.broadcast(buffers, src=self.source)
        for bucket in self.buckets:
            bucket.flat.fill_(0)
            bucket.events = [handoff(bucket.flat.queue)]
            bucket.work = runtime.dispatcher().submit(lambda b=bucket: self._reduce(b))
        try:
            for bucket in self.buckets:
                bucket.work.wait()
        finally:
            self._reset_pass()

    def _make_buckets(self, params: list[Parameter]) -> list[_Bucket]:
        buckets, current, size = [], [], 0
        for p in reversed(params):
            if current and (size + p.value.nbytes > self.bucket_bytes or p.dtype != current[0].dtype):
                buckets.append(_Bucket(len(buckets), current, self._copy_queue or current[0].value.queue))
                current, size = [], 0
            current.append(p)
            size += p.value.nbytes
        if current:
            buckets.append(_Bucket(len(buckets), current, self._copy_queue or current[0].value.queue))
        return buckets

    # -- forward -------------------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if capture.capturing() is not None:
            raise GraphCaptureError(
                "DistributedDataParallel cannot run inside a Graph "
                "capture: its gradient all-reduce goes through "
                "host memory, which a replay cannot redo; run the step eagerly"
            )
        self._close_pass()
        if self.broadcast_buffers and self.training and self.group.world_size > 1 and not self.solo:
            buffers = self.module.buffers()
            if buffers:
                collectives.broadcast(buffers, src=self.source)
        self._forward_t0 = time.perf_counter()  # after the broadcast: this rank's own work from here
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside the block backward only accumulates gradients locally; the next backward outside it
        averages the accumulated ones (gradient accumulation over several micro-batches)."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    # -- during backward
    # ---------------------------------------------------------------------------------------
    def _grad_ready(self, param: Parameter) -> None:
        if not self._sync or self.solo or self.group.world_size == 1 and self.weights is None:
            return
        if not self._pass_open:
            self._pass_open = True
            self._pass_t0 = time.perf_counter()
            queue_callback(self._finish_pass)
        bucket, i = self._bucket_of[id(param)]
        if i in bucket.ready:
            return
        bucket.ready.add(i)
        bucket.events.append(self._read_grad(param.grad, bucket.slot(i)))
        if bucket.complete:
            self._start_ready()

    def _read_grad(self, grad: Tensor, slot: Tensor) -> Any:
        """Copy a gradient into its place in the bucket, on the device, in order after the kernels that made
        it (its own queue: no cross-queue wait); returns the copy's event, flushed for the collective worker
        to wait on."""
        if not slot.size:  # an empty parameter: OpenCL refuses a copy of 0 bytes
            return handoff(grad.queue)
        src = grad if grad.is_contiguous() else grad.contiguous()
        event = enqueue_copy(src.queue, slot.buffer, src.buffer, byte_count=slot.nbytes,
                             src_offset=src.offset * src.itemsize, dst_offset=slot.offset * slot.itemsize)
        src.queue.cl.flush()
        return event

    def _start_ready(self) -> None:
        """Start every complete bucket whose predecessors have started (the same order on every rank)."""
        while self._next < len(self.buckets) and self.buckets[self._next].complete:
            bucket = self.buckets[self._next]
            bucket.submitted = time.perf_counter()
            bucket.work = runtime.dispatcher().submit(lambda b=bucket: self._reduce(b))
            self._next += 1
            self.started["at_end" if self._ending else "during"] += 1

    def _reduce(self, bucket: _Bucket) -> None:
        t0 = time.perf_counter()
        if bucket.events:
            cl.wait_for_events(bucket.events)
        t1 = time.perf_counter()
        collectives.all_reduce_contiguous(self.group, [bucket.flat], self.op, self.weights)
        bucket.times = (t0, t1, time.perf_counter())

    def _finish_pass(self) -> None:
        """End of backward: start the buckets left (zeros for gradients that never came), wait for all, and
        write the results into .grad."""
        self._ending = True
        for bucket in self.buckets[self._next :]:
            for i, p in enumerate(bucket.params):
                if i not in bucket.ready:
                    bucket.ready.add(i)
                    if p.grad is None:
                        bucket.slot(i).fill_(0)
                        bucket.events.append(handoff(bucket.flat.queue))
                    else:
                        bucket.events.append(self._read_grad(p.grad, bucket.slot(i)))
        self._start_ready()
        try:
            t0 = time.perf_counter()
            # this rank's compute ends when its last gradient is in its bucket (no other rank in it): the
            # speed netcl.distributed.Balancer measures
            cl.wait_for_events([e for b in self.buckets for e in b.events])
            computed = time.perf_counter()
            for bucket in self.buckets:
                bucket.work.wait()  # its results are in bucket.flat (the worker waited for its copies)
            t1, base = time.perf_counter(), self._pass_t0
            started, self._forward_t0 = self._forward_t0, None
            self.last_pass = {
                "compute_s": None if started is None else computed - started, "sync_s": t1 - computed,
                "reduce_s": [b.times[2] - b.times[1] for b in self.buckets], "exposed_s": t1 - t0,
                "submitted": [b.submitted - base for b in self.buckets],
                "ready": [b.times[1] - base for b in self.buckets],
                "done": [b.times[2] - base for b in self.buckets],
                "enqueued": t0 - base, "end": t1 - base,
            }
            for bucket in self.buckets:
                for i, p in enumerate(bucket.params):
                    if p.grad is None or not p.grad.is_contiguous():
                        p.grad = Tensor.empty(p.value.queue, p.shape, p.dtype)
                    slot, grad = bucket.slot(i), p.grad
                    if slot.size:
                            enqueue_copy(grad.queue, grad.buffer, slot.buffer, byte_count=slot.nbytes,
                                     src_offset=slot.offset * slot.itemsize,
                                     dst_offset=grad.offset * grad.itemsize)
        finally:
            self._reset_pass()

    def _close_pass(self) -> None:
        """Before a forward: a backward that stopped half way (an error) leaves started buckets; finish
        them."""
        if self._pass_open or self._next:
            try:
                for bucket in self.buckets:
                    if bucket.work is not None:
                        bucket.work.wait()
            finally:
                self._reset_pass()

    def _reset_pass(self) -> None:
        for bucket in self.buckets:
            bucket.reset()
        self._pass_open = False
        self._ending = False
        self._next = 0

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{b.flat.nbytes / 2**20:.2f}" for b in self.buckets)
        return f"world_size={self.group.world_size}, buckets MiB=[{sizes}]"
