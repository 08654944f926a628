"""Recording device work, and replaying it without the Python that made it.

While a thread records (`with recording(rec):`), every kernel launch, device copy and fill it enqueues
is also handed to each active Recording; `rec.replay()` enqueues the same work again, in order. Kernel
arguments that change from replay to replay are *slots*: right after a launch, its launcher names them
(`name_slots(a=("A", "a_off"))`: the tensor bound to slot `a` gives the kernel's arguments A (its
buffer) and a_off (its offset)), and `replay(bind={"a": tensor})` fills them in. This one mechanism
serves netcl.graph.Graph (a user's whole training step, recorded once) and the ops that replay their
own launches from call to call (the GEMM's fast path: netcl.ops.gemm).

Recordings nest: a GEMM recording its template inside a user's graph capture sends its launches to
both. `capturing()` answers the innermost *graph* (the recording ops must not do host transfers in,
and that refreshes step counts and random counters at each replay).

`plans` is the one cache of the ops' launch plans (netcl.core.backend.Plan, an op's template Recording, and
what the op keeps beside them), keyed by call signature: the op's name, then every value of the call its
choices read (device, shapes, strides, offsets where they matter, dtypes, epilogue). What a plan reads beyond
its call (the tuning database, NETCL_* knobs) is read when the plan is built, never per call; one rule keeps
that true: whatever changes it empties the cache (`plans.invalidate()`: the tuning database does when it
writes a record or re-reads its file).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import launch_labels, profile_hooks
from netcl.core.access import before_access
from netcl.errors import GraphCaptureError


class PlanCache(dict):
    """The ops' launch plans by call signature (see the module docstring). A dict whose keys begin with the
    op's name ("gemm", "ew", "reduce"); `put` bounds its size, `invalidate` empties it."""

    LIMIT = 8192

    def put(self, key: tuple, plan: Any) -> Any:
        if len(self) >= self.LIMIT:
            self.clear()  # a program that makes unbounded signatures rebuilds plans instead of growing
        self[key] = plan
        return plan

    def invalidate(self) -> None:
        """Forget every plan: something a plan read when it was built (a tuning record) has changed."""
        self.clear()


plans = PlanCache()


def call_key(op: str, tensors: tuple, *values: Any, align: int | None = 1) -> tuple | None:
    """The signature of an op's call, as a key of `plans` for the call's whole fast path (its checks made
    once, then the launch replayed): per tensor what the op's checks and choices read (its queue, shape,
    strides, dtype, and its offset modulo `align`: 1 when only the offset's value is passed on, 4 where
    4-wide loads need a multiple of 4, None: the offset itself, where the launch keeps it) or None, then
    `values` (the other arguments, the module switches the op reads); None when something is not hashable
    (the op then takes its slow path)."""
    try:
        key = (op, *[None if t is None else (id(t.queue), t.shape, t.strides, t.dtype,
                                             t.offset if align is None else t.offset % align)
                     for t in tensors], *values)
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: list[Recording] = []
        self.paused = 0


_state = _State()
# recordings open now in any thread: while none is, a launch skips asking its own thread's (the usual eager
# case: one module global read per launch instead of a call)
open_recordings = 0
_open_lock = threading.Lock()


