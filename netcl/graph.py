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

`compile` does all of this for a step function: one decorator, no captured inputs to manage.

    @netcl.graph.compile
    def train_step(x, y):          # Tensors in; the same Python as an eager step
        ...
        return loss
    for xb, yb in loader:
        loss = train_step(xb, yb)  # eager once, recorded on the next call, replayed after
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import backend, capture, launch_labels, profile_hooks
from netcl.core.tensor import Tensor
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
        self.__dict__.pop("_fixed", None)
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


# -- compile: a step function recorded on its second call -----------------------------------------------
class _HostTransfers(capture.Recording):
    """Watches an eager call for host transfers (what a capture would refuse), recording nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: str | None = None

    def _record_launch(self, kernel: Any, queue: Any, global_size: tuple, local: Any, args: tuple) -> None:
        if not profile_hooks.active:
            launch_labels.take_work()  # an op's declared work, consumed as a recording's launch would

    def _record_fill(self, queue: Any, buffer: Any, pattern: Any, offset: int, nbytes: int) -> None:
        pass

    def _record_copy(self, queue: Any, dst: Any, src: Any, kwargs: dict) -> None:
        if self.seen is None and not (isinstance(dst, cl.MemoryObject) and isinstance(src, cl.MemoryObject)):
            what = "a read of device data on the host" if isinstance(src, cl.MemoryObject) else (
                "a copy of host data to the device")
            self.seen = (f"it does {what} (to_host, item(), from_host, print of a tensor...) that a replay "
                         "could not redo; it runs eagerly. Return device tensors and read them after the "
                         "call to have it replayed")

    def _record_host_step(self, what: str) -> None:
        if self.seen is None:
            self.seen = (f"it calls {what}, host state a replay (which runs no Python) would leave as the "
                         "capture left it; it runs eagerly. Call it after the compiled step to have the step "
                         "replayed")

    def _name_slots(self, slots: dict[str, Any]) -> None:
        pass


class _Entry:
    """One call signature of a compiled function: its state, captured inputs, graph and outputs."""

    def __init__(self) -> None:
        self.state = "new"  # new -> eager checked -> ready; or eager (cannot be recorded)
        self.graph: Graph | None = None
        self.inputs: list[Tensor] = []
        self.outputs: Any = None


class CompiledStep:
    """A step function run eagerly once, recorded (netcl.graph.Graph) on its next call with the same
    signature, and replayed after; see `compile`."""

    def __init__(self, fn: Callable[..., Any], max_recordings: int = 16) -> None:
        if not callable(fn):
            raise TypeError(f"netcl.graph.compile takes a function, got {type(fn).__name__}")
        if not isinstance(max_recordings, int) or isinstance(max_recordings, bool) or max_recordings < 1:
            raise ValueError(f"max_recordings must be a positive int, got {max_recordings!r}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.max_recordings = max_recordings
        self._entries: dict[tuple, _Entry] = {}
        self._warned: set[str] = set()

    def _signature(self, args: tuple, kwargs: dict) -> tuple:
        """The recording's key: each Tensor argument's shape, dtype and queue; every other argument by
        value (a constant of the recording: a new value records again)."""
        key = []
        for where, value in [*enumerate(args), *sorted(kwargs.items())]:
            if isinstance(value, Tensor):
                key.append((where, "tensor", value.shape, value.dtype.str, id(value.queue)))
                continue
            if isinstance(value, np.ndarray) or hasattr(value, "value") and isinstance(
                    getattr(value, "value", None), Tensor):
                kind = "a NumPy array" if isinstance(value, np.ndarray) else "an autograd Node"
                raise TypeError(
                    f"{self.__name__}: argument {where!r} is {kind}; a compiled step takes its data as "
                    "Tensors (Tensor.from_host(queue, array); a Node's .value), so that each call's data "
                    "reaches the recorded work")
            try:
                hash(value)
            except TypeError:
                raise TypeError(f"{self.__name__}: argument {where!r} ({type(value).__name__}) is neither a "
                                "Tensor nor hashable; other arguments are constants of the recording "
                                "and key it by value") from None
            key.append((where, "const", value))
        return tuple(key)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = self._signature(args, kwargs)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self.max_recordings:
                self._warn("limit", f"{self.__name__}: {len(self._entries)} call signatures recorded "
                                    f"(max_recordings={self.max_recordings}); new ones run eagerly")
                return self.fn(*args, **kwargs)
            entry = self._entries[key] = _Entry()
        if entry.state == "eager":
            return self.fn(*args, **kwargs)
        if entry.state == "new":
            # eager, watched: a host transfer here would stop a capture halfway through the step
            watch = _HostTransfers()
            with capture.recording(watch):
                out = self.fn(*args, **kwargs)
            if watch.seen is not None:
                entry.state = "eager"
                self._warn(f"host:{key}", f"{self.__name__} cannot be recorded: {watch.seen}")
            else:
                entry.state = "checked"
            return out
        if entry.state == "checked":
            return self._capture(entry, args, kwargs)
        for static, value in zip(entry.inputs, self._tensors(args, kwargs)):
            if value is not static:
                static.copy_(value)
        entry.graph.replay()
        return entry.outputs

    @staticmethod
    def _tensors(args: tuple, kwargs: dict) -> list[Tensor]:
        return [v for v in [*args, *(kwargs[k] for k in sorted(kwargs))] if isinstance(v, Tensor)]

    def _capture(self, entry: _Entry, args: tuple, kwargs: dict) -> Any:
        """Copy the Tensor arguments into tensors of the recording's own, run the step on them while
        recording it (this call's result), and keep them: later calls copy into them and replay."""
        statics: dict[int, Tensor] = {}
        for value in self._tensors(args, kwargs):
            if id(value) not in statics:
                static = Tensor.empty(value.queue, value.shape, value.dtype)
                static.copy_(value)
                statics[id(value)] = static
        swap = lambda v: statics[id(v)] if isinstance(v, Tensor) else v  # noqa: E731
        graph = Graph()
        try:
            with graph.capture():
                out = self.fn(*(swap(a) for a in args), **{k: swap(v) for k, v in kwargs.items()})
        except GraphCaptureError as exc:
            entry.state = "eager"
            raise GraphCaptureError(
                f"{self.__name__} could not be recorded on its second call ({exc}); the step ran up to that "
                "point. It differs from its first (eager) call: keep host reads and new host data out of "
                "the step. Later calls run eagerly") from None
        entry.graph, entry.outputs, entry.state = graph, out, "ready"
        entry.inputs = [statics[id(v)] for v in self._tensors(args, kwargs)]
        return out

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def reset(self) -> None:
        """Forget every recording (their buffers go back to the allocator); the next call runs eagerly."""
        for entry in self._entries.values():
            if entry.graph is not None:
                entry.graph.close()
        self._entries.clear()

    def __repr__(self) -> str:
        states = [e.state for e in self._entries.values()]
        return f"compile({self.__name__}: {states.count('ready')} recorded, {states.count('eager')} eager)"


def compile(fn: Callable[..., Any] | None = None, *, max_recordings: int = 16) -> Any:  # noqa: A001
    """Run `fn` eagerly on its first call, record it as a Graph on its next call with the same signature
    (the shapes and dtypes of its Tensor arguments, the values of the others), and replay the recording
    on every later call after copying the new Tensor arguments into the recording's own inputs.
    tinygrad's TinyJit and torch.compile are the habits; `@compile` or `@compile(max_recordings=...)`.

    The returned value is the recording's: the same Tensors (or Nodes) each call, overwritten by the
    next one, as with CUDA graphs; read them (to_host, item) after the call. A step that reads device
    data on the host, or copies host data in, cannot be replayed: its first call sees that, warns once
    and the function keeps running eagerly. Host state that changes between calls (learning rates,
    schedulers, step counts, random counters) is refreshed by its owners at each replay, as for Graph.
    A new signature records again (at most `max_recordings`; beyond, calls run eagerly)."""
    if fn is None:
        return lambda f: CompiledStep(f, max_recordings)
    return CompiledStep(fn, max_recordings)

launch_labels.walks_through(__name__)  # netcl.profiling: a graph recording a launch: the op inside names it
