"""2-D pooling (NCHW): max with indices, average (count_include_pad), adaptive/global average; backward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture, dtypes, shapes
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError
from netcl.ops.declaration import OpDecl, declare


def _check_input(op: str, x: Tensor) -> None:
    if x.ndim != 4:
        raise ShapeError(f"{op}: input must be 4-D (N, C, H, W), got shape {x.shape}")
    if x.dtype not in _DTYPES:
        raise DTypeError(f"{op} supports float16, bfloat16, float32 and float64 tensors, got {x.dtype}")


# float16/bfloat16 are stored half and computed in float32 (pool.cl's LOAD_T/STORE_T)
_DTYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)


class PoolParams:
    """Checked geometry of a pooling window over an (N, C, H, W) input."""

    def __init__(self, op: str, shape: Sequence[int], kernel_size: Any, stride: Any, padding: Any,
                 dilation: Any = 1, ceil_mode: bool = False):
        self.N, self.C, self.H, self.W = (int(v) for v in shape)
        self.KH, self.KW = shapes.pair(kernel_size, "kernel_size", 1)
        self.SH, self.SW = shapes.pair(kernel_size if stride is None else stride, "stride", 1)
        self.PH, self.PW = shapes.pair(padding, "padding", 0)
        self.DH, self.DW = shapes.pair(dilation, "dilation", 1)
        if 2 * self.PH > self.KH or 2 * self.PW > self.KW:
            raise ShapeError(f"{op}: padding {(self.PH, self.PW)} must be at most half the kernel size "
                             f"{(self.KH, self.KW)}")
        self.OH = self._out(self.H, self.KH, self.SH, self.PH, self.DH, ceil_mode)
        self.OW = self._out(self.W, self.KW, self.SW, self.PW, self.DW, ceil_mode)
        if self.OH < 1 or self.OW < 1:
            raise ShapeError(
                f"{op}: kernel {(self.KH, self.KW)} (dilation {(self.DH, self.DW)}) does not fit "
                f"the input {(self.H, self.W)} padded by {(self.PH, self.PW)}"
            )
        self.output_shape = (self.N, self.C, self.OH, self.OW)  # (an instance is shared and only read)

    @staticmethod
    def _out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
        span = size + 2 * p - d * (k - 1) - 1
        if span < 0:
            return 0
        out = (span + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside the input
            out -= 1
        return out

    def args(self) -> tuple[np.int32, ...]:
        """The kernels' geometry arguments (built once: instances are shared through _params)."""
        args = self.__dict__.get("_args")
        if args is None:
            vals = (self.N * self.C, self.H, self.W, self.OH, self.OW, self.KH, self.KW, self.SH, self.SW,
                    self.PH, self.PW, self.DH, self.DW)
            args = self._args = tuple(np.int32(v) for v in vals)
        return args


_params_cache: dict[tuple, PoolParams] = {}


def _params(op: str, shape: Sequence[int], kernel_size: Any, stride: Any, padding: Any,
            dilation: Any = 1, ceil_mode: bool = False) -> PoolParams:
    """PoolParams(...), shared between calls with the same arguments (a training step repeats them);
    invalid arguments raise every time (they are never cached)."""
    try:
        # repr: 2 and 2.0 hash alike, but only the int is a valid size
        key = (op, tuple(shape), repr((kernel_size, stride, padding, dilation)), ceil_mode)
        hit = _params_cache.get(key)
    except TypeError:  # unhashable arguments (lists): no sharing
        return PoolParams(op, shape, kernel_size, stride, padding, dilation, ceil_mode)
    if hit is None:
        hit = PoolParams(op, shape, kernel_size, stride, padding, dilation, ceil_mode)
        if len(_params_cache) < 4096:
            _params_cache[key] = hit
    return hit


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, algorithm: str = "auto") -> tuple[Tensor, Tensor]:
    """(out, indices): window maxima and, as int64, each maximum's flat index ih*W + iw in its plane.

    algorithm: 'element' (one work-item per output element: GPUs), 'rows' (one work-item per output
    row, sequential row reads without div/mod: CPUs), 'auto' by device.
    """
    if algorithm not in ("auto", "element", "rows"):
        raise ValueError(f"algorithm must be 'auto', 'element' or 'rows', got {algorithm!r}")
    _check_input("max_pool2d", x)
    p, launch = _max_pool_plan("max_pool2d", x, x.shape, kernel_size, stride, padding, dilation, ceil_mode,
                               algorithm)
    x = x.contiguous()
    out = Tensor.empty(x.queue, p.output_shape, x.dtype)
    idx = Tensor.empty(x.queue, p.output_shape, np.int64)
    if launch is not None:
        launch(x.queue, x.buffer, x.offset, out.buffer, idx.buffer)
    return out, idx