class Recording:
    """Device work of one queue: ("k", kernel, global, local, args, slots) | ("copy", dst, src, kwargs) |
    ("fill", buffer, pattern, offset, nbytes); a launch ends with its profiling site (netcl.profiling) or
    None, and in an op's template (unbind()) with its Plan. `is_graph` marks a user-level graph (see
    capturing())."""

    is_graph = False

    def __init__(self) -> None:
        self.replayable = True
        self.queue: Any = None
        self.ops: list[list[Any]] = []
        self._refresh: list[tuple[int, Callable[[list], None]]] = []

    # -- recording (called by the backend while this recording is active) ------------------------
    def _check_queue(self, queue: Any, what: str) -> None:
        if self.queue is None:
            self.queue = queue
        elif queue is not self.queue:
            raise GraphCaptureError(
                f"{what} on a second queue inside one capture; a recording replays on one queue "
                f"({self.queue!r}, got {queue!r})"
            )

    def _record_launch(self, kernel: Any, queue: Any, global_size: tuple, local: Any, args: tuple) -> None:
        self._check_queue(queue, f"kernel {kernel.name} launched")
        # the launch's op, scope and declared work, for the profile of its replays (ops declare work while
        # recording, see declaring(); without a profile running, the backend does not consume it: done here)
        site = launch_labels.recorded_site()
        if not profile_hooks.active:
            launch_labels.take_work()
        self.ops.append(["k", kernel, global_size, local, list(args), None, site])

    def _record_copy(self, queue: Any, dst: Any, src: Any, kwargs: dict) -> None:
        if not (isinstance(dst, cl.MemoryObject) and isinstance(src, cl.MemoryObject)):
            if not self.is_graph:  # an op's own template: it just cannot be replayed
                self.replayable = False
                return
            raise GraphCaptureError(
                "a host transfer (to_host, from_host, copy_from_host, .item()...) inside a graph capture: "
                "a replay cannot redo it. Copy inputs into the captured tensors before replay() and read "
                "results after it"
            )
        self._check_queue(queue, "a copy")
        self.ops.append(["copy", dst, src, dict(kwargs)])

    def _record_fill(self, queue: Any, buffer: Any, pattern: Any, offset: int, nbytes: int) -> None:
        self._check_queue(queue, "a fill")
        self.ops.append(["fill", buffer, pattern.copy(), offset, nbytes])

    def _record_host_step(self, what: str) -> None:
        """Host state a recorded step would change every call (a scheduler's step): a replay runs no Python,
        so in a graph it would change once, at the capture, and never again."""
        if self.is_graph:
            raise GraphCaptureError(
                f"{what} inside a graph capture: a replay runs no Python, so it would happen once, at the "
                "capture, and never again (a schedule would stop). Do it outside the recorded step: after "
                "each replay()"
            )

    def _last_launch(self, what: str) -> list[Any]:
        if not self.ops or self.ops[-1][0] != "k":
            raise GraphCaptureError(f"{what} belongs right after a kernel launch inside a capture")
        return self.ops[-1]

    def _name_slots(self, slots: dict[str, Any]) -> None:
        op = self._last_launch("name_slots()")
        kernel = op[1]
        resolved = []
        for slot, names in slots.items():
            for arg_names in (names if isinstance(names, list) else [names]):
                try:
                    resolved.append((slot, tuple(kernel.arg_index[n] for n in arg_names)))
                except KeyError as exc:
                    raise GraphCaptureError(f"kernel {kernel.name} has no argument {exc.args[0]!r} "
                                            f"(its arguments: {', '.join(kernel.arg_names)})") from None
        op[5] = tuple(resolved)

    @property
    def slotted(self) -> bool:
        """Every recorded op is a kernel launch whose changing arguments are named slots (an op's template
        that a replay can rebind completely)."""
        return self.replayable and bool(self.ops) and all(op[0] == "k" and op[5] for op in self.ops)

    def unbind(self) -> None:
        """Make this recording an op's template: drop what the slots were bound to while recording (the
        template then keeps no buffer alive; every replay binds all its slots) and turn each slotted launch
        into a Plan (netcl.core.backend: the kernel's other arguments set once, on an OpenCL kernel object of
        the plan's own; a replay sets the slots' buffers and offsets and enqueues)."""
        for op in self.ops:
            if op[0] == "k" and op[5]:
                dynamic = [i for _, positions in op[5] for i in positions]
                for _, positions in op[5]:
                    op[4][positions[0]] = None
                    if len(positions) > 1:
                        op[4][positions[1]] = np.int64(0)  # an offset: the plan learns its type (long) here
                if not self._refresh:  # refreshed arguments change at each replay: they stay on the slow path
                    op.append(op[1].plan(op[2], op[3], op[4], dynamic))

    def on_replay(self, refresh: Callable[[list], None]) -> None:
        """Call `refresh(args)` before each replay with the argument list of the launch just recorded,
        to update scalars the owner keeps on the host (step counts, learning rates, RNG counters)."""
        self._last_launch("on_replay()")
        self._refresh.append((len(self.ops) - 1, refresh))

    # -- replay -------------------------------------------------------------------------------------
    def replay(self, bind: dict[str, Any] | None = None) -> None:
        """Enqueue the recorded work again (asynchronously, like the ops themselves); `bind` gives the
        Tensor of each named slot (its buffer and offset go into the slot's arguments)."""
        ops = self.ops
        for index, refresh in self._refresh:
            refresh(ops[index][4])
        q = self.queue
        if not self.is_graph:  # an op's template: each launch like any other (recorded, counted, profiled)
            for op in ops:
                if op[0] == "k":
                    site = op[6]
                    if site is not None and site[2] is not None and profile_hooks.active:
                        launch_labels.work(*site[2])  # the work its op declared when it was recorded
                    if len(op) > 7:  # its Plan: each slot's buffer, and its offset where the slot names one
                        values: list[Any] = []
                        for slot, positions in op[5]:
                            t = bind[slot]
                            # Tensor.buffer's usual case read in place (no pending result, no hook to run)
                            values.append(t._storage.buffer if t._pending is None and not before_access
                                          else t.buffer)
                            if len(positions) > 1:
                                values.append(t.offset)  # a Python int: the plan sets the long it recorded
                        op[7](q, *values)
                    else:
                        op[1](q, op[2], op[3], *_bound(op, bind))
                elif op[0] == "copy":
                    cl.enqueue_copy(q.cl, op[1], op[2], **op[3])
                else:
                    cl.enqueue_fill_buffer(q.cl, op[1], op[2], op[3], op[4])
            return
        launched = 0
        timed = profile_hooks.active
        start = t0 = profile_hooks.before(q) if timed else None
        fixed = self._fixed_plans()
        for i, op in enumerate(ops):
            if timed:
                t0 = profile_hooks.before(q)
            if op[0] == "k":
                plan = fixed.get(i) if not (bind and op[5]) else None
                if plan is not None:  # its own kernel object, every argument set when it was built
                    try:
                        event = cl.enqueue_nd_range_kernel(q.cl, plan.raw, plan.global_size, plan.local)
                    except cl.Error as exc:
                        raise op[1].launch_error(exc, q, plan.global_size, plan.local) from None
                else:
                    event = op[1]._enqueue(q, op[2], op[3], _bound(op, bind), None)
                if timed or q.profiling:
                    profile_hooks.launched(op[1], q, event, t0, op[6] or ("graph replay", "", None))
                launched += 1
            elif op[0] == "copy":
                event = cl.enqueue_copy(q.cl, op[1], op[2], **op[3])
                if timed or q.profiling:
                    profile_hooks.copied(q, event, t0, op[1], op[2], op[3], cl)
            else:
                event = cl.enqueue_fill_buffer(q.cl, op[1], op[2], op[3], op[4])
                if timed or q.profiling:
                    profile_hooks.filled(q, event, t0, op[4])
        if timed:
            profile_hooks.span("Graph.replay", "graph", start)
        profile_hooks.count_launch(launched)

    def _fixed_plans(self) -> dict[int, Any]:
        """A graph's launches whose arguments never change (no refresh; slots unless bound), as Plans with
        no dynamic argument, made at the first replay: a replay then only enqueues them, instead of setting
        each argument again on a kernel object the launches of one kernel share (most of a replayed
        launch's host time: a decode step is hundreds of small launches)."""
        fixed = self.__dict__.get("_fixed")
        if fixed is None:
            refreshed = {index for index, _ in self._refresh}
            fixed = self._fixed = {i: op[1].plan(op[2], op[3], op[4], ()) for i, op in enumerate(self.ops)
                                   if op[0] == "k" and i not in refreshed}
        return fixed

    @property
    def launches(self) -> int:
        """Kernel launches per replay."""
        return sum(1 for op in self.ops if op[0] == "k")

    def __len__(self) -> int:
        return len(self.ops)


