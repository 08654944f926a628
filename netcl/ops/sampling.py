"""Next-token sampling on the device (kernels/sampling.cl): greedy, temperature, top-k and top-p.

Sampling stays on the device so a recorded decode step (netcl.graph) holds the whole step: the host only
reads the chosen tokens (4 bytes a row) instead of a row of logits, and never sorts a vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import dtypes
from netcl.core.tensor import Tensor, check_same_queue
from netcl.errors import DTypeError, ShapeError
from netcl.ops.elementwise import cast
from netcl.ops.random import Generator, default_generator, draw_on_replay

__all__ = ["check_sampling", "sample"]

# the layout: None (by the device: one work-item a row on CPUs, a work-group a row elsewhere), "cpu" or "gpu"
variant_override: str | None = None
# greedy: loads a work-item issues before it compares any (a GPU's one-row decode step waits for them)
GREEDY_UNROLL = 8
# on GPUs, the work-items of a row's work-group at most: greedy (its loads are the launch) and random modes;
# the device's and the compiled kernel's limits may make them smaller (bench/sampling.py --sweep times them)
GREEDY_WG = 1024
RANDOM_WG = 256   # at most 512: top_p keeps 15 masses a work-item in local memory (sampling.cl)
# on GPUs, greedy and the unfiltered draw (no top_k, no top_p) spread a row over work-groups of at least
# SPLIT_TOKENS tokens each, at most one a compute unit, the last to finish taking the best of their picks (one
# launch still); 0: a row is one work-group's, as the filtered modes' always are (their thresholds are the
# whole row's) and a CPU's (PoCL, 2 cores: a zipf-shaped row's draw 160 -> 330 us spread, a flat one's
# 1,750 -> 900; most rows a model gives are of the first kind)
SPLIT_TOKENS = 2048
# top_p after top_k: the kept tokens a row's work-group lists in local memory for top_p's passes at most
# (more: the passes read the whole row again; the same bits either way)
KEPT_MAX = 1024


def check_sampling(temperature: Any, top_k: Any, top_p: Any) -> tuple[float, int, float]:
    """(temperature, top_k, top_p) checked: temperature >= 0 (0: greedy), top_k None or >= 1 (0 after
    this: off), top_p None or in (0, 1] (1.0 after this: off)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.integer, np.floating)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1
    ):
        raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
    if top_p is not None and (
        isinstance(top_p, bool)
        or not isinstance(top_p, (int, float, np.integer, np.floating))
        or not 0.0 < top_p <= 1.0
    ):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    return float(temperature), int(top_k or 0), float(1.0 if top_p is None else top_p)


