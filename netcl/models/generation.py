"""Token generation for netcl.models.GPT: the prompt runs once (prefill) into per-layer KV caches, then
each new token is one decode step whose attention covers the tokens so far (kv_len, a device tensor).

The decode step reads the last tokens and the cache length from device tensors and writes the next
tokens and length back into them, so netcl.graph records it once and replays it for every further token
without Python; sampling runs on the device (netcl.ops.sample), and the host reads only the B chosen ids
per step (it must, to yield them and to stop), never a row of logits. That read does not stall the
device: the next step is enqueued before the host waits for this step's tokens (the queue runs in order,
and the step takes its input tokens from the device), so the device computes token n + 1 while the host
reads token n, yields it and enqueues step n + 2. Stopping early wastes at most that one step. The caches,
the recorded step and the sampling generator are kept on the model between calls of the same batch size
and cache capacity; a stream started while another of the same model is still going gets its own (freed
when it ends), so streams read side by side do not share caches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl import amp, ops
from netcl.core import dtypes
from netcl.core.backend import enqueue_copy
from netcl.core.memory import pinned_empty
from netcl.core.tensor import Tensor
from netcl.errors import ShapeError
from netcl.graph import Graph
from netcl.nn.module import structure_version
from netcl.nn.transformer import KVCache
from netcl.ops.random import Generator, check_seed, default_generator
from netcl.ops.sampling import check_sampling

_MIN_CAPACITY = 64


class DecodeState:
    """One batch size and cache capacity of a model's generation: the per-layer caches, the device
    tensors the decode step reads and writes (position: tokens cached per row, (B,); tokens: the last
    tokens, (B, 1)), the sampling generator and the recorded decode step with what it was recorded for."""

    def __init__(self, model: Any, batch: int, capacity: int, dtype: Any):
        c, q = model.config, model.queue
        self.batch, self.capacity, self.dtype = batch, capacity, dtype
        self.caches = [
            KVCache(q, batch, c.n_kv_heads, capacity, c.head_dim, dtype) for _ in range(c.n_layers)
        ]
        self.position = Tensor.zeros(q, (batch,), np.int32)  # per row: ragged prompts differ
        self.tokens = Tensor.zeros(q, (batch, 1), np.int32)
        # the sampled tokens' embeddings (B, dim), written by the sampling launch (ops.sample's embed=) for
        # the next step, which then launches no lookup of its own (None: the table cannot be read so);
        # `embedded_ready`: they are the embeddings of `tokens`
        table = model.tok_embeddings.weight.value
        self.embedded = Tensor.empty(q, (batch, c.dim), table.dtype) \
            if table.is_contiguous() and table.shape[0] >= c.vocab_size else None
        self.embedded_ready = False
        self.generator = Generator(0)
        # the host's copies of the sampled tokens: two pinned arrays, one being read while the next step's
        # copy lands in the other (a copy into pageable memory is staged by the driver: on NVIDIA's OpenCL
        # the queue idled ~0.13 ms a token behind it)
        self.landing = [pinned_empty(q, (batch,), np.int32) for _ in range(2)]
        self.graph: Graph | None = None
        self.graph_key: tuple | None = None
        self.busy = False  # a generation stream is using it (another one then gets a state of its own)

    def run(self, model: Any, ids: Tensor, sampling: tuple[float, int, float],
            last: Tensor | None = None) -> None:
        """Append ids (B, S) to the caches at `position`, sample the next tokens from the last position's
        logits (row b's position last[b] where `last` (B,) int32 is given: right-padded prompts) into
        `tokens`, and advance `position` by S (all on the device). The sampling launch also writes the
        tokens' embeddings and advances the position (ops.sample's embed= and advance=: two launches a step
        fewer); ids that are `tokens` then start from those embeddings."""
        b, s = ids.shape
        embedded = None
        if ids is self.tokens and self.embedded_ready:
            embedded = self.embedded.reshape(b, 1, self.embedded.shape[1])
        h = model.hidden(ids, caches=self.caches, position=self.position, embedded=embedded)
        if last is not None:  # rows of the flattened (B * S, dim) hidden states: b * S + last[b]
            rows = ops.add(ops.mul(ops.arange(model.queue, b, dtype=np.int32), s), last).reshape(b, 1)
            h = ag.embedding(ag.reshape(h, (b * s, h.shape[-1])), rows.realize())
        elif s > 1:
            h = ag.getitem(h, (slice(None), slice(s - 1, s)))
        logits = model.logits(h).value
        temperature, top_k, top_p = sampling
        # the position advanced after every launch that reads it (the whole-layer decode reads no kv_len:
        # there it was an add before the step and a copy after it), in the sampling launch
        embed = None if self.embedded is None else (model.tok_embeddings.weight.value, self.embedded)
        ops.sample(logits.reshape(b, logits.shape[-1]), self.tokens.reshape(b), temperature=temperature,
                   top_k=top_k or None, top_p=top_p, generator=self.generator, embed=embed,
                   advance=(self.position, s))
        self.embedded_ready = embed is not None

    def close(self) -> None:
        if self.graph is not None:
            self.graph.close()
            self.graph = None


def _flat(model: Any) -> tuple[list[Any], list[Any]]:
    """(modules, parameters) of `model` as flat lists, kept on it while no module's parameters or children
    change (nn.module.structure_version): the decode loop reads both every token, and walked a model's modules
    twice a token (eval, then train) and its parameters once (a 2-layer Llama: 86,801 -> 12,101 Python calls
    for 100 tokens; TinyLlama has 11x the modules)."""
    version = structure_version()
    cached = model.__dict__.get("_generation_flat")
    if cached is None or cached[0] != version:
        cached = (version, list(model.modules()), model.parameters())
        object.__setattr__(model, "_generation_flat", cached)
    return cached[1], cached[2]


@contextlib.contextmanager
def _inference(model: Any) -> Iterator[None]:
    """Eval mode (no dropout) and no graph recording; each module's own mode restored afterwards (between
    yields too)."""
    training = [m for m in _flat(model)[0] if m.training]
    for m in training:
        object.__setattr__(m, "training", False)
    try:
        with ag.no_grad():
            yield
    finally:
        for m in training:
            object.__setattr__(m, "training", True)


def _prompt(model: Any, ids: Any) -> tuple[np.ndarray, bool, np.ndarray | None]:
    """(prompt (B, S) int32, whether it was 1-D, the rows' lengths where they differ) of ids: a list of
    ints, an array or a Tensor, or a list of prompts of any lengths (right-padded here with their last id)."""
    lengths = None
    if isinstance(ids, (list, tuple)) and ids and all(isinstance(r, (list, tuple, np.ndarray)) for r in ids):
        rows = [np.asarray(r) for r in ids]
        if any(r.ndim != 1 or r.size == 0 for r in rows):
            raise ShapeError(f"generate: each prompt of a batch must be a non-empty list of ids, got shapes "
                             f"{[r.shape for r in rows]}")
        sizes = [r.size for r in rows]
        if len(set(sizes)) > 1:
            lengths = np.asarray(sizes, np.int32)
            ids = [np.concatenate([r, np.full(max(sizes) - r.size, r[-1], r.dtype)]) for r in rows]
    arr = ids.to_host() if isinstance(ids, Tensor) else np.asarray(ids)
    given = arr.shape
    if arr.dtype.kind not in "iu" and arr.size:
        raise TypeError(f"generate: ids must be integer token ids, got {arr.dtype}")
    single = arr.ndim == 1
    if single:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[1] == 0 or arr.shape[0] == 0:
        raise ShapeError(f"generate: ids must be a non-empty list of ids, a (batch, positions) array or a "
                         f"list of prompts, got shape {given}")
    vocab = model.config.vocab_size
    if arr.min() < 0 or arr.max() >= vocab:
        raise ShapeError(
            f"generate: token ids must lie in [0, {vocab}), the "
            f"prompt holds ids from {arr.min()} to {arr.max()}"
        )
    return arr.astype(np.int32), single, lengths


# Hugging Face's generate() arguments a user is likely to pass, and what netcl calls them
_OTHER_NAMES = {
    "max_length": "max_new_tokens= counts the new tokens only (transformers' max_length counts the prompt "
                  "too: max_length - len(prompt))",
    "do_sample": "temperature=0 is greedy decoding (do_sample=False); a temperature above 0 samples",
    "eos_token_id": "stop_tokens= takes the ids that end generation (yielded, then the row stops)",
    "input_ids": "pass the prompt's ids as the first argument",
    "attention_mask": "prompts of different lengths go as a list of lists (no padding, no mask needed)",
    "pad_token_id": "no padding is needed: prompts of different lengths go as a list of lists",
    "num_beams": "netcl decodes greedily (temperature=0) or by sampling; there is no beam search",
    "generator": "seed= makes sampling reproducible",
}


def refuse_other_arguments(other: dict[str, Any]) -> None:
    """TypeError for keyword arguments generate() does not take, naming netcl's spelling of Hugging Face's."""
    hints = [f"{name}: {_OTHER_NAMES[name]}" for name in other if name in _OTHER_NAMES]
    raise TypeError(
        f"generate() got unexpected keyword arguments {sorted(other)}; it takes ids, max_new_tokens, "
        f"temperature, top_k, top_p, seed, stop_tokens, use_graph" + "".join("; " + h for h in hints))


def generate(model: Any, ids: Any, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, stop_tokens: Any = (),
             use_graph: bool = True) -> Iterator[Any]:
    """See GPT.generate. Arguments are checked here, before the first token is asked for."""
    prompt, single, lengths = _prompt(model, ids)
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, (int, np.integer))
        or max_new_tokens < 0
    ):
        raise ValueError(f"generate: max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    sampling = check_sampling(temperature, top_k, top_p)
    if seed is not None:
        seed = check_seed(seed, "generate")
    stops = [] if stop_tokens is None else [stop_tokens] if isinstance(stop_tokens, (int, np.integer)) \
        else list(stop_tokens) if isinstance(stop_tokens, (list, tuple, set, frozenset, range, np.ndarray)) \
        else [stop_tokens]
    if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in stops):
        raise TypeError(f"generate: stop_tokens must be token ids (ints), got {stop_tokens!r}")
    batch, length = prompt.shape
    limit = model.config.max_seq_len
    if length + max_new_tokens > limit:
        raise ShapeError(
            f"generate: a prompt of {length} tokens plus max_new_tokens={max_new_tokens} exceeds the "
            f"model's max_seq_len {limit}; shorten the prompt (keep its last tokens) or ask for fewer"
        )
    if seed is None:
        # reproducible after netcl.ops.random.manual_seed: the seed is drawn from the default generator
        seed = (default_generator.seed * 0x9E3779B97F4A7C15 + default_generator.take(1)) & 0xFFFFFFFFFFFFFFFF
    return _tokens(
        model,
        prompt,
        lengths,
        single,
        int(max_new_tokens),
        sampling,
        int(seed),
        set(int(t) for t in stops),
        bool(use_graph),
    )


def _state(model: Any, batch: int, needed: int) -> DecodeState:
    capacity = min(model.config.max_seq_len, max(_MIN_CAPACITY, 1 << (needed - 1).bit_length()))
    # the keys and values the layers write: the autocast dtype inside autocast (the projections' outputs),
    # else the model's
    dtype = np.dtype(amp.autocast_dtype() or dtypes.normalize(model.config.dtype))
    state = getattr(model, "_decoder", None)
    if state is not None and state.busy:  # another stream of this model is still going: one of its own
        return DecodeState(model, batch, capacity, dtype)
    if state is None or state.batch != batch or state.capacity != capacity or state.dtype != dtype:
        if state is not None:
            state.close()
        state = DecodeState(model, batch, capacity, dtype)
        model._decoder = state
    return state


def _tokens(model: Any, prompt: np.ndarray, lengths: np.ndarray | None, single: bool, max_new_tokens: int,
            sampling: tuple, seed: int, stops: set[int], use_graph: bool) -> Iterator[Any]:
    if max_new_tokens == 0:
        return
    batch, length = prompt.shape
    state = _state(model, batch, length + max_new_tokens)
    state.busy = True
    try:
        yield from _stream(model, state, prompt, lengths, single, max_new_tokens, sampling, seed, stops,
                           use_graph)
    finally:
        state.busy = False
        if state is not model._decoder:  # a second stream's own state: not kept
            state.close()


def _stream(model: Any, state: DecodeState, prompt: np.ndarray, lengths: np.ndarray | None, single: bool,
            max_new_tokens: int, sampling: tuple, seed: int, stops: set[int],
            use_graph: bool) -> Iterator[Any]:
    batch = prompt.shape[0]
    state.generator.manual_seed(seed)
    done = np.zeros(batch, bool)
    with _inference(model):
        state.position.fill_(0)
        if lengths is None:
            state.run(model, Tensor.from_host(model.queue, prompt), sampling)
        else:
            # right padding: a row's real tokens attend only to earlier ones (causal), its first new token
            # comes from its own last position, and its decode steps write from its own length on, over
            # the padding's keys and values, which kv_len (position + 1 per row) keeps out of every step
            state.run(model, Tensor.from_host(model.queue, prompt), sampling,
                      last=Tensor.from_host(model.queue, lengths - 1))
            state.position.copy_from_host(lengths)
        pending = _read_tokens(state)
    for step in range(max_new_tokens):
        ahead = None
        if step + 1 < max_new_tokens:  # enqueue the next step before waiting for this one's tokens
            with _inference(model):
                _decode_step(model, state, sampling, use_graph)
                ahead = _read_tokens(state)
        event, tokens = pending
        event.wait()
        out = np.where(done, -1, tokens).astype(np.int32)
        done |= np.isin(tokens, list(stops)) if stops else False
        last = done.all() or ahead is None
        if last:  # what a kernel's checks recorded (positions, ids): the host checked both beforehand
            model.queue.raise_device_errors()
        yield int(out[0]) if single else out
        if last:
            return
        pending = ahead


def _read_tokens(state: DecodeState) -> tuple[Any, np.ndarray]:
    """(event, host array) of a copy of the sampled tokens enqueued without waiting: in the in-order queue
    it reads them before the next step, enqueued behind it, overwrites them. The host array is the pinned
    one not read last (the caller is done with a step's tokens before it asks for the second next)."""
    state.landing.reverse()
    host = state.landing[0]
    t = state.tokens
    event = enqueue_copy(t.queue, host, t.buffer, src_offset=t.offset * t.itemsize, is_blocking=False)
    return event, host


def _decode_step(model: Any, state: DecodeState, sampling: tuple, use_graph: bool) -> None:
    if not use_graph:
        state.run(model, state.tokens, sampling)
        return
    # the recorded step reads the parameters' buffers: re-record when a parameter got a new Tensor (held
    # here, not its id(), which a new Tensor may reuse once the old one is freed)
    values = tuple(p.value for p in _flat(model)[1])
    key = (sampling, values)
    old = state.graph_key
    if state.graph is not None and old is not None and old[0] == sampling and len(old[1]) == len(values) \
            and all(a is b for a, b in zip(old[1], values)):
        state.graph.replay()
        return
    state.close()
    graph = Graph()
    with graph.capture():
        state.run(model, state.tokens, sampling)
    state.graph, state.graph_key = graph, key
