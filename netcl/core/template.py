"""A whole op call replayed from a template of its signature: the Python of an eager op, paid once.

An op declared with `replay` (netcl.ops.declaration.OpDecl) runs its forward and its backward through
`replayed(op, fn, args)`. The first call of a signature (the op, each tensor argument's queue, shape,
strides, dtype and offset, which arguments share memory, every other argument's value, and the values of the
module switches the op reads) runs `fn(**args)` while recording (netcl.core.capture): its launches, copies
and fills, and the blocks the BufferPool handed this thread meanwhile (BufferPool.watching). Each buffer a
launch reads or writes is then one of the call's tensors, one of those blocks (a temporary or a result), or
one its queue keeps for kernels to share (arrival counts, the check record: at a replay, the replaying
queue's); the template keeps, per launch, a Plan whose dynamic arguments are exactly those buffers, and per
result its block and view. A later call of the signature allocates the blocks again (the pool's same size
classes), enqueues the plans on the new tensors' buffers and returns the results as views of the new blocks:
the same kernels on the same offsets and sizes, hence the same bits, without the op's checks, choices and
plan lookups.

A tensor argument still pending (netcl.jit.lazy) is computed first, templated or not. A call is not
templated, and runs as it is (`fn(**args)`), where a template could not be complete: a launch on a buffer
that is neither the call's nor made by it (a constant the op keeps), a host transfer, a result still
pending, or a result that is not a tensor, None, or a plain value. Under a recording (a graph capture,
another op's template) or a profile the op runs as it is too. Templates live in netcl.core.capture.plans:
the one cache, emptied when something a plan read changes (a tuning record).
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable
from typing import Any

import pyopencl as cl

from netcl.core import capture, profile_hooks
from netcl.core.access import before_access
from netcl.core.tensor import Tensor

ENABLED = True  # False: every call runs as it is (tests compare the two)
_REFUSED = "no template"  # kept under a signature whose call cannot be templated: it runs as it is
_PLAIN = (int, float, bool, str, type(None), tuple)
_switches: dict[str, Callable[[], tuple]] = {}  # package -> its switches' reader
_names: dict[str, str] = {}  # op -> its templates' name in the signature (made once: a call hashes it)


def switch_values(package: str) -> tuple:
    """The values of the module switches (UPPERCASE globals) of every module loaded under `package`: part of
    a template's signature, so a switch set anew (a test, a benchmark's option) is a new signature. A value
    that does not hash (a dict, a list) counts by identity: set a new one rather than changing one in place
    (as netcl.ops.attention's)."""
    read = _switches.get(package)
    if read is None:
        prefix = package + "."
        groups = []
        for name, mod in sorted(sys.modules.items()):
            if mod is not None and (name == package or name.startswith(prefix)):
                names = sorted(n for n in vars(mod)
                               if n.isupper() and not n.startswith("_") and n.isidentifier())
                if names:
                    groups.append((mod, [(n, not _hashable(vars(mod)[n])) for n in names]))
        read = _switches[package] = _reader(groups)
    return read()


def _reader(groups: list[tuple[Any, list[tuple[str, bool]]]]) -> Callable[[], tuple]:
    """A function without arguments that returns ((module 0's values, in the order of its names), ...), a
    value that did not hash when it was made by its id: one Python frame of attribute loads, generated once
    per package (a replayed op reads its switches at each call). (A value that no longer hashes fails the
    signature's hash: the op runs as it is.)"""
    cells = ", ".join(f"m{i}" for i in range(len(groups)))
    values = "".join("(" + "".join(f"id(m{i}.{n}), " if by_id else f"m{i}.{n}, " for n, by_id in names)
                     + "), " for i, (_, names) in enumerate(groups))
    env: dict[str, Any] = {}
    exec(f"def make({cells}):\n    def read():\n        return ({values})\n    return read\n", env)
    return env["make"](*(mod for mod, _ in groups))


def _hashable(value: Any) -> bool:
    try:
        hash(value)
        return True
    except TypeError:
        return False


class Template:
    """One signature's recorded call: steps ("k", plan, refs) | ("copy", dst ref, src ref, kwargs) | ("fill",
    ref, pattern, offset, nbytes), a ref being ("in", argument index), ("new", block index) or ("queue", n:
    the queue's arrival counts of n, its check record for -1); the blocks' byte counts; the result's form
    (`_form`). A replay reads the buffers from one list (the arguments', the blocks', the queue's)."""

    __slots__ = ("steps", "blocks", "result", "_queue", "_run", "_one", "_many")

    def __init__(self, steps: list, blocks: list[int], result: Any, arguments: int):
        self.steps, self.blocks, self.result = steps, blocks, result
        self._queue = sorted({r[1] for step in steps for r in _step_refs(step) if r[0] == "queue"})
        at = {"in": 0, "new": arguments, "queue": arguments + len(blocks)}
        queue_at = {n: i for i, n in enumerate(self._queue)}

        def index(r: tuple[str, int]) -> int:
            return at["queue"] + queue_at[r[1]] if r[0] == "queue" else at[r[0]] + r[1]
        # per step: (True, plan, a getter of its buffers from the list) or (False, "copy" | "fill", ...)
        self._run = [(True, step[1], _getter(tuple(index(r) for r in step[2]))) if step[0] == "k"
                     else (False, "copy", index(step[1]), index(step[2]), step[3]) if step[0] == "copy"
                     else (False, "fill", index(step[1]), *step[2:]) for step in steps]
        # the results: one tensor on a block of the call (the usual op), a tuple of such tensors (a backward's
        # gradients), or any other form
        fast = _fast_form(result)
        single = fast is not None and result[0] == "tensor"
        self._one = fast if single else None
        self._many = fast if fast is not None and not single else None

    def replay(self, tensors: list[Tensor]) -> Any:
        """The call once more, on these tensors (one per tensor argument of the signature, in order)."""
        q = tensors[0].queue
        device = q.device
        allocate = (device._pool or device.pool).allocate
        made = [allocate(n, q) for n in self.blocks]
        if before_access:   # (Tensor.buffer: a pending result that reads a storage is computed first)
            bufs = [t.buffer for t in tensors]
        else:
            bufs = [t._storage.buffer for t in tensors]
        bufs += [s.buffer for s in made]
        if self._queue:
            bufs += [q.check_buffer() if n < 0 else q.arrival_counts(n) for n in self._queue]
        for step in self._run:
            if step[0]:
                step[1](q, *step[2](bufs))
            elif step[1] == "copy":
                cl.enqueue_copy(q.cl, bufs[step[2]], bufs[step[3]], **step[4])
            else:
                cl.enqueue_fill_buffer(q.cl, bufs[step[2]], step[3], step[4], step[5])
        one = self._one
        if one is not None:
            return Tensor(made[one[0]], one[1], one[2], one[3], one[4], q)
        many = self._many
        if many is not None:
            return tuple([Tensor(made[i], shape, strides, offset, dtype, q)
                          for i, shape, strides, offset, dtype in many])
        return _build(self.result, tensors, made, q)


def _getter(index: tuple[int, ...]) -> Callable[[list], tuple]:
    """A function of the buffer list that gives the buffers at `index`, as a tuple (operator.itemgetter: one C
    call)."""
    if len(index) == 1:
        i = index[0]
        return lambda bufs: (bufs[i],)
    if not index:
        return lambda bufs: ()
    return operator.itemgetter(*index)


def _fast_form(form: Any) -> Any:
    """A result form made of the call's blocks only, flattened: (block, shape, strides, offset, dtype) for one
    tensor, a tuple of them for a tuple of tensors; None for any other form (`_build` makes it)."""
    if form[0] == "tensor" and form[1][0] == "new":
        return (form[1][1], *form[2:])
    if form[0] == "tuple" and form[1] and all(f[0] == "tensor" and f[1][0] == "new" for f in form[1]):
        return tuple((f[1][1], *f[2:]) for f in form[1])
    return None


def _build(form: Any, tensors: list[Tensor], made: list[Any], q: Any) -> Any:
    kind = form[0]
    if kind == "value":
        return form[1]
    if kind == "tuple":
        return tuple([_build(f, tensors, made, q) for f in form[1]])
    _, (where, i), shape, strides, offset, dtype = form
    if where == "in":
        t = tensors[i]
        if t.shape == shape and t.strides == strides and t.offset == offset:
            return t
        return Tensor(t._storage, shape, strides, offset, dtype, q)
    return Tensor(made[i], shape, strides, offset, dtype, q)


def replayed(op: str, fn: Callable[..., Any], args: dict[str, Any], switches: tuple = ()) -> Any:
    """fn(**args), from the template of the call's signature where there is one (the module docstring);
    `switches`: switch_values of the op's package."""
    if capture.open_recordings or profile_hooks.active or not ENABLED:
        for v in args.values():   # (either way: the op's results do not depend on whether it replays)
            if type(v) is Tensor and v._pending is not None:
                v.realize()
        return fn(**args)
    tensors: list[Tensor] = []
    label = _names.get(op)
    if label is None:
        label = _names[op] = f"{op} (replayed)"
    key: list[Any] = [label, switches]
    storages: dict[int, int] = {}
    for name, v in args.items():
        if type(v) is Tensor:
            if v._pending is not None:
                v.realize()
            # its layout, and which earlier argument shares its memory (if one does)
            same = storages.setdefault(id(v._storage), len(tensors))
            key.append((name, id(v.queue), v.shape, v.strides, v.dtype, v.offset, same))
            tensors.append(v)
        else:
            key.append((name, v))
    if not tensors:
        return fn(**args)
    signature = tuple(key)
    try:
        hit = capture.plans.get(signature)
    except TypeError:   # a value that does not hash: no signature
        return fn(**args)
    if hit is not None:
        if hit is _REFUSED:
            return fn(**args)
        return hit.replay(tensors)
    rec = capture.Recording()
    with tensors[0].queue.device.pool.watching() as made, capture.recording(rec):
        result = fn(**args)
    template = _template(rec, tensors, made, result)
    capture.plans.put(signature, _REFUSED if template is None else template)
    return result


def _template(rec: capture.Recording, tensors: list[Tensor], made: list[tuple[Any, int]],
              result: Any) -> Template | None:
    """The template of a recorded call, or None where it could not be complete (the module docstring)."""
    if not rec.replayable:
        return None
    refs: dict[int, tuple[str, int]] = {}
    for i, t in enumerate(tensors):
        refs.setdefault(id(t._storage.buffer), ("in", i))
    for n, buf in tensors[0].queue.shared_buffers():   # (at each replay, the replaying queue's own)
        refs.setdefault(id(buf), ("queue", n))
    blocks: list[int] = []
    for buf, nbytes in made:
        ref = refs.get(id(buf))
        if ref is None:
            refs[id(buf)] = ("new", len(blocks))
            blocks.append(nbytes)
        elif ref[0] == "new":   # a block freed and handed out again inside the call: one block, the larger
            blocks[ref[1]] = max(blocks[ref[1]], nbytes)
    steps: list[Any] = []
    for op in rec.ops:
        if op[0] == "k":
            kernel, args = op[1], list(op[4])
            dynamic, used = [], []
            for j, a in enumerate(args):
                if isinstance(a, cl.MemoryObject):
                    ref = refs.get(id(a))
                    if ref is None:
                        return None
                    dynamic.append(j)
                    used.append(ref)
            steps.append(("k", kernel.plan(op[2], op[3], args, dynamic), tuple(used)))
        elif op[0] == "copy":
            dst, src = refs.get(id(op[1])), refs.get(id(op[2]))
            if dst is None or src is None:
                return None
            steps.append(("copy", dst, src, dict(op[3])))
        else:
            ref = refs.get(id(op[1]))
            if ref is None:
                return None
            steps.append(("fill", ref, op[2], op[3], op[4]))
    form = _form(result, refs)
    if form is None:
        return None
    # only the blocks a step or the result uses
    used = sorted({r[1] for step in steps for r in _step_refs(step) if r[0] == "new"} | _form_blocks(form))
    if len(used) < len(blocks):
        index = {old: new for new, old in enumerate(used)}
        steps = [_renumber(step, index) for step in steps]
        form = _renumber_form(form, index)
        blocks = [blocks[i] for i in used]
    return Template(steps, blocks, form, len(tensors))


def _step_refs(step: Any) -> tuple:
    return step[2] if step[0] == "k" else (step[1], step[2]) if step[0] == "copy" else (step[1],)


def _form_blocks(form: Any) -> set[int]:
    if form[0] == "tuple":
        return set().union(*(_form_blocks(f) for f in form[1]))
    return {form[1][1]} if form[0] == "tensor" and form[1][0] == "new" else set()


def _renumber(step: Any, index: dict[int, int]) -> Any:
    def ref(r: tuple[str, int]) -> tuple[str, int]:
        return ("new", index[r[1]]) if r[0] == "new" else r
    if step[0] == "k":
        return ("k", step[1], tuple(ref(r) for r in step[2]))
    if step[0] == "copy":
        return ("copy", ref(step[1]), ref(step[2]), step[3])
    return ("fill", ref(step[1]), *step[2:])


def _renumber_form(form: Any, index: dict[int, int]) -> Any:
    if form[0] == "tuple":
        return ("tuple", tuple(_renumber_form(f, index) for f in form[1]))
    if form[0] == "tensor" and form[1][0] == "new":
        return ("tensor", ("new", index[form[1][1]]), *form[2:])
    return form


def _form(result: Any, refs: dict[int, tuple[str, int]]) -> Any:
    """How a replay makes the result: ("value", v), ("tuple", forms), or ("tensor", ref, shape, strides,
    offset, dtype); None where it cannot."""
    if type(result) is Tensor:
        if result._pending is not None:
            return None
        ref = refs.get(id(result._storage.buffer))
        if ref is None or ref[0] == "queue":
            return None
        return ("tensor", ref, result.shape, result.strides, result.offset, result.dtype)
    if type(result) is tuple:
        forms = tuple(_form(r, refs) for r in result)
        return None if any(f is None for f in forms) else ("tuple", forms)
    if type(result) in _PLAIN and type(result) is not tuple:
        return ("value", result)
    return None


__all__ = ["Template", "replayed", "switch_values"]
