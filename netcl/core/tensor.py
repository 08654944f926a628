"""Tensor: a view (shape, strides, offset, dtype) over device memory owned by one queue.

A Tensor records no history (autograd wraps it in Nodes). Views share memory; `contiguous()`
copies only when the layout needs it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import capture, dtypes, shapes
from netcl.core.access import before_access
from netcl.core.backend import Queue, as_queue, enqueue_copy
from netcl.core.memory import Storage, is_pinned, staging
from netcl.errors import DeviceMismatchError, DTypeError, IndexingError, ShapeError

MAX_DIMS = 8
_REPR_LIMIT = 1000


def _normalize_shape(shape: Any) -> tuple[int, ...]:
    out = shapes.shape(shape)
    if len(out) > MAX_DIMS:
        raise ShapeError(f"shape {out} has {len(out)} dimensions; netcl supports at most {MAX_DIMS}")
    return out


# Layouts checked once per signature (a training step repeats its shapes): ("empty", shape, dtype) as given ->
# (shape, strides, nbytes, dtype, whether it is float64); ("view", shape, strides, requested shape) -> (shape,
# strides or None); ("contiguous", shape, strides) -> whether that layout is row-major contiguous
_layouts: dict[tuple, tuple] = {}


def describe_index(item: Any) -> str:
    """One line naming an index item for an error: its type, and its shape and dtype where it has them
    (never the repr of an array, which runs over many lines)."""
    if hasattr(item, "shape") and hasattr(item, "dtype"):
        return f"{type(item).__name__} of shape {tuple(item.shape)} and dtype {item.dtype}"
    if isinstance(item, (list, tuple)):
        return f"{type(item).__name__} of length {len(item)}"
    text = repr(item)
    return f"{text} ({type(item).__name__})" if len(text) <= 40 and "\n" not in text else type(item).__name__


def _is_new_axis(item: Any) -> bool:
    """None, True and False in an index add an axis (of 1, 1 and 0 elements) instead of taking one."""
    return item is None or isinstance(item, (bool, np.bool_))


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides in elements."""
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def check_same_queue(*tensors: Tensor) -> Queue:
    """The one queue all `tensors` share, or DeviceMismatchError naming the two that differ."""
    first = tensors[0]
    for t in tensors[1:]:
        if t.queue is not first.queue:
            if t.queue.device is first.queue.device:  # the two reprs would read the same
                raise DeviceMismatchError(
                    f"tensors of two different queues of one device, {first.queue.device.describe()}, met in "
                    f"one operation (nothing orders one queue's work after the other's). Move one with "
                    "`.to(queue)` first, or make both on one queue"
                )
            raise DeviceMismatchError(
                f"tensors of two different devices met in one operation: {first.queue!r} and {t.queue!r}. "
                "Move one with `.to(queue)` first"
            )
    return first.queue


def empty_in_order(like: Any) -> Tensor:
    """An uninitialised tensor of `like`'s shape and dtype on its queue (a Tensor, or anything with shape,
    strides, dtype and queue: netcl.ops.declaration.Layout) whose memory order follows like's strides: a
    permuted view of a fresh contiguous buffer. An op's result written in its input's order keeps the
    permutes and reshapes around it views (PyTorch's preserve_format): rope's output and gradient, the
    attention's output in its query's order. Broadcast (zero-stride) axes go outermost; equal strides keep
    the axes' order, so a last axis of stride 1 stays innermost. (The layout is worked out once per shape
    and strides: ops call this every step.)"""
    key = (like.shape, like.strides)
    plan = _orders.get(key)
    if plan is None:
        ndim = len(like.shape)
        st = like.strides
        order = sorted(range(ndim), key=lambda d: (-abs(st[d]) if st[d] else -math.inf, d))
        base_shape = tuple(like.shape[d] for d in order)
        base_strides = contiguous_strides(base_shape)
        strides = [0] * ndim
        for i, d in enumerate(order):
            strides[d] = base_strides[i]
        plan = (base_shape, tuple(like.shape), tuple(strides))
        if len(_orders) < 4096:
            _orders[key] = plan
    base = Tensor.empty(like.queue, plan[0], like.dtype)
    return base._view(plan[1], plan[2], 0)


_orders: dict[tuple, tuple] = {}


# -- before-access hook (netcl.jit's pending readers) ---------------------------------------------
# A Tensor made by an elementwise op may hold `_pending` (an object with .realize(tensor)) instead of
# storage: it is computed when its storage is first needed (netcl.jit.lazy). Pending tensors read other
# tensors' storages; before anyone touches such a storage (to write it in place, e.g. an optimizer step)
# they must be computed from the old contents. The jit registers a callback for each storage read by a
# pending tensor in `before_access` (netcl.core.access: id(storage) -> callback(storage), called and removed
# by the jit on first access), the same dict under this module's name.


