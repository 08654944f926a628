"""Record a step's device work once, replay it without the Python that produced it.

A training step on a GPU is often host-bound: every op spends tens of microseconds in Python (checks,
allocation, argument packing) before its kernel is enqueued. `Graph` records what one call enqueues
(kernel launches with their arguments, device-to-device copies, fills) and `replay()` enqueues the
same work again, in order, on the same buffers:

    x = Tensor.empty(q, (128, 1, 28, 28)); y = Tensor.empty(q, (128,), np.int32)   # static inputs
    graph = Graph()
    with graph.capture():          # runs the step once, for real, and records it
        loss = train_step(model, opt, x, y)
    for xb, yb in loader:
        x.copy_(xb); y.copy_(yb)   # new data into the captured input buffers
        graph.replay()             # the same step on it; `loss` holds the new loss

What replays is exactly what was recorded, so the step must not depend on data read back to the host
(host transfers inside a capture raise GraphCaptureError), and Python-side choices taken during the
capture (shapes, algorithms, which parameters had gradients) stay fixed. State that changes from step
to step on the host is refreshed at each replay by the code that owns it: optimizers recompute their
step count and learning-rate scalars (so schedulers keep working between replays), and random ops
draw fresh counters from their generator. Every buffer the recorded work touches stays reserved for
the graph (the allocator never hands it out again) until the graph is closed or garbage-collected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pyopencl as cl

from netcl.core import backend, capture
from netcl.errors import GraphCaptureError


class Graph(capture.Recording):
    """Recorded device work of one queue (netcl.core.capture.Recording), captured by a user around a
    whole step; see the module docstring."""

    is_graph = True

    def __init__(self) -> None:
        super().__init__()
        self._buffers: dict[int, Any] = {}  # id -> buffer object the recorded work touches
        self._held_pools: dict[int, Any] = {}
        self._state = "empty"  # empty -> capturing -> ready (-> closed)

    @property
    def _ops(self) -> list:
        return self.ops

    # -- capture ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self, queue: Any = None) -> Iterator[Graph]:
        """Record the work this thread enqueues inside the block (which also runs, once)."""
        if self._state != "empty":
            raise GraphCaptureError(f"this graph was already captured ({self._state}); make a new Graph")
        if capture.capturing() is not None:
            raise GraphCaptureError("graph captures cannot be nested")
        self.queue = queue if queue is None else backend.as_queue(queue)
        self._state = "capturing"
        try:
            with capture.recording(self):
                yield self
        except BaseException:
            self._state = "failed"
            self._release_buffers()
            raise
        if not self.ops:
            self._state = "failed"
            raise GraphCaptureError("nothing was enqueued inside the capture: there is nothing to replay")
        self._state = "ready"

    def _hold(self, queue: Any, *objs: Any) -> None:
        pool = queue.device.pool
        new = [o for o in objs if isinstance(o, cl.MemoryObject) and id(o) not in self._buffers]
        for o in new:
            self._buffers[id(o)] = o
        if new:
            pool.hold_for_graph(new)
            self._held_pools[id(pool)] = pool

    def _record_launch(self, kernel: Any, queue: Any, global_size: tuple, local: Any, args: tuple) -> None:
        super()._record_launch(kernel, queue, global_size, local, args)
        self._hold(queue, *args)

    def _record_copy(self, queue: Any, dst: Any, src: Any, kwargs: dict) -> None:
        super()._record_copy(queue, dst, src, kwargs)
        self._hold(queue, dst, src)

    def _record_fill(self, queue: Any, buffer: Any, pattern: Any, offset: int, nbytes: int) -> None:
        super()._record_fill(queue, buffer, pattern, offset, nbytes)
        self._hold(queue, buffer)

    def on_replay(self, refresh: Any) -> None:
        """Call `refresh(args)` before each replay with the argument list of the launch just recorded,
        to update scalars the owner keeps on the host (step counts, learning rates, RNG counters)."""
        if self._state != "capturing":
            raise GraphCaptureError("on_replay() belongs right after a kernel launch inside a capture")
        super().on_replay(refresh)

    # -- replay -----------------------------------------------------------------------------------
    def replay(self, bind: dict[str, Any] | None = None) -> None:
        """Enqueue the recorded work again (asynchronously, like the ops themselves)."""
        if self._state != "ready":
            raise GraphCaptureError(f"replay() needs a captured graph; this one is {self._state}")
        if capture.capturing() is not None:
            raise GraphCaptureError("replay() inside a capture would record nothing; replay outside it")
        super().replay(bind)

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Forget the recorded work and give its buffers back to the allocator's normal life."""
        self.ops.clear()
        self._refresh.clear()
        self._release_buffers()
        if self._state != "empty":
            self._state = "closed"

    def _release_buffers(self) -> None:
        buffers = list(self._buffers.values())
        self._buffers.clear()
        for pool in self._held_pools.values():
            pool.release_from_graph(buffers)
        self._held_pools.clear()

    def __del__(self) -> None:
        try:
            self._release_buffers()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"Graph({self._state}, {self.launches} launches, {len(self.ops)} ops)"