def _max_pool_plan(op: str, x: Tensor, input_shape: Sequence[int], kernel_size: Any, stride: Any,
                   padding: Any, dilation: Any, ceil_mode: bool, algorithm: str) -> tuple[PoolParams, Any]:
    """(PoolParams, the launch's Plan, None where nothing is computed) of max pooling's forward or backward
    (`op`) for one call signature, kept in netcl.core.capture.plans: per call its tensors (and x's or
    grad_out's offset) fill the kernel's first four arguments."""
    try:
        # repr: 2 and 2.0 hash alike, but only the int is a valid size
        key = (op, id(x.queue.device), x.dtype, tuple(input_shape),
               repr((kernel_size, stride, padding, dilation)), ceil_mode, algorithm)
        hit = capture.plans.get(key)
    except TypeError:  # unhashable arguments (lists): planned every call
        key, hit = None, None
    if hit is not None:
        return hit
    p = _params(op, input_shape, kernel_size, stride, padding, dilation, ceil_mode)
    launch = None
    cpu = x.device.capabilities.kind == "cpu"
    if op == "max_pool2d" and shapes.element_count(p.output_shape):
        prg = kernels.program(x.device, "pool.cl", dtype=x.dtype)
        rows = algorithm == "rows" or (algorithm == "auto" and cpu)
        if rows and (p.KH, p.KW, p.SH, p.SW, p.PH, p.PW, p.DH, p.DW) == (2, 2, 2, 2, 0, 0, 1, 1) \
                and 2 * p.OH <= p.H and 2 * p.OW <= p.W:  # ceil_mode may add a partial last window
            # the usual 2x2/2 pool: two input rows per output row, no bounds checks (1.6x the rows kernel)
            kernel, size, tail = prg.max_pool2d_2x2, (p.OH, p.N * p.C), p.args()[:5]
        elif rows:
            kernel, size, tail = prg.max_pool2d_rows, (p.OH, p.N * p.C), p.args()
        else:
            kernel, size, tail = prg.max_pool2d, (p.OW, p.OH, p.N * p.C), p.args()
        launch = kernel.plan(size, None, (None, np.int64(0), None, None, *tail), (0, 1, 2, 3))
    elif op == "max_pool2d_backward" and shapes.element_count(tuple(input_shape)):
        prg = kernels.program(x.device, "pool.cl", dtype=x.dtype)
        if algorithm == "plane" or (algorithm == "auto" and cpu):
            # CPUs: one work-item per plane scatters through the saved indices (measured 35 ms -> see
            # bench/NOTES.md for the gather at batch 128 on PoCL)
            kernel, size = prg.max_pool2d_backward_plane, (p.N * p.C,)
            tail = (np.int32(p.N * p.C), np.int32(p.H * p.W), np.int32(p.OH * p.OW))
        else:
            kernel, size, tail = prg.max_pool2d_backward, (p.W, p.H, p.N * p.C), p.args()
        launch = kernel.plan(size, None, (None, np.int64(0), None, None, *tail), (0, 1, 2, 3))
    hit = (p, launch)
    if key is not None:
        capture.plans.put(key, hit)
    return hit


