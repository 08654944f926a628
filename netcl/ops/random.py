"""Device-side random numbers from Philox4x32-10: reproducible from a seed on any device (random.cl).

Each call draws from (seed, counter): a Generator advances its counter past what it used, so
successive calls give fresh numbers and the same seed replays the same sequence. Uniform and
integer bits are identical on every device; normals use the device's log/sin/cos and so agree
across devices to a few ulp.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import dtypes, launch_labels
from netcl.core.backend import as_queue
from netcl.core.capture import capturing
from netcl.core.tensor import Tensor, _normalize_shape
from netcl.errors import DTypeError, ShapeError

_KIND = {"uniform": 0, "normal": 1, "integer": 2}


def check_seed(seed: Any, where: str = "manual_seed") -> int:
    """`seed` as an int, checked: an integer (not a bool) in [-2**63, 2**64) (ValueError or TypeError naming
    `where` otherwise)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{where}: seed must be an int, got {seed!r}")
    seed = int(seed)
    if not -(1 << 63) <= seed < 1 << 64:
        raise ValueError(f"{where}: seed must lie in [-2**63, 2**64) (a 64-bit seed), got {seed}")
    return seed


class Generator:
    """A Philox stream: 64-bit seed (the key) and a 64-bit counter of 128-bit blocks used."""

    def __init__(self, seed: int = 0):
        self._lock = threading.Lock()
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> Generator:
        """Restart the stream from `seed`: an integer in [-2**63, 2**64), a negative one taken as its 64-bit
        two's complement (torch.manual_seed's range and rule; a larger seed is an error, not wrapped onto a
        smaller one's stream)."""
        self.seed = check_seed(seed) & 0xFFFFFFFFFFFFFFFF
        self.counter = 0
        return self

    def take(self, blocks: int) -> int:
        """Reserve `blocks` counter values; returns the first."""
        with self._lock:
            start = self.counter
            self.counter = (self.counter + blocks) & 0xFFFFFFFFFFFFFFFF
            return start

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "counter": self.counter}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed = int(state["seed"])
        self.counter = int(state["counter"])


default_generator = Generator(0)


def manual_seed(seed: int) -> Generator:
    """Reseed the default generator (used when no seed or generator is given)."""
    return default_generator.manual_seed(seed)


def _pick_generator(seed: int | None, generator: Generator | None) -> Generator:
    if seed is not None and generator is not None:
        raise ValueError("pass either seed= or generator=, not both")
    if generator is not None and not isinstance(generator, Generator):  # (an int: AttributeError 'take')
        raise TypeError(f"generator must be a netcl.ops.random.Generator (Generator(seed)), got "
                        f"{type(generator).__name__} {generator!r}; for a fixed seed pass seed=")
    if seed is not None:
        return Generator(seed)
    return generator if generator is not None else default_generator


def _launch(q: Any, shape: Any, dtype: Any, kind: str, gen: Generator,
            low: float = 0.0, high: float = 1.0, int_low: int = 0, int_range: int = 1,
            refresh: bool = True) -> Tensor:
    queue = as_queue(q)
    dt = dtypes.normalize(dtype)
    out = Tensor.empty(queue, _normalize_shape(shape), dt)
    n = out.size
    is_double = dt == dtypes.float64
    wide = dt == dtypes.int64
    if kind == "integer":
        per_item = 2 if wide else 4
    elif is_double:
        per_item = 2
    else:
        per_item = 4
    items = (n + per_item - 1) // per_item
    counter0 = gen.take(max(items, 1))
    if n == 0:
        return out
    extra: dict[str, Any] = {"IS_WIDE": None} if wide else {}
    prg = kernels.program(queue.device, "random.cl", dtype=dt, KIND=_KIND[kind], PER_ITEM=per_item,
                          SCALAR="double" if is_double else "float", **extra)
    scalar = np.float64 if is_double else np.float32
    prg.philox_fill(
        queue, (items,), None,
        out.buffer, np.int64(0), np.int64(n),
        np.uint32(gen.seed & 0xFFFFFFFF), np.uint32(gen.seed >> 32), np.uint64(counter0),
        scalar(low), scalar(high), np.int64(int_low), np.uint64(int_range),
    )
    if refresh:  # a replay draws the next numbers of the stream (a seed= call: the same)
        draw_on_replay(gen, max(items, 1), (3, 4, 5))
    return out


