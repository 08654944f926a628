"""What a k-means estimator clusters: checks of its input, and the two ways rows reach the kernels: held
on the device (`DeviceData`, a netcl Tensor or an array that fits), or streamed from host memory
(`StreamedData`) in chunks through two device buffers, the upload of chunk i+1 (pinned staging on
devices behind a bus, netcl.core.memory) running on a second queue while the kernels of chunk i run."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyopencl as cl

import netcl.ops as ops
from netcl.core import dtypes
from netcl.core.backend import Queue, as_queue, enqueue_copy, handoff
from netcl.core.device import DeviceHandle, manager
from netcl.core.memory import staging
from netcl.core.tensor import Tensor
from netcl.errors import DeviceMismatchError, DTypeError, NetclError, ShapeError
from netcl.ops.kmeans import HALF_DTYPES, PP_BLOCK, compute_dtype, kmeans_copy_rows

DEVICE_SHARE = 0.5  # an array is streamed when it needs more than this share of the device's memory
STREAM_CHUNK_BYTES = 64 << 20  # default chunk of a streamed array


class NonFiniteError(NetclError, ValueError):
    """The data holds NaN or infinity (k-means distances would be meaningless)."""


def check_random_state(seed: Any) -> np.random.RandomState:
    """scikit-learn's random_state rule: None (NumPy's global RandomState), an int seed, or a RandomState."""
    if seed is None or seed is np.random:
        return np.random.mtrand._rand
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        return np.random.RandomState(int(seed))
    if isinstance(seed, np.random.RandomState):
        return seed
    raise ValueError(f"random_state must be None, an int or a numpy.random.RandomState, got {seed!r}")


def resolve_queue(X: Any, device: Any) -> Queue:
    """The queue to run on: a Tensor's own (DeviceMismatchError if `device` names another device),
    else `device` (a DeviceHandle, Queue, or a kind or name as netcl devices lists), else the default."""
    if device is None:
        chosen = None
    elif isinstance(device, str):
        chosen = (manager.default(device) if device in ("auto", "gpu", "cpu", "accelerator")
                  else manager.get(device)).queue
    elif isinstance(device, (DeviceHandle, Queue)):
        chosen = as_queue(device)
    else:
        raise TypeError(f"device must be None, a device name or kind, a DeviceHandle or a Queue, got "
                        f"{type(device).__name__}")
    if isinstance(X, Tensor):
        if chosen is not None and chosen.device is not X.device:
            raise DeviceMismatchError(
                f"the data lives on {X.device.describe()} but device={device!r} is "
                f"{chosen.device.describe()}; move it with `.to(queue)` or drop device="
            )
        return X.queue
    return chosen if chosen is not None else manager.default("auto").queue


def float_dtype(arr_dtype: np.dtype, device: Any, what: str, half: bool = True) -> np.dtype:
    """float32 and float64 stay, and (half=True) float16 and bfloat16, which k-means reads as stored and
    computes in float32; integers and booleans become float64 (float32 on a device without fp64), as
    scikit-learn converts them; anything else is a DTypeError."""
    dt = np.dtype(arr_dtype)
    if dt in (dtypes.float32, dtypes.float64) or (half and dt in HALF_DTYPES):
        return dt
    if dt in HALF_DTYPES:
        return dtypes.float32
    if dt.kind in "iub":
        return dtypes.float64 if device.capabilities.fp64 else dtypes.float32
    raise DTypeError(f"{what} must hold real numbers (float32, float64, float16, bfloat16 or integers), got "
                     f"dtype {dt}; convert it with .astype(np.float32)")


def _first_bad_row(X: np.ndarray) -> int | None:
    step = max(1, (64 << 20) // max(1, X.shape[1] * X.itemsize))
    for start in range(0, X.shape[0], step):
        ok = np.isfinite(X[start:start + step]).all(axis=1)
        if not ok.all():
            return start + int(np.argmin(ok))
    return None


def host_array(X: Any, device: Any, what: str = "X", n_features: int | None = None,
               check_finite: bool = True, half: bool = True) -> np.ndarray:
    """A C-contiguous float32/float64 (or, with half, float16/bfloat16) 2-D NumPy array of `X`, checked
    (rank, dtype, feature count and, unless the caller checks them on the device, finite values)."""
    if isinstance(X, Tensor):
        raise TypeError(f"{what}: expected a host array here, got a netcl Tensor")
    try:
        arr = np.asarray(X)
    except Exception as exc:  # ragged nested lists and the like
        raise ShapeError(f"{what} must be a 2-D array of numbers: {exc}") from None
    if arr.ndim != 2:
        raise ShapeError(f"{what} must be 2-D (samples x features), got shape {arr.shape}"
                         + ("; reshape a single feature with X.reshape(-1, 1)" if arr.ndim == 1 else ""))
    dt = float_dtype(arr.dtype, device, what, half)
    arr = np.ascontiguousarray(arr, dtype=dt)
    check_features(arr.shape, what, n_features)
    bad = _first_bad_row(arr) if check_finite else None
    if bad is not None:
        raise NonFiniteError(non_finite_message(what, bad, arr.shape[0]))
    return arr


def non_finite_message(what: str, row: int, n: int) -> str:
    return (f"{what} holds NaN or infinity in row {row} (of {n}); "
            "remove or impute those rows before clustering")


def check_features(shape: tuple[int, ...], what: str, n_features: int | None) -> None:
    if shape[0] == 0 or shape[1] == 0:
        raise ShapeError(
            f"{what} of shape {tuple(shape)} is empty: k-means needs at least one sample and feature"
        )
    if n_features is not None and shape[1] != n_features:
        raise ShapeError(f"{what} has {shape[1]} features, but the estimator was fitted with {n_features}")


def check_tensor(X: Tensor, what: str = "X", n_features: int | None = None) -> Tensor:
    """A contiguous float32/float64/float16/bfloat16 2-D Tensor of finite values (DTypeError, ShapeError,
    NonFiniteError)."""
    if X.ndim != 2:
        raise ShapeError(f"{what} must be 2-D (samples x features), got shape {X.shape}")
    if X.dtype not in (dtypes.float32, dtypes.float64, *HALF_DTYPES):
        raise DTypeError(f"{what} must be a float32, float64, float16 or bfloat16 Tensor, got {X.dtype}; "
                         "cast it with netcl.ops.cast(x, np.float32)")
    check_features(X.shape, what, n_features)
    X = X.contiguous()
    check_finite_rows(X, what)
    return X


def check_finite_rows(X: Tensor, what: str) -> None:
    """NonFiniteError naming the first row of the 2-D Tensor `X` that holds NaN or infinity: one reduction
    on the device (and a second, per row, only when there is one)."""
    if not bool(ops.all(ops.isfinite(X)).item()):
        rows = ops.all(ops.isfinite(X), axis=1).to_host()
        raise NonFiniteError(non_finite_message(what, int(np.argmin(rows)), X.shape[0]))


SHIFT_ROWS = 16384  # rows of the sample whose mean centres the data (Data.mean)


class Data(ABC):
    """Rows to cluster on `queue`: shape, dtype (as stored), where they live, and per-feature statistics."""

    queue: Queue
    n: int
    d: int
    dtype: np.dtype
    is_tensor: bool

    @property
    def compute_dtype(self) -> np.dtype:
        """The dtype of centers, shift, distances and weights: float32 for half rows, else the rows'."""
        return compute_dtype(self.dtype)

    @abstractmethod
    def chunks(self) -> Iterator[tuple[Tensor, int]]:
        """(rows as a device Tensor, data-set index of the first) for every block of rows, in order."""

    @abstractmethod
    def host_rows(self, idx: np.ndarray) -> np.ndarray:
        """Rows `idx` as a host array."""

    @abstractmethod
    def rows(self, idx: np.ndarray, shift: np.ndarray | None = None, out: Tensor | None = None) -> Tensor:
        """Rows `idx` on the device (minus `shift`, the host copy of the device shift, when given: then in
        compute_dtype)."""

    def mean(self) -> np.ndarray:
        """The centre the kernels subtract (a host array of compute_dtype): each feature's mean over at
        most SHIFT_ROWS evenly spaced rows (all rows when there are no more), summed in float64 by NumPy.
        The same rows and the same sum wherever the rows live, so an array held on the device, streamed in
        chunks, or given as a Tensor is centred by the same bits (a device reduction's order differs from
        NumPy's, and from one chunking to another); the sample's mean is within ~sigma / 128 of the whole
        one, which is all centring needs."""
        idx = np.arange(0, self.n, max(1, -(-self.n // SHIFT_ROWS)), dtype=np.int64)
        return self.host_rows(idx).mean(axis=0, dtype=np.float64).astype(self.compute_dtype)

    @abstractmethod
    def mean_variance(self) -> float:
        """The mean over features of each feature's variance (scikit-learn's scale of `tol`)."""


class DeviceData(Data):
    """Rows held in one device Tensor."""

    def __init__(self, x: Tensor, is_tensor: bool, host: np.ndarray | None = None):
        self.x = x
        self.queue = x.queue
        self.n, self.d = x.shape
        self.dtype = x.dtype
        self.is_tensor = is_tensor
        self._host = host  # the host array it came from (rows are read back from it, not from the device)

    def chunks(self) -> Iterator[tuple[Tensor, int]]:
        yield self.x, 0

    def host_rows(self, idx: np.ndarray) -> np.ndarray:
        if self._host is not None:
            return self._host[idx]
        out = Tensor.empty(self.queue, (len(idx), self.d), self.dtype)
        kmeans_copy_rows(self.x, Tensor.from_host(self.queue, np.asarray(idx, np.int32)), out)
        return out.to_host()

    def rows(self, idx: np.ndarray, shift: np.ndarray | None = None, out: Tensor | None = None) -> Tensor:
        if out is None:
            dt = self.dtype if shift is None else self.compute_dtype
            out = Tensor.empty(self.queue, (len(idx), self.d), dt)
        if len(idx):
            shift_t = None if shift is None else Tensor.from_host(self.queue, shift)
            kmeans_copy_rows(
                self.x, Tensor.from_host(self.queue, np.asarray(idx, np.int32)), out, shift=shift_t
            )
        return out

    # The variance on the device, where the rows are (a host pass over a 256 MB array took 50 ms on the GPU
    # machine, five Lloyd iterations' worth).
    def mean_variance(self) -> float:
        x = self.x if self.dtype == self.compute_dtype else ops.cast(self.x, self.compute_dtype)
        return float(ops.var(x, axis=0).to_host().astype(np.float64).mean())


class StreamedData(Data):
    """Rows of a host array, streamed to the device in chunks of `chunk_rows` (a multiple of PP_BLOCK) on
    every pass."""

    def __init__(self, host: np.ndarray, queue: Queue, chunk_rows: int):
        self.host = host
        self.queue = queue
        self.n, self.d = host.shape
        self.dtype = host.dtype
        self.is_tensor = False
        self.chunk_rows = int(min(chunk_rows, self.n))
        self._buffers = [Tensor.empty(queue, (self.chunk_rows, self.d), self.dtype) for _ in range(2)]
        self._copy_queue = queue.device.new_queue()
        self._done: list[Any] = [None, None]  # marker after the kernels that last read each buffer
        self._staged = queue.device.kind != "cpu"  # CPU devices share host memory: no staging copy

    def _upload(self, i: int) -> Any:
        slot = i % 2
        start = i * self.chunk_rows
        src = self.host[start:start + self.chunk_rows]
        cq = self._copy_queue
        if self._done[slot] is not None:  # the buffer's previous chunk must be consumed first
            cl.enqueue_barrier(cq.cl, wait_for=[self._done[slot]])
        dst = self._buffers[slot]
        if self._staged:
            staging(cq).write(dst.buffer, 0, src)
        else:
            enqueue_copy(cq, dst.buffer, src, is_blocking=True)
        return handoff(cq)

    def chunks(self) -> Iterator[tuple[Tensor, int]]:
        count = -(-self.n // self.chunk_rows)
        uploaded = self._upload(0)
        for i in range(count):
            slot = i % 2
            start = i * self.chunk_rows
            rows = min(self.chunk_rows, self.n - start)
            cl.enqueue_barrier(self.queue.cl, wait_for=[uploaded])
            yield self._buffers[slot][:rows], start
            self._done[slot] = handoff(self.queue)
            if i + 1 < count:
                uploaded = self._upload(i + 1)

    def host_rows(self, idx: np.ndarray) -> np.ndarray:
        return self.host[idx]

    def rows(self, idx: np.ndarray, shift: np.ndarray | None = None, out: Tensor | None = None) -> Tensor:
        block = self.host[idx]
        dt = self.dtype
        if shift is not None:
            block, dt = block.astype(self.compute_dtype) - shift, self.compute_dtype
        if out is None:
            return Tensor.from_host(self.queue, np.ascontiguousarray(block, dtype=dt))
        if len(idx):
            out[:len(idx)].copy_from_host(np.ascontiguousarray(block, dtype=out.dtype))
        return out

    def mean_variance(self) -> float:
        step = max(1, STREAM_CHUNK_BYTES // (self.d * 8))
        mean = self.host.mean(axis=0, dtype=np.float64)
        total = np.zeros(self.d)
        for start in range(0, self.n, step):
            block = self.host[start:start + step].astype(np.float64) - mean
            total += np.einsum("ij,ij->j", block, block)
        return float(np.mean(total / self.n))


def stream_chunk_rows(queue: Queue, n: int, d: int, itemsize: int, chunk_rows: int | None) -> int | None:
    """Rows per streamed chunk for an n x d array, or None to hold it on the device. An explicit chunk_rows
    streams (rounded up to whole k-means++ blocks); otherwise only arrays that would take more than
    DEVICE_SHARE of the device's memory (or more than one allocation may) are streamed."""
    if chunk_rows is not None:
        if chunk_rows >= n:
            return None
        return -(-int(chunk_rows) // PP_BLOCK) * PP_BLOCK
    caps = queue.device.capabilities
    nbytes = n * d * itemsize
    if nbytes <= min(caps.max_alloc, int(caps.global_mem * DEVICE_SHARE)):
        return None
    rows = max(PP_BLOCK, min(STREAM_CHUNK_BYTES, caps.max_alloc // 4) // (d * itemsize))
    return rows // PP_BLOCK * PP_BLOCK


def as_data(X: Any, queue: Queue, chunk_rows: int | None = None, what: str = "X",
            n_features: int | None = None, dtype: Any = None) -> Data:
    """Checked rows on `queue`: a Tensor stays where it is; a host array goes to the device whole, or is
    streamed when it is large (or chunk_rows asks for it). `dtype` converts (a fitted model's)."""
    if isinstance(X, Tensor):
        x = check_tensor(X, what, n_features)
        if dtype is not None and x.dtype != dtype:  # converted to the fitted model's, as a host array is
            x = x.astype(dtype)
        return DeviceData(x, is_tensor=True)
    arr = host_array(X, queue.device, what, n_features, check_finite=False)
    if dtype is not None and arr.dtype != dtype:
        arr = arr.astype(dtype)
    dtypes.check_supported_on(arr.dtype, queue.device)
    rows = stream_chunk_rows(queue, arr.shape[0], arr.shape[1], arr.itemsize, chunk_rows)
    if rows is None:  # checked where it lands: the device reads it faster than the host
        x = Tensor.from_host(queue, arr)
        check_finite_rows(x, what)
        return DeviceData(x, is_tensor=False, host=arr)
    bad = _first_bad_row(arr)
    if bad is not None:
        raise NonFiniteError(non_finite_message(what, bad, arr.shape[0]))
    return StreamedData(arr, queue, rows)


def check_weights(sample_weight: Any, data: Data) -> tuple[Tensor | None, np.ndarray | None]:
    """(device Tensor, host array) of per-sample weights in the data's compute_dtype, or (None, None);
    a scalar weighs every sample alike. Weights must be finite, non-negative and not all zero."""
    if sample_weight is None:
        return None, None
    if isinstance(sample_weight, Tensor):
        if sample_weight.queue.device is not data.queue.device:
            raise DeviceMismatchError(
                f"sample_weight lives on {sample_weight.device.describe()} but the data on "
                f"{data.queue.device.describe()}"
            )
        sample_weight = sample_weight.to_host()
    w = np.asarray(sample_weight)
    if w.ndim == 0:
        w = np.full(data.n, w)
    if w.dtype.kind not in "fiub":
        raise DTypeError(f"sample_weight must hold real numbers, got dtype {w.dtype}")
    if w.shape != (data.n,):
        raise ShapeError(f"sample_weight must have shape ({data.n},), one weight per sample, got {w.shape}")
    w = np.ascontiguousarray(w, dtype=data.compute_dtype)
    if not np.isfinite(w).all():
        raise NonFiniteError(f"sample_weight holds NaN or infinity at index {int(np.argmin(np.isfinite(w)))}")
    if (w < 0).any():
        raise ValueError(
            f"sample_weight must be non-negative, got {w[w < 0][0]} at index {int(np.argmax(w < 0))}"
        )
    if not w.sum() > 0:
        raise ValueError("sample_weight must not be all zero")
    return Tensor.from_host(data.queue, w), w