# PyTorch names a Tensor lacks -> what netcl writes (Tensor.__getattr__'s errors)
_PYTORCH_SPELLINGS = {
    "t": "x.T (or x.transpose(1, 0))",
    "dim": "x.ndim",
    "data": "the Tensor itself (a Tensor is in no graph; a Node's .value is its Tensor)",
    "requires_grad": "ag.tensor(x, requires_grad=True): gradients are a Node's (netcl.autograd)",
    "grad": "a Node's .grad: ag.tensor(x, requires_grad=True), then its .grad after backward",
    "zero_": "x.fill_(0)",
    "add_": "x += y", "sub_": "x -= y", "mul_": "x *= y", "div_": "x /= y",
    "norm": "netcl.ops.sqrt(netcl.ops.sum(netcl.ops.square(x)))",
    "type": "x.dtype, and x.astype(dtype) to convert",
    "is_cuda": "x.device (the netcl device handle: x.device.describe())",
    "new_zeros": "Tensor.zeros(x.queue, shape, x.dtype)",
    "amax": "x.max(axis=...) (NumPy's: the values alone)",
    "amin": "x.min(axis=...) (NumPy's: the values alone)",
    "mT": "x.transpose(-1, -2)",
    "type_as": "x.astype(other.dtype)",
}


def pytorch_spelling(name: str) -> str | None:
    """What netcl writes for PyTorch's `x.<name>` where a Tensor (or a Node) lacks it: the table above, the
    function of netcl.ops of that name, or an in-place form of one; None for any other name."""
    hint = _PYTORCH_SPELLINGS.get(name)
    if hint is not None:
        return hint
    ops = sys.modules.get("netcl.ops")   # (loaded with netcl; core does not import the layer above)
    if ops is None:
        return None
    base = name[:-1] if name.endswith("_") else None
    if base and callable(getattr(ops, base, None)):
        return f"x[...] = netcl.ops.{base}(x, ...) (written into x's memory)"
    if callable(getattr(ops, name, None)):
        return f"netcl.ops.{name}(x, ...)"
    return None


class HostArray(np.ndarray):
    """What Tensor.cpu() gives: a NumPy array that also answers PyTorch's `.numpy()` (the chain
    `x.detach().cpu().numpy()`) with itself as a plain ndarray."""

    def numpy(self) -> np.ndarray:
        return self.view(np.ndarray)