def _bound(op: list, bind: dict[str, Any] | None) -> list:
    """A recorded launch's arguments with the tensors of `bind` in its named slots."""
    args, slots = op[4], op[5]
    if slots and bind:
        args = list(args)
        for slot, positions in slots:
            t = bind[slot]
            args[positions[0]] = t.buffer
            if len(positions) > 1:
                args[positions[1]] = np.int64(t.offset)
    return args


# -- the active recordings of this thread -----------------------------------------------------------------
def active() -> list[Recording]:
    """The recordings this thread's work goes to (empty while none, or while paused)."""
    return _state.stack if open_recordings and not _state.paused else []


def recording_now() -> bool:
    """Whether this thread records its launches now (active() is not empty), without building a list."""
    return bool(open_recordings and _state.stack) and not _state.paused


def declaring() -> bool:
    """Whether an op should declare the work of its next launch (netcl.profiling.work): while profiling,
    and while this thread records (a replay may be profiled later)."""
    return profile_hooks.active or bool(open_recordings and _state.stack and not _state.paused)


def capturing() -> Recording | None:
    """The innermost user-level graph recording this thread's work (netcl.graph.Graph), or None."""
    if not open_recordings or _state.paused:
        return None
    for rec in reversed(_state.stack):
        if rec.is_graph:
            return rec
    return None