def max_pool2d_backward(grad_out: Tensor, indices: Tensor, input_shape: Sequence[int], kernel_size: Any,
                        stride: Any = None, padding: Any = 0, dilation: Any = 1,
                        ceil_mode: bool = False, algorithm: str = "auto") -> Tensor:
    """Gradient of max_pool2d w.r.t. its input: each output's gradient goes to its argmax.

    algorithm: 'gather' (one work-item per input element walks the windows containing it: GPUs),
    'plane' (one work-item per (n, c) plane scatters through the indices: CPUs), 'auto' by device.
    """
    if algorithm not in ("auto", "gather", "plane"):
        raise ValueError(f"algorithm must be 'auto', 'gather' or 'plane', got {algorithm!r}")
    check_same_queue(grad_out, indices)
    _check_input("max_pool2d_backward", grad_out)
    if len(input_shape) != 4:
        raise ShapeError(f"max_pool2d_backward: input_shape must be 4-D, got {tuple(input_shape)}")
    p, launch = _max_pool_plan("max_pool2d_backward", grad_out, input_shape, kernel_size, stride, padding,
                               dilation, ceil_mode, algorithm)
    if tuple(grad_out.shape) != p.output_shape or tuple(indices.shape) != p.output_shape:
        raise ShapeError(
            f"max_pool2d_backward: grad_out {grad_out.shape} and indices {indices.shape} must both "
            f"have the pooled shape {p.output_shape}"
        )
    if indices.dtype != dtypes.int64:
        raise DTypeError(f"max_pool2d_backward: indices must be int64 (from max_pool2d), got {indices.dtype}")
    gy, idx = grad_out.contiguous(), indices.contiguous()
    gx = Tensor.empty(gy.queue, tuple(input_shape), gy.dtype)
    if launch is not None:
        # idx must start at offset 0 for the kernel: copy it if it is a view into a larger buffer
        if idx.offset:
            idx = idx.clone()
        launch(gy.queue, gy.buffer, gy.offset, idx.buffer, gx.buffer)
    return gx


def avg_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """Window means; with count_include_pad the zero padding counts in the divisor (PyTorch's default)."""
    _check_input("avg_pool2d", x)
    p = _params("avg_pool2d", x.shape, kernel_size, stride, padding, 1, ceil_mode)
    x = x.contiguous()
    out = Tensor.empty(x.queue, p.output_shape, x.dtype)
    if out.size:
        tail = (*p.args(), np.int32(bool(count_include_pad)))
        launch = _pool_plan(("avg_pool2d", x.dtype, *map(int, tail)), x, "avg_pool2d",
                            (p.OW, p.OH, p.N * p.C), tail)
        launch(x.queue, x.buffer, x.offset, out.buffer)
    return out