class Tensor:
    """An n-dimensional array in device memory (cl_mem), owned by one command queue.

    Attributes: shape, strides (in elements, may be negative or zero), offset (in elements),
    dtype (numpy dtype), queue, device, storage. A result of an elementwise op may be *pending*
    (see netcl.jit.lazy): its storage is allocated and computed on first access of `storage`,
    `buffer`, a view, or a host read; `realize()` forces it.
    """

    __array_priority__ = 1000  # so ndarray (op) Tensor defers to Tensor's reflected operators
    _pending: Any = None  # netcl.jit.lazy.Pending while the result is not computed yet

    def __init__(
        self,
        storage: Storage,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int,
        dtype: np.dtype,
        queue: Queue,
    ):
        self._storage = storage
        self.shape = shape
        self.strides = strides
        self.offset = offset
        self.dtype = dtype
        self.queue = queue

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def empty(cls, q: Any, shape: Any, dtype: Any = np.float32) -> Tensor:
        """Uninitialised contiguous tensor."""
        queue = q if type(q) is Queue else as_queue(q)
        try:
            plan = _layouts.get(("empty", shape, dtype)) if type(shape) is tuple else None
        except TypeError:  # unhashable entries: the checks below explain what is wrong
            plan, shape = None, list(shape)
        if plan is not None:  # (2.0,) hashes and compares as (2,): only plain ints take the cached plan
            for s in shape:
                if type(s) is not int:
                    plan = None
                    break
        if plan is None:  # checked once per (shape, dtype): a training step repeats its shapes
            dt = dtypes.normalize(dtype)
            shp = _normalize_shape(shape)
            wide = dt.itemsize == 8 and dt.kind == "f"
            plan = (shp, contiguous_strides(shp), math.prod(shp) * dt.itemsize, dt, wide)
            if type(shape) is tuple and len(_layouts) < 16384:
                _layouts[("empty", shape, dtype)] = plan
        shp, strides, nbytes, dt, wide = plan
        if wide:  # float64: only where the device has it
            dtypes.check_supported_on(dt, queue.device)
        device = queue.device
        pool = device._pool or device.pool  # the property makes it the first time
        return cls(pool.allocate(nbytes, queue), shp, strides, 0, dt, queue)

    @classmethod
    def full(cls, q: Any, shape: Any, value: Any, dtype: Any = np.float32) -> Tensor:
        """Tensor filled with `value` (converted to `dtype`, as NumPy would)."""
        t = cls.empty(q, shape, dtype)
        t.fill_(value)
        return t

    @classmethod
    def zeros(cls, q: Any, shape: Any, dtype: Any = np.float32) -> Tensor:
        return cls.full(q, shape, 0, dtype)

    @classmethod
    def ones(cls, q: Any, shape: Any, dtype: Any = np.float32) -> Tensor:
        return cls.full(q, shape, 1, dtype)

    @classmethod
    def from_host(cls, q: Any, array: Any, dtype: Any = None) -> Tensor:
        """Copy a host array (anything np.asarray accepts) to a new contiguous tensor on `q`.

        The host array may be changed as soon as this returns.
        """
        arr = np.asarray(array)
        if dtype is not None:
            arr = arr.astype(dtypes.normalize(dtype), copy=False)
        elif arr.dtype not in dtypes.SUPPORTED:
            raise DTypeError(
                f"host array has dtype {arr.dtype}, which netcl does not store; pass dtype= "
                f"(one of {dtypes.names()}) or convert it first"
            )
        t = cls.empty(q, arr.shape, arr.dtype)
        if t.nbytes:
            t._write_contiguous(np.ascontiguousarray(arr))
        return t

    @classmethod
    def like(cls, other: Tensor, dtype: Any = None) -> Tensor:
        return cls.empty(other.queue, other.shape, other.dtype if dtype is None else dtype)

    # -- basic properties -------------------------------------------------------------------
    @property
    def device(self) -> Any:
        return self.queue.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> shapes.ElementCount:
        """The number of elements (NumPy's size, an int); called, PyTorch's size(): `t.size()` is the shape,
        `t.size(dim)` one dimension."""
        return shapes.element_count(self.shape)

    def numel(self) -> int:
        """PyTorch's name for the number of elements (`size`)."""
        return int(self.size)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def storage(self) -> Storage:
        if self._pending is not None:
            self._pending.realize(self)
        st = self._storage
        if before_access:
            hook = before_access.get(id(st))
            if hook is not None:
                hook(st)
        return st

    @storage.setter
    def storage(self, value: Storage) -> None:
        self._storage = value

    @property
    def buffer(self) -> cl.Buffer:
        if self._pending is None and not before_access:  # the usual case, without the storage property's call
            return self._storage.buffer
        return self.storage.buffer

    def realize(self) -> Tensor:
        """Compute this tensor now if it is a pending (fused, not yet launched) result."""
        if self._pending is not None:
            self._pending.realize(self)
        return self

    @property
    def is_pending(self) -> bool:
        return self._pending is not None

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def detach(self) -> Tensor:
        """PyTorch's `x.detach()`: a Tensor is in no graph (a Node is), so itself."""
        return self

    def __getattr__(self, name: str) -> Any:
        """Only for names a Tensor lacks: PyTorch's spellings say netcl's (the function of netcl.ops of that
        name, or an in-place form), anything else is the usual AttributeError."""
        if name.startswith("_"):   # (netcl's own probes, getattr(t, "_...", None): the plain error at once)
            raise AttributeError(name)
        hint = pytorch_spelling(name)
        if hint is None:
            raise AttributeError(f"'Tensor' object has no attribute {name!r}")
        raise AttributeError(f"'Tensor' object has no attribute {name!r}; netcl spells it {hint}")

    def __deepcopy__(self, memo: dict) -> Tensor:
        """`copy.deepcopy`: a contiguous copy on the same queue (one device copy; the queue and its device are
        shared, not copied, as PyTorch keeps a tensor's device). Views of one storage become copies of their
        own."""
        out = memo[id(self)] = self.clone()
        return out

    def __iter__(self) -> Any:
        """The views along axis 0, as NumPy iterates (without this, Python's fallback through __getitem__
        made a 0-d tensor iterate as empty)."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def is_contiguous(self) -> bool:
        layout = ("contiguous", self.shape, self.strides)
        try:
            known = _layouts.get(layout)
        except TypeError:  # a layout given as lists: worked out, not kept
            known, layout = None, None
        if known is None:  # a step asks about the same few layouts many times: each is worked out once
            known = True
            expected = 1
            for size, stride in zip(reversed(self.shape), reversed(self.strides)):
                if size != 1 and stride != expected:
                    known = False
                    break
                expected *= size
            if layout is not None and len(_layouts) < 16384:
                _layouts[layout] = known
        return known

    def _span(self) -> tuple[int, int]:
        """Lowest and highest element index (relative to the buffer) this view touches."""
        if self.size == 0:
            return self.offset, self.offset
        lo = hi = self.offset
        for size, stride in zip(self.shape, self.strides):
            if stride > 0:
                hi += (size - 1) * stride
            else:
                lo += (size - 1) * stride
        return lo, hi

    # -- host transfers ---------------------------------------------------------------------
    def _staged(self, arr: np.ndarray, pinned: bool) -> bool:
        # Host->device writes go through pinned staging where a bus separates host and device: the
        # copy is then asynchronous and the caller's array is free at once. A CPU device shares host
        # memory (staging would only add a memcpy), and an array already in pinned memory is DMA'd
        # as it is. Reads use the driver's own path: measured on the H200, staging the read-back
        # through a host memcpy was slower than it (bench/NOTES.md).
        return pinned and arr.nbytes >= (64 << 10) and self.device.kind != "cpu" and not is_pinned(arr)

    def _write_contiguous(self, arr: np.ndarray, pinned: bool = True) -> None:
        byte_offset = self.offset * self.itemsize
        if self._staged(arr, pinned):
            staging(self.queue).write(self.buffer, byte_offset, arr)
        else:
            enqueue_copy(self.queue, self.buffer, arr, dst_offset=byte_offset, is_blocking=True)

    def to_host(self, out: np.ndarray | None = None) -> np.ndarray:
        """Copy to a NumPy array (waits for pending work on the queue). Pass `out` (e.g. a pinned
        array from netcl.core.memory.pinned_empty) to reuse host memory."""
        src = self if self.is_contiguous() else self.contiguous()
        if out is None:
            out = np.empty(self.shape, dtype=self.dtype)
        elif out.shape != self.shape or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ShapeError(
                f"out must be a C-contiguous {self.dtype} array of shape {self.shape}, got "
                f"{out.dtype} {out.shape}"
            )
        if out.nbytes == 0:
            return out
        byte_offset = src.offset * src.itemsize
        enqueue_copy(self.queue, out, src.buffer, src_offset=byte_offset, is_blocking=True)
        self.queue.raise_device_errors()
        return out

    numpy = to_host

    def cpu(self) -> np.ndarray:
        """PyTorch's `x.cpu()`: here a NumPy array, the same as to_host() (a Tensor lives on its queue's
        device; `x.to(queue)` moves it to another). PyTorch's `x.cpu().numpy()` works too (HostArray)."""
        return self.to_host().view(HostArray)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.to_host()
        return arr if dtype is None else arr.astype(dtype)

    def item(self) -> Any:
        if self.size != 1:
            raise ShapeError(f"item() needs a tensor of one element, this one has shape {self.shape}")
        return self.to_host().reshape(()).item()

    def tolist(self) -> Any:
        return self.to_host().tolist()

    def copy_from_host(self, array: Any) -> Tensor:
        """Overwrite this tensor's elements from a host array of the same shape (in place)."""
        arr = np.asarray(array)
        if arr.shape != self.shape:
            raise ShapeError(f"host array of shape {arr.shape} cannot fill a tensor of shape {self.shape}")
        arr = np.ascontiguousarray(arr.astype(self.dtype, copy=False))
        if self.is_contiguous():
            if arr.nbytes:
                self._write_contiguous(arr)
        else:
            self.copy_(Tensor.from_host(self.queue, arr))
        return self

    def fill_(self, value: Any) -> Tensor:
        """Set every element to `value` (in place)."""
        # the pattern of a Python number is kept with the plans (a step fills its loss seed every call); not
        # for NaN or a float zero, whose sign a key equal to 0.0 would lose
        key = (("fill", self.dtype, type(value), value)
               if type(value) is int or (type(value) is float and value == value and value != 0.0) else None)
        pattern = capture.plans.get(key) if key is not None else None
        if pattern is None:
            dtypes.check_scalar_fits(value, self.dtype, "fill value")
            with np.errstate(all="ignore"):
                pattern = np.array(value).astype(self.dtype).reshape(1)
            if key is not None:
                pattern.flags.writeable = False
                capture.plans.put(key, pattern)
        nbytes = shapes.element_count(self.shape) * self.dtype.itemsize
        if nbytes == 0:
            return self
        if self.is_contiguous():
            try:
                buffer, start = self.buffer, self.offset * self.dtype.itemsize
                cl.enqueue_fill_buffer(self.queue.cl, buffer, pattern, start, nbytes)
                for rec in capture.active():
                    rec._record_fill(self.queue, buffer, pattern, start, nbytes)
            except cl.Error:
                self.copy_from_host(np.full(self.shape, pattern, dtype=self.dtype))
        else:
            self.copy_(Tensor.full(self.queue, self.shape, pattern, self.dtype))
        return self

    # -- copies (copy_, contiguous and clone launch a kernel: netcl.ops.copy installs them) -----------
    def to(self, target: Any) -> Tensor:
        """This tensor on another queue (through the host when the device differs); given a dtype
        (`t.to(np.float16)`, `t.to("float64")`, as PyTorch's `.to(dtype)`), this tensor converted to it:
        `astype` (a new tensor; the same one when the dtype already matches)."""
        if isinstance(target, (np.dtype, type, str)):
            dt = dtypes.normalize_or_device_hint(target)
            return self if dt == self.dtype else self.astype(dt)
        target = as_queue(target)
        if target is self.queue:
            return self
        if target.device is self.device:
            self.queue.finish()  # the other queue must see this one's writes
            out = Tensor.empty(target, self.shape, self.dtype)
            src = self.contiguous()
            self.queue.finish()
            if out.nbytes:
                enqueue_copy(target, out.buffer, src.buffer, src_offset=src.offset * src.itemsize,
                             byte_count=out.nbytes)
            return out
        return Tensor.from_host(target, self.to_host())

    # -- views ----------------------------------------------------------------------------------
    def _view(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Tensor:
        if self._pending is not None:
            self._pending.realize(self)
        return Tensor(self._storage, shape, strides, offset, self.dtype, self.queue)

    def _infer_shape(self, shape: Any) -> tuple[int, ...]:
        shape = shapes.sizes(shapes.varargs(shape), "shape", minimum=-1)
        if shape.count(-1) > 1:
            raise ShapeError(f"only one dimension may be -1 in {shape}")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if known == 0 or self.size % known:
                raise ShapeError(f"cannot reshape a tensor of shape {self.shape} into {shape}")
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        if any(s < 0 for s in shape) or math.prod(shape) != self.size:
            raise ShapeError(
                f"cannot reshape a tensor of shape {self.shape} ({self.size} elements) into {shape}"
            )
        return _normalize_shape(shape)

    def _view_strides(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """Strides that show this tensor's elements in `shape` without a copy, if any exist."""
        if self.is_contiguous():
            return contiguous_strides(shape)
        # group old dims into runs that are contiguous among themselves, then split new dims over them
        old = [(s, st) for s, st in zip(self.shape, self.strides) if s != 1]
        new_strides: list[int] = []
        oi = 0
        ni = 0
        new = list(shape)
        while ni < len(new):
            if new[ni] == 1:
                new_strides.append(1)
                ni += 1
                continue
            if oi >= len(old):
                return None
            # take old dims until their product covers the new dims taken
            chunk_old = [old[oi]]
            prod_old = old[oi][0]
            oi += 1
            chunk_new = [ni]
            prod_new = new[ni]
            ni += 1
            while prod_old != prod_new:
                if prod_old < prod_new:
                    if oi >= len(old):
                        return None
                    chunk_old.append(old[oi])
                    prod_old *= old[oi][0]
                    oi += 1
                else:
                    if ni >= len(new):
                        return None
                    chunk_new.append(ni)
                    prod_new *= new[ni]
                    ni += 1
            for (_, st_a), (s_b, st_b) in zip(chunk_old, chunk_old[1:]):
                if st_a != st_b * s_b:
                    return None
            stride = chunk_old[-1][1]
            placed = []
            for idx in reversed(chunk_new):
                placed.append(stride if new[idx] != 1 else 1)
                stride *= new[idx]
            new_strides.extend(reversed(placed))
        if oi != len(old):
            return None
        return tuple(new_strides)

    def _reshaped(self, shape: tuple) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        """(the shape `shape` asks for, checked; the strides that view this tensor in it, or None where that
        needs a copy), once per (shape, strides, request)."""
        key: tuple | None = ("view", self.shape, self.strides, shape)
        try:
            hit = _layouts.get(key)
        except TypeError:  # unhashable entries (a list): the checks explain what is wrong, if anything
            hit, key = None, None
        if hit is not None:  # (3.0, 2) hashes and compares as (3, 2): only plain ints take the cached layout
            for s in (shape[0] if len(shape) == 1 and type(shape[0]) is tuple else shape):
                if type(s) is not int:
                    hit = None
                    break
        if hit is None:
            shp = self._infer_shape(shape)
            hit = (shp, self._view_strides(shp))
            if key is not None and len(_layouts) < 16384:
                _layouts[key] = hit
        return hit

    def view(self, *shape: Any) -> Tensor:
        """The same memory seen in another shape; ShapeError when that needs a copy."""
        shp, strides = self._reshaped(shape)
        if strides is None:
            raise ShapeError(
                f"a tensor of shape {self.shape} with strides {self.strides} cannot be viewed as "
                f"{shp} without a copy; use reshape() (copies when needed) or contiguous() first"
            )
        return self._view(shp, strides, self.offset)

    def reshape(self, *shape: Any) -> Tensor:
        """A view when the layout allows it, else a contiguous copy in the new shape."""
        shp, strides = self._reshaped(shape)
        if strides is not None:
            return self._view(shp, strides, self.offset)
        c = self.contiguous()
        return c._view(shp, contiguous_strides(shp), c.offset)

    def _axis(self, axis: Any) -> int:
        return shapes.axis(axis, self.ndim, shape_of=self.shape)

    def permute(self, *dims: Any) -> Tensor:
        dims = shapes.varargs(dims)
        ndim, shape, strides = len(self.shape), self.shape, self.strides
        # plain ints in range (a model's own permutes) without the per-axis checks; the rest through _axis
        axes = tuple([d % ndim if type(d) is int and -ndim <= d < ndim else self._axis(d) for d in dims])
        if sorted(axes) != list(range(ndim)):
            raise ShapeError(f"permute needs each of the {ndim} axes once, got {tuple(dims)}")
        return self._view(tuple([shape[a] for a in axes]), tuple([strides[a] for a in axes]), self.offset)

    def transpose(self, *dims: Any, dim0: int | None = None, dim1: int | None = None) -> Tensor:
        """PyTorch's transpose, two axes swapped: x.transpose(dim0, dim1); with no axes, a matrix's two (a
        tensor of fewer axes is returned as it is). NumPy's permutation of all the axes,
        x.transpose(1, 0, 2) or x.transpose((2, 0, 1)), is x.permute(...) (PyTorch refuses those). With no
        axes on more than two axes the libraries differ (NumPy reverses them all, PyTorch needs its two),
        so that is a TypeError naming both."""
        if dim0 is not None or dim1 is not None:
            if dims or dim0 is None or dim1 is None:
                raise TypeError(f"transpose takes two axes, dim0 and dim1, got {dims} and dim0={dim0}, "
                                f"dim1={dim1}")
            dims = (dim0, dim1)
        ndim = len(self.shape)
        if len(dims) == 2 and type(dims[0]) is int and type(dims[1]) is int or not dims and ndim <= 2:
            a, b = dims or (-2, -1)
            if ndim < 2:
                return self
            if ndim == 2 and a in (0, -2) and b in (1, -1):
                # a matrix's two axes (a weight's transpose in every linear layer): no axis checks to make
                (rows, cols), (row_stride, col_stride) = self.shape, self.strides
                return self._view((cols, rows), (col_stride, row_stride), self.offset)
            if -ndim <= a < ndim and -ndim <= b < ndim:
                a, b = a % ndim, b % ndim  # axes in range: the swap itself, without permute's checks
                shape, strides = list(self.shape), list(self.strides)
                shape[a], shape[b] = shape[b], shape[a]
                strides[a], strides[b] = strides[b], strides[a]
                return self._view(tuple(shape), tuple(strides), self.offset)
        if len(dims) == 2 and not isinstance(dims[0], (tuple, list)):
            a, b = self._axis(dims[0]), self._axis(dims[1])
            order = list(range(self.ndim))
            order[a], order[b] = order[b], order[a]
            return self.permute(order)
        axes = shapes.varargs(dims)
        if len(axes) != ndim:
            raise TypeError(
                f"transpose of a tensor of {ndim} axes (shape {self.shape}) got {len(axes)} axes "
                f"{tuple(axes)}: PyTorch's x.transpose(dim0, dim1) swaps two axes (x.transpose(-2, -1) the "
                "last two), NumPy's x.transpose() reverses all of them (x.T; x.permute(...) with all "
                f"{ndim} axes for another order)")
        return self.permute(axes)

    @property
    def T(self) -> Tensor:
        """All axes reversed (NumPy's .T)."""
        return self.permute(tuple(reversed(range(self.ndim))))

    def swapaxes(self, axis1: int, axis2: int) -> Tensor:
        """Two axes swapped (a view): NumPy's and PyTorch's swapaxes, PyTorch's transpose(dim0, dim1)."""
        for a in (axis1, axis2):
            if isinstance(a, (tuple, list)):
                raise TypeError(f"swapaxes takes two axes, got {axis1!r} and {axis2!r}; x.permute(...) takes "
                                "an order of all of them")
        a, b = self._axis(axis1), self._axis(axis2)
        return self.transpose(a, b) if self.ndim >= 2 else self

    def moveaxis(self, source: Any, destination: Any) -> Tensor:
        """Axes `source` moved to the positions `destination` (ints, or sequences of one length), the others
        kept in their order (a view): np.moveaxis, PyTorch's moveaxis and movedim."""
        src = tuple(source) if isinstance(source, (tuple, list)) else (source,)
        dst = tuple(destination) if isinstance(destination, (tuple, list)) else (destination,)
        if len(src) != len(dst):
            raise ShapeError(f"moveaxis: source {source!r} and destination {destination!r} must name as many "
                             "axes")
        src = tuple(shapes.axis(a, self.ndim, "moveaxis: source", shape_of=self.shape) for a in src)
        dst = tuple(shapes.axis(a, self.ndim, "moveaxis: destination", shape_of=self.shape) for a in dst)
        if len(set(src)) != len(src) or len(set(dst)) != len(dst):
            raise ShapeError(f"moveaxis: source {source!r} and destination {destination!r} must not repeat "
                             "an axis")
        order = [d for d in range(self.ndim) if d not in src]
        for to, d in sorted(zip(dst, src)):
            order.insert(to, d)
        return self.permute(order)

    movedim = moveaxis

    def ravel(self) -> Tensor:
        """The elements in one axis, in row-major order: a view where the layout allows it, else a contiguous
        copy (NumPy's and PyTorch's ravel; reshape(-1))."""
        return self.reshape(self.size)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Axes start_dim..end_dim merged into one (torch.flatten: every axis unless told, so a 0-d tensor
        gives one element; `x.flatten(1)` keeps the batch axis): a view where the layout allows it, else a
        contiguous copy."""
        return self.reshape(shapes.flattened(self.shape, start_dim, end_dim))

    def expand_dims(self, axis: Any) -> Tensor:
        """New axes of size 1 at `axis` (an int or a sequence), positions in the result as np.expand_dims
        counts them (a view; PyTorch's unsqueeze for one axis)."""
        items = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        ndim = self.ndim + len(items)
        at = sorted(shapes.axis(a, ndim, "expand_dims: axis", shape_of=self.shape) for a in items)
        if len(set(at)) != len(at):
            raise ShapeError(f"expand_dims: axis {axis!r} repeats an axis (shape {self.shape})")
        out = self
        for a in at:
            out = out.unsqueeze(a)
        return out

    @shapes.torch_names
    def squeeze(self, axis: int | None = None) -> Tensor:
        if axis is None:
            keep = [i for i, s in enumerate(self.shape) if s != 1]
        else:
            ax = self._axis(axis)
            if self.shape[ax] != 1:
                raise ShapeError(f"cannot squeeze axis {axis} of size {self.shape[ax]}")
            keep = [i for i in range(self.ndim) if i != ax]
        return self._view(
            tuple(self.shape[i] for i in keep), tuple(self.strides[i] for i in keep), self.offset
        )

    @shapes.torch_names
    def unsqueeze(self, axis: int) -> Tensor:
        axis = shapes.axis(axis, self.ndim + 1, "unsqueeze axis", shape_of=self.shape)
        shape = list(self.shape)
        strides = list(self.strides)
        shape.insert(axis, 1)
        strides.insert(axis, strides[axis] * self.shape[axis] if axis < self.ndim else 1)
        return self._view(tuple(shape), tuple(strides), self.offset)

    def expand(self, *shape: Any) -> Tensor:
        """Broadcast view to `shape` (stride 0 along expanded axes; -1 keeps a size)."""
        shape = shapes.sizes(shapes.varargs(shape), "expand shape", minimum=-1)
        if len(shape) < self.ndim:
            raise ShapeError(f"cannot expand shape {self.shape} to fewer dimensions {shape}")
        lead = len(shape) - self.ndim
        new_strides = []
        new_shape = []
        for i, target in enumerate(shape):
            if i < lead:
                if target < 0:
                    raise ShapeError(f"-1 is not allowed for a new leading axis in expand to {shape}")
                new_shape.append(target)
                new_strides.append(0)
                continue
            size, stride = self.shape[i - lead], self.strides[i - lead]
            if target == -1 or target == size:
                new_shape.append(size)
                new_strides.append(stride)
            elif size == 1:
                new_shape.append(target)
                new_strides.append(0)
            else:
                raise ShapeError(f"cannot expand shape {self.shape} to {shape}: axis {i} has size {size}")
        return self._view(_normalize_shape(new_shape), tuple(new_strides), self.offset)

    def __getitem__(self, index: Any) -> Tensor:
        """Basic indexing: ints, slices (any step), Ellipsis, None and bool scalars (NumPy's: True adds an
        axis of 1 like None, False one of 0); the result is a view."""
        if not isinstance(index, tuple):
            index = (index,)
        for item in index:
            if not (item is None or item is Ellipsis or isinstance(item, (slice, int, np.integer, np.bool_))):
                raise IndexingError(
                    f"index {describe_index(item)} is not basic indexing (ints, slices, ..., None, bools); a "
                    "Tensor takes an integer array or a bool mask too (a copy, not differentiable), "
                    "or use netcl.ops' gather/index_select/take"
                )
        n_ellipsis = sum(1 for i in index if i is Ellipsis)
        if n_ellipsis > 1:
            raise IndexingError("an index can only have a single ellipsis ('...')")
        n_real = sum(1 for i in index if not _is_new_axis(i) and i is not Ellipsis)
        if n_real > self.ndim:
            raise IndexingError(f"too many indices ({n_real}) for a tensor of shape {self.shape}")
        if n_ellipsis:
            at = index.index(Ellipsis)
            index = index[:at] + (slice(None),) * (self.ndim - n_real) + index[at + 1 :]
        else:
            index = index + (slice(None),) * (self.ndim - n_real)
        shape: list[int] = []
        strides: list[int] = []
        offset = self.offset
        dim = 0
        for item in index:
            if _is_new_axis(item):
                shape.append(0 if item is False or item is np.False_ else 1)
                strides.append(0)
                continue
            size, stride = self.shape[dim], self.strides[dim]
            if isinstance(item, slice):
                start, stop, step = item.indices(size)
                length = len(range(start, stop, step))
                if length > 0:
                    offset += start * stride
                shape.append(length)
                strides.append(stride * step)
            else:
                i = int(item)
                if not -size <= i < size:
                    raise IndexingError(f"index {i} is out of bounds for axis {dim} with size {size}")
                offset += (i % size) * stride
            dim += 1
        return self._view(_normalize_shape(shape), tuple(strides), offset)

    # Python operators (+, @, ==, +=, ...) and math methods (sum, exp, ...) are netcl.ops functions, installed
    # on Tensor by netcl.ops.operators when netcl.ops is imported (importing anything of netcl imports it).
    __hash__ = object.__hash__  # tensors stay usable as dict keys (identity), as in PyTorch

    # -- misc --------------------------------------------------------------------------------
    def synchronize(self) -> None:
        self.queue.finish()

    def __repr__(self) -> str:
        where = self.device.device_name
        if self.size <= _REPR_LIMIT:
            body = np.array2string(self.to_host(), separator=", ", prefix="Tensor(")
            shape = f", shape={self.shape}" if self.size == 0 and self.ndim != 1 else ""  # (as NumPy's)
            return f"Tensor({body}{shape}, dtype={self.dtype}, device='{where}')"
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, device='{where}')"

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ShapeError(
                f"the truth value of a tensor with {self.size} elements is ambiguous; use any()/all()"
            )
        return bool(self.item())

    def __float__(self) -> float:
        if self.size != 1:
            raise ShapeError(f"float() needs a tensor of one element, this one has shape {self.shape}")
        return float(self.item())

    def __int__(self) -> int:
        if self.size != 1:
            raise ShapeError(f"int() needs a tensor of one element, this one has shape {self.shape}")
        return int(self.item())


# -- layout helpers ------------------------------------------------------------------------------
def _coalesce(shape: Sequence[int], *stride_sets: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 axes and merge neighbours that are contiguous in every stride set."""
    dims = [i for i, s in enumerate(shape) if s != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in stride_sets]
    for i in dims:
        if out_shape and all(st[-1] == ss[i] * shape[i] for st, ss in zip(out_strides, stride_sets)):
            out_shape[-1] *= shape[i]
            for st, ss in zip(out_strides, stride_sets):
                st[-1] = ss[i]
        else:
            out_shape.append(shape[i])
            for st, ss in zip(out_strides, stride_sets):
                st.append(ss[i])
    return out_shape, out_strides