@contextlib.contextmanager
def recording(rec: Recording) -> Iterator[Recording]:
    """Send this thread's device work to `rec` (too) inside the block."""
    global open_recordings
    with _open_lock:
        open_recordings += 1
    _state.stack.append(rec)
    try:
        yield rec
    finally:
        _state.stack.remove(rec)
        with _open_lock:
            open_recordings -= 1


def record_template(run: Callable[[], Any], inputs: tuple = ()) -> tuple[Any, Recording | None]:
    """run() while recording, for an op's fast path: (its result, the recording made an op's template, unbound
    with each launch a Plan, when a replay can rebind all of it, else None). The tensors of `inputs` that are
    pending (netcl.jit.lazy) are computed first, not inside the recording."""
    for t in inputs:
        if t is not None:
            t.realize()
    rec = Recording()
    with recording(rec):
        result = run()
    if not rec.slotted:
        return result, None
    rec.unbind()
    return result, rec


def host_step(what: str) -> None:
    """Tell this thread's recordings that host state changes now, once per call of the step (`what`: a
    scheduler's "StepLR.step()"): a graph capture refuses it (GraphCaptureError), netcl.graph.compile's
    eager first call sees it and keeps the step eager."""
    for rec in active():
        rec._record_host_step(what)


def name_slots(**slots: Any) -> None:
    """Name the arguments of the launch just made that the innermost op recording (not a graph) rebinds
    at replay: slot=(buffer argument, offset argument), or (buffer argument,), or a list of such tuples
    when one tensor feeds several arguments (kernel parameter names). Outer recordings keep the launch
    as made (unslotted: an op template around another op's launches is then not `slotted`)."""
    for rec in reversed(active()):
        if not rec.is_graph:
            rec._name_slots(slots)
            return


class capture_paused:
    """`with capture_paused():` runs its work now without recording it: one-time setup inside a captured
    step (an optimizer creating its zeroed state) that a replay must not redo."""

    def __enter__(self) -> capture_paused:
        _state.paused += 1
        return self

    def __exit__(self, *exc: object) -> None:
        _state.paused -= 1