def splits(device: Any, vocab: int, filtered: bool) -> int:
    """The work-groups a row of `vocab` logits is spread over (SPLIT_TOKENS)."""
    if filtered or SPLIT_TOKENS <= 0 or (variant_override or device.capabilities.kind) == "cpu":
        return 1
    return max(1, min(-(-vocab // SPLIT_TOKENS), device.capabilities.compute_units))


def program(device: Any, dtype: Any, greedy: bool, split: int = 1, word: str = "uint") -> tuple[Any, int]:
    """(sampling.cl's program, the work-items of a work-group) for logits of `dtype` on `device`, `split`
    work-groups a row, `word` the unit of the next input's copy (NEXT_T): one work-item on CPUs, else
    GREEDY_WG or RANDOM_WG within the device's limit and the compiled kernel's."""
    gpu = (variant_override or device.capabilities.kind) != "cpu"
    wg = kernels.work_group(device, GREEDY_WG if greedy else RANDOM_WG) if gpu else 1
    options = {"MODE": "SAMPLE_GREEDY" if greedy else "SAMPLE_RANDOM", "GREEDY_UNROLL": GREEDY_UNROLL,
               "SPLIT": split, "KEPT_MAX": KEPT_MAX, "NEXT_T": word}
    prg = kernels.program(device, "sampling.cl", dtype=dtype, WG=wg, **options)
    fits = prg.sample_tokens.max_work_group_size
    if fits < wg:  # the compiled kernel takes fewer (without reqd_work_group_size NVIDIA's H100 took 256)
        wg = kernels.work_group(device, fits)
        prg = kernels.program(device, "sampling.cl", dtype=dtype, WG=wg, **options)
    return prg, wg


_WORDS = ((4, "uint"), (2, "ushort"), (1, "uchar"))


def _next_operands(embed: Any, advance: Any, rows: int, vocab: int,
                   out: Tensor) -> tuple[dict[str, Any], str]:
    """sample_tokens' next-input arguments (next_input) for `embed` and `advance` (out's buffer where one is
    not asked for: unread), and the copy's word."""
    queue = out.queue
    args: dict[str, Any] = {"table": out.buffer, "next": out.buffer, "position": out.buffer,
                            "next_units": np.int32(0), "advance": np.int32(0), "table_off": np.int64(0),
                            "next_off": np.int64(0), "position_off": np.int64(0),
                            "position_stride": np.int64(0)}
    word = "uint"
    if embed is not None:
        if not isinstance(embed, tuple) or len(embed) != 2:
            raise TypeError(f"sample: embed must be a tuple (table, rows), got {type(embed).__name__}")
        table, nxt = embed
        if not isinstance(table, Tensor) or table.ndim != 2 or not table.is_contiguous():
            raise ShapeError(f"sample: embed's table must be a contiguous 2-D Tensor (vocab, dim), got "
                             f"{getattr(table, 'shape', type(table).__name__)}")
        if table.shape[0] < vocab:
            raise ShapeError(f"sample: embed's table holds {table.shape[0]} rows, fewer than the logits' "
                             f"vocabulary {vocab}")
        if not isinstance(nxt, Tensor) or nxt.shape != (rows, table.shape[1]) or nxt.dtype != table.dtype \
                or not nxt.is_contiguous():
            raise ShapeError(f"sample: embed's rows must be a contiguous {table.dtype} Tensor of shape "
                             f"{(rows, table.shape[1])}, got {getattr(nxt, 'dtype', None)} "
                             f"{getattr(nxt, 'shape', type(nxt).__name__)}")
        check_same_queue(table, nxt)
        if nxt.queue is not queue:
            raise ValueError("sample: embed's tensors must be on the logits' queue")
        size = table.itemsize
        row = table.shape[1] * size
        width, word = next((w, name) for w, name in _WORDS
                           if row % w == 0 and table.offset * size % w == 0 and nxt.offset * size % w == 0)
        args.update(table=table.buffer, table_off=np.int64(table.offset * size // width), next=nxt.buffer,
                    next_off=np.int64(nxt.offset * size // width), next_units=np.int32(row // width))
    if advance is not None:
        if not isinstance(advance, tuple) or len(advance) != 2:
            raise TypeError(f"sample: advance must be a tuple (position, by), got {type(advance).__name__}")
        position, by = advance
        if not isinstance(position, Tensor) or position.shape != (rows,) or position.dtype != dtypes.int32:
            raise ShapeError(f"sample: advance's position must be an int32 Tensor of shape ({rows},), got "
                             f"{getattr(position, 'dtype', None)} {getattr(position, 'shape', None)}")
        if isinstance(by, bool) or not isinstance(by, (int, np.integer)) or not 0 <= by < 2 ** 31:
            raise ValueError(f"sample: advance's step must be an int in [0, 2**31), got {by!r}")
        if position.queue is not queue:
            raise ValueError("sample: advance's position must be on the logits' queue")
        args.update(position=position.buffer, position_off=np.int64(position.offset),
                    position_stride=np.int64(position.strides[0]), advance=np.int32(by))
    return args, word


def sample(logits: Tensor, out: Tensor | None = None, *, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, uniforms: Tensor | None = None, generator: Generator | None = None,
           embed: tuple[Tensor, Tensor] | None = None, advance: tuple[Tensor, int] | None = None) -> Tensor:
    """One token id per row of logits (B, V) into out (B,) int32 (any stride; new if None).

    temperature 0 is greedy (argmax, the first on ties; -0.0 equals 0.0 and NaN counts as the largest, as in
    torch.argmax). Otherwise the logits are divided by temperature, filtered by top_k, then top_p (Hugging
    Face's warpers, in that order; ties at a threshold are all kept), and one token is drawn from the softmax
    of what is left by the Gumbel-max trick with `uniforms` (B, V) float32 in [0, 1); when None, the numbers
    rand((B, V), generator=generator) would give (netcl.ops.random; the same stream, drawn inside the kernel
    for the tokens that need them; a recorded step draws fresh ones at each replay).

    A decode step's next input, in the same launch (a launch of its own each on a GPU costs more than the
    work): embed=(table (V', D), rows (B, D)) writes rows[b] = table[token[b]] (the embedding of the token,
    its bits copied; V' >= V, both contiguous, one dtype), and advance=(position (B,) int32, s) adds s to
    position[b]."""
    temperature, top_k, top_p = check_sampling(temperature, top_k, top_p)
    if not isinstance(logits, Tensor) or logits.ndim != 2 or logits.shape[1] == 0:
        raise ShapeError(f"sample: logits must be a Tensor (batch, vocab) with vocab >= 1, got "
                         f"{getattr(logits, 'shape', type(logits).__name__)}")
    if not dtypes.is_floating(logits.dtype):
        raise DTypeError(f"sample: logits must be floating point, got {logits.dtype}")
    queue = logits.queue
    rows, vocab = logits.shape
    if logits.dtype == dtypes.float64 or logits.strides[1] != 1:
        logits = cast(logits, dtypes.float32).realize()  # float math on one contiguous copy
    if out is None:
        out = Tensor.empty(queue, (rows,), np.int32)
    elif not isinstance(out, Tensor) or out.shape != (rows,) or out.dtype != dtypes.int32:
        raise ShapeError(f"sample: out must be an int32 Tensor of shape ({rows},), got "
                         f"{getattr(out, 'dtype', None)} {getattr(out, 'shape', None)}")
    check_same_queue(logits, out)
    following, word = _next_operands(embed, advance, rows, vocab, out)   # (checked before a draw is taken)
    greedy = temperature == 0.0
    if not greedy and uniforms is not None:
        if (
            not isinstance(uniforms, Tensor)
            or uniforms.shape != (rows, vocab)
            or uniforms.dtype != dtypes.float32
        ):
            raise ShapeError(f"sample: uniforms must be float32 of shape {(rows, vocab)}, got "
                             f"{getattr(uniforms, 'dtype', None)} {getattr(uniforms, 'shape', None)}")
        check_same_queue(logits, uniforms)
        uniforms = uniforms.contiguous() if uniforms.offset == 0 else uniforms.clone()
    # the draw rand((rows, vocab), float32) would make: its Philox blocks taken from the generator here, the
    # numbers made inside the kernel where a token needs one (sampling.cl)
    gen = draw_blocks = None
    counter0 = 0
    if not greedy and uniforms is None:
        gen = generator if generator is not None else default_generator
        draw_blocks = max(-(-rows * vocab // 4), 1)
        counter0 = gen.take(draw_blocks)
    if rows == 0:
        return out
    split = splits(queue.device, vocab, not greedy and (0 < top_k < vocab or top_p < 1.0))
    prg, wg = program(queue.device, logits.dtype, greedy, split, word)
    scratch = Tensor.empty(queue, (rows, vocab), np.float32) if not greedy and top_p < 1.0 else None
    noise = uniforms if uniforms is not None else out  # (unread unless given)
    parts = Tensor.empty(queue, (rows, split, 2), np.float32) if split > 1 else noise   # (key, index) bits
    seed = gen.seed if gen is not None else 0
    kernel = prg.sample_tokens
    kernel(queue, (wg * rows * split,), (wg,), logits=logits.buffer, logits_off=np.int64(logits.offset),
           row_stride=np.int64(logits.strides[0]), vocab=np.int32(vocab), uniforms=noise.buffer,
           given=np.int32(uniforms is not None), seed_lo=np.uint32(seed & 0xFFFFFFFF),
           seed_hi=np.uint32(seed >> 32), counter0=np.uint64(counter0),
           scratch=(scratch if scratch is not None else noise).buffer, out=out.buffer,
           out_off=np.int64(out.offset), out_stride=np.int64(out.strides[0]),
           inv_temperature=np.float32(0.0 if greedy else 1.0 / temperature), top_k=np.int32(top_k),
           top_p=np.float32(top_p), arrivals=queue.arrival_counts(rows) if split > 1 else out.buffer,
           parts=parts.buffer, **following)
    if gen is not None:   # a recorded step's replay draws the stream's next numbers, as rand's would
        at = kernel.arg_index
        draw_on_replay(gen, draw_blocks, (at["seed_lo"], at["seed_hi"], at["counter0"]))
    return out
