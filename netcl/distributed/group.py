"""ProcessGroup: the collectives every backend gives on host arrays, the reduction table, and the group of
one.

Backends (shm: one host through shared memory; mpi: mpi4py) implement all_reduce, broadcast, all_gather and
barrier on contiguous NumPy arrays, in place; netcl.distributed.collectives moves Tensors to and from them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# op name -> the NumPy ufunc that combines two operands ("mean" is a sum scaled by 1/world)
REDUCE_OPS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
# a small number per op and dtype, exchanged so ranks can tell that they made the same call
OP_CODES = {name: i + 1 for i, name in enumerate(REDUCE_OPS)}
DTYPE_CODES = {
    np.dtype(t): i + 1
    for i, t in enumerate(
        (
            "float16",
            "float32",
            "float64",
            "int8",
            "uint8",
            "int16",
            "uint16",
            "int32",
            "uint32",
            "int64",
            "uint64",
        )
    )
}
REDUCE_BLOCK = 1 << 18  # bytes combined per pass when more than two operands meet (stays in cache)


def check_op(op: str, dtype: np.dtype, weights: Sequence[float] | None = None) -> str:
    """The op's name, checked against `dtype` (DistributedError-free: these are caller errors)."""
    if not isinstance(op, str) or op.lower() not in REDUCE_OPS:
        raise ValueError(f"reduction op {op!r}: expected one of {', '.join(REDUCE_OPS)}")
    op = op.lower()
    if np.dtype(dtype) not in DTYPE_CODES:
        raise TypeError(
            f"collectives take arrays of {', '.join(map(str, DTYPE_CODES))}; got {np.dtype(dtype)}"
        )
    if op == "mean" and np.dtype(dtype).kind != "f":
        raise TypeError(
            f"op 'mean' needs a floating-point dtype, got {np.dtype(dtype)}; use 'sum' and divide"
        )
    if weights is not None and (op != "sum" or np.dtype(dtype).kind != "f"):
        raise ValueError("weights go with op 'sum' on floating-point data")
    return op


def reduce_into(
    out: np.ndarray,
    operands: Sequence[np.ndarray],
    op: str,
    weights: Sequence[float] | None = None,
    scale: float | None = None,
) -> None:
    """out = operands[0] (op) operands[1] (op) ... in rank order, then times `scale` (for mean); with
    `weights`,
    out = sum_j weights[j] * operands[j]. `out` may be one of the operands. Works through blocks when more
    than two operands meet, so the running result stays in cache."""
    ufunc = REDUCE_OPS[op]
    n = out.size
    if n == 0:
        return
    alias = next((i for i, a in enumerate(operands) if np.may_share_memory(a, out)), 0)
    if (
        alias > 0
    ):  # `out` is overwritten from the first pass on: it must be read there (the op is commutative)
        order = [alias] + [i for i in range(len(operands)) if i != alias]
        operands = [operands[i] for i in order]
        weights = None if weights is None else [weights[i] for i in order]
    single_pass = len(operands) <= 2 and weights is None
    block = n if single_pass else max(REDUCE_BLOCK // out.itemsize, 1)
    tmp = np.empty(min(block, n), out.dtype) if weights is not None else None
    for start in range(0, n, block):
        end = min(start + block, n)
        o = out[start:end]
        parts = [a[start:end] for a in operands]
        if weights is not None:
            np.multiply(parts[0], weights[0], out=o)
            for w, part in zip(weights[1:], parts[1:]):
                t = tmp[: end - start]
                np.multiply(part, w, out=t)
                np.add(o, t, out=o)
        elif len(parts) == 1:
            if o is not parts[0]:
                np.copyto(o, parts[0])
        else:
            ufunc(parts[0], parts[1], out=o)
            for part in parts[2:]:
                ufunc(o, part, out=o)
        if scale is not None:
            np.multiply(o, scale, out=o, casting="unsafe")


def c_order(array: np.ndarray) -> np.ndarray:
    """`array` as a C-contiguous array of the same shape (0-d stays 0-d, unlike np.ascontiguousarray)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else array.copy(order="C")


def chunk_bounds(count: int, world: int, itemsize: int) -> list[tuple[int, int]]:
    """Split `count` elements into `world` contiguous chunks, in rank order, each starting on a 64-byte line
    where possible (so two ranks never write one cache line)."""
    align = max(64 // itemsize, 1)
    per = -(-count // world)
    per = -(-per // align) * align
    return [(min(r * per, count), min((r + 1) * per, count)) for r in range(world)]


class ProcessGroup:
    """The ranks of one job. Collectives take contiguous NumPy arrays and work in place; every rank must make
    the same calls, in the same order, with the same sizes."""

    backend = "none"

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size

    def all_reduce(self, array: np.ndarray, op: str = "sum", weights: Sequence[float] | None = None) -> None:
        raise NotImplementedError

    def broadcast(self, array: np.ndarray, root: int = 0) -> None:
        raise NotImplementedError

    def all_gather(self, array: np.ndarray) -> np.ndarray:
        """A new array of shape (world_size, *array.shape): every rank's array, in rank order."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def check_root(self, root: int) -> int:
        if (
            not isinstance(root, (int, np.integer))
            or isinstance(root, bool)
            or not 0 <= root < self.world_size
        ):
            raise ValueError(f"root must be a rank in [0, {self.world_size}), got {root!r}")
        return int(root)

    @staticmethod
    def check_array(array: np.ndarray, what: str) -> np.ndarray:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{what} takes a NumPy array here, got {type(array).__name__}")
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"{what} works in place on a C-contiguous, writeable array")
        return array

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank {self.rank} of {self.world_size})"


class SingleGroup(ProcessGroup):
    """A job of one process: every collective leaves the data as it is (a mean of one is itself)."""

    backend = "single"

    def __init__(self) -> None:
        super().__init__(0, 1)

    def all_reduce(self, array: np.ndarray, op: str = "sum", weights: Sequence[float] | None = None) -> None:
        array = self.check_array(array, "all_reduce")
        check_op(op, array.dtype, weights)
        if weights is not None:
            np.multiply(array, weights[0], out=array)

    def broadcast(self, array: np.ndarray, root: int = 0) -> None:
        self.check_array(array, "broadcast")
        self.check_root(root)

    def all_gather(self, array: np.ndarray) -> np.ndarray:
        return np.array(array)[None]

    def barrier(self) -> None:
        pass