def avg_pool2d_backward(grad_out: Tensor, input_shape: Sequence[int], kernel_size: Any, stride: Any = None,
                        padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    """Gradient of avg_pool2d w.r.t. its input."""
    _check_input("avg_pool2d_backward", grad_out)
    if len(input_shape) != 4:
        raise ShapeError(f"avg_pool2d_backward: input_shape must be 4-D, got {tuple(input_shape)}")
    p = _params("avg_pool2d_backward", input_shape, kernel_size, stride, padding, 1, ceil_mode)
    if tuple(grad_out.shape) != p.output_shape:
        raise ShapeError(f"avg_pool2d_backward: grad_out {grad_out.shape} must have the pooled shape "
                         f"{p.output_shape}")
    gy = grad_out.contiguous()
    gx = Tensor.empty(gy.queue, tuple(input_shape), gy.dtype)
    if gx.size:
        tail = (*p.args(), np.int32(bool(count_include_pad)))
        launch = _pool_plan(("avg_pool2d_backward", gy.dtype, *map(int, tail)), gy, "avg_pool2d_backward",
                            (p.W, p.H, p.N * p.C), tail)
        launch(gy.queue, gy.buffer, gy.offset, gx.buffer)
    return gx


def _pool_plan(key: tuple, x: Tensor, kernel: str, size: tuple[int, ...], tail: Sequence[Any]) -> Any:
    """The Plan of one average-pooling launch of pool.cl's `kernel` over `size` (the kernel's arguments: the
    input's buffer and offset, the output's buffer, then `tail`), kept in netcl.core.capture.plans under
    `key` and the device: per call the two tensors fill its first three arguments."""
    key = (*key, id(x.queue.device))
    launch = capture.plans.get(key)
    if launch is None:
        prg = kernels.program(x.device, "pool.cl", dtype=x.dtype)
        launch = getattr(prg, kernel).plan(size, None, (None, np.int64(0), None, *tail), (0, 1, 2))
        capture.plans.put(key, launch)
    return launch


def _adaptive_size(output_size: Any, h: int, w: int) -> tuple[int, int]:
    if isinstance(output_size, (int, np.integer)):
        output_size = (output_size, output_size)
    try:
        oh, ow = output_size
    except (TypeError, ValueError):
        raise ShapeError(f"output_size must be an int or a pair, got {output_size!r}") from None
    oh, ow = h if oh is None else int(oh), w if ow is None else int(ow)
    if oh < 1 or ow < 1:
        raise ShapeError(f"adaptive_avg_pool2d: output_size {(oh, ow)} must be positive")
    return oh, ow


def _adaptive_args(n: int, c: int, h: int, w: int, oh: int, ow: int) -> list[np.int32]:
    return [np.int32(v) for v in (n * c, h, w, oh, ow)]


def adaptive_avg_pool2d(x: Tensor, output_size: Any) -> Tensor:
    """Average over PyTorch's adaptive windows to (N, C, *output_size); output_size=1 is global pooling."""
    _check_input("adaptive_avg_pool2d", x)
    n, c, h, w = x.shape
    oh, ow = _adaptive_size(output_size, h, w)
    if h == 0 or w == 0:
        raise ShapeError(f"adaptive_avg_pool2d: input {x.shape} has an empty plane")
    x = x.contiguous()
    out = Tensor.empty(x.queue, (n, c, oh, ow), x.dtype)
    if out.size:
        launch = _pool_plan(("adaptive_avg_pool2d", x.dtype, (n, c, h, w), oh, ow), x, "adaptive_avg_pool2d",
                            (ow, oh, n * c), _adaptive_args(n, c, h, w, oh, ow))
        launch(x.queue, x.buffer, x.offset, out.buffer)
    return out


def adaptive_avg_pool2d_backward(grad_out: Tensor, input_shape: Sequence[int]) -> Tensor:
    """Gradient of adaptive_avg_pool2d w.r.t. its input of shape `input_shape`."""
    _check_input("adaptive_avg_pool2d_backward", grad_out)
    if len(input_shape) != 4 or tuple(input_shape[:2]) != tuple(grad_out.shape[:2]):
        raise ShapeError(
            f"adaptive_avg_pool2d_backward: input_shape {tuple(input_shape)} must be 4-D with the "
            f"same N, C as grad_out {grad_out.shape}"
        )
    n, c, h, w = (int(v) for v in input_shape)
    oh, ow = grad_out.shape[2:]
    gy = grad_out.contiguous()
    gx = Tensor.empty(gy.queue, (n, c, h, w), gy.dtype)
    if gx.size:
        launch = _pool_plan(("adaptive_avg_pool2d_backward", gy.dtype, (n, c, h, w), oh, ow), gy,
                            "adaptive_avg_pool2d_backward", (w, h, n * c), _adaptive_args(n, c, h, w, oh, ow))
        launch(gy.queue, gy.buffer, gy.offset, gx.buffer)
    return gx


def global_avg_pool2d(x: Tensor) -> Tensor:
    """Mean over H and W, kept as (N, C, 1, 1)."""
    return adaptive_avg_pool2d(x, 1)


# the ops on Nodes, made from these (netcl.ops.declaration)
declare(OpDecl("max_pool2d", max_pool2d, max_pool2d_backward, inputs=("x",), saves=("indices",),
               replay="netcl.ops.pool",
               hide=("algorithm",), functional=("max_pool2d",),
               doc="Window maxima; the gradient goes to each window's argmax (indices saved by the forward)."
               ))
declare(OpDecl("avg_pool2d", avg_pool2d, avg_pool2d_backward, inputs=("x",), functional=("avg_pool2d",),
               replay="netcl.ops.pool"))
declare(OpDecl("adaptive_avg_pool2d", adaptive_avg_pool2d, adaptive_avg_pool2d_backward, inputs=("x",),
               functional=("adaptive_avg_pool2d",), replay="netcl.ops.pool"))

__all__ = [
    "adaptive_avg_pool2d",
    "adaptive_avg_pool2d_backward",
    "avg_pool2d",
    "avg_pool2d_backward",
    "global_avg_pool2d",
    "max_pool2d",
    "max_pool2d_backward",
]