def draw_on_replay(gen: Generator, blocks: int, at: tuple[int, int, int]) -> None:
    """Inside a graph capture: before each replay, the launch just recorded takes the stream's next `blocks`
    counter values as a new call would (its arguments at positions `at`: the seed's low and high words and the
    first counter). rand's launches and the sampler's draw (netcl.ops.sampling) share it."""
    graph = capturing()
    if graph is None:
        return

    def next_draw(args: list) -> None:
        args[at[0]], args[at[1]] = np.uint32(gen.seed & 0xFFFFFFFF), np.uint32(gen.seed >> 32)
        args[at[2]] = np.uint64(gen.take(blocks))

    graph.on_replay(next_draw)


def rand(q: Any, shape: Any, dtype: Any = np.float32, low: float = 0.0, high: float = 1.0,
         seed: int | None = None, generator: Generator | None = None) -> Tensor:
    """Uniform numbers in [low, high) (24 random bits for float32, 53 for float64, 11 for float16, 8 for
    bfloat16)."""
    dt = dtypes.normalize(dtype)
    if not dtypes.is_floating(dt):
        raise DTypeError(f"rand makes floating-point numbers, not {dt}; use randint for integers")
    return _launch(q, shape, dt, "uniform", _pick_generator(seed, generator), low=low, high=high,
                   refresh=seed is None)


def randn(q: Any, shape: Any, dtype: Any = np.float32, mean: float = 0.0, std: float = 1.0,
          seed: int | None = None, generator: Generator | None = None) -> Tensor:
    """Normal numbers N(mean, std^2) by the Box-Muller transform."""
    dt = dtypes.normalize(dtype)
    if not dtypes.is_floating(dt):
        raise DTypeError(f"randn makes floating-point numbers, not {dt}")
    return _launch(q, shape, dt, "normal", _pick_generator(seed, generator), low=mean, high=std,
                   refresh=seed is None)


def randint(q: Any, low: int, high: int, shape: Any, dtype: Any = np.int32,
            seed: int | None = None, generator: Generator | None = None) -> Tensor:
    """Integers in [low, high). int32 maps 32 random bits, int64 maps 64 (multiply-high: the bias
    is below range / 2^32, resp. range / 2^64)."""
    dt = dtypes.normalize(dtype)
    if dt not in (dtypes.int32, dtypes.int64):
        raise DTypeError(f"randint makes int32 or int64, not {dt}")
    low, high = int(low), int(high)
    if high <= low:
        raise ShapeError(f"randint needs low < high, got low={low}, high={high}")
    info = np.iinfo(dt)
    if low < info.min or high - 1 > info.max:
        raise DTypeError(f"[{low}, {high}) does not fit in {dt}")
    span = high - low
    if dt == dtypes.int32 and span > 1 << 32:
        raise DTypeError(f"randint range {span} is too wide for int32")
    return _launch(q, shape, dt, "integer", _pick_generator(seed, generator), int_low=low, int_range=span,
                   refresh=seed is None)


def install() -> None:
    """Tensor.rand / randn / randint: these functions as classmethods (Tensor.randn(q, shape, seed=0))."""
    alias = launch_labels.transparent  # the profiler names rand/randn/randint, not these lambdas
    Tensor.rand = classmethod(alias(
        lambda cls, q, shape, dtype=np.float32, **kw: rand(q, shape, dtype, **kw)))
    Tensor.randn = classmethod(alias(
        lambda cls, q, shape, dtype=np.float32, **kw: randn(q, shape, dtype, **kw)))
    Tensor.randint = classmethod(alias(
        lambda cls, q, low, high, shape, dtype=np.int32, **kw: randint(q, low, high, shape, dtype, **kw)))


__all__ = [
    "Generator",
    "default_generator",
    "manual_seed",
    "rand",
    "randint",
    "randn",
]
