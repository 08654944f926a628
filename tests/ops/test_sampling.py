"""netcl.ops.sample: greedy, temperature, top-k and top-p sampling on the device, against a NumPy
reference of Hugging Face's warpers given the same uniforms (the Gumbel-max draw is then exact)."""

from __future__ import annotations

import numpy as np
import pytest

from netcl import ops
from netcl.core import dtypes
from netcl.core.tensor import Tensor
from netcl.errors import ShapeError
from netcl.ops.random import Generator


def reference(logits, u, temperature, top_k, top_p):
    """The token of each row: HF's temperature, top-k, top-p (sorted, cumulative) warpers, then the
    Gumbel-max draw argmax(z - log(-log(u))) over what is kept."""
    out = []
    for z, uu in zip(logits.astype(np.float32), u.astype(np.float64)):
        if temperature == 0:
            out.append(int(np.argmax(z)))
            continue
        z = (z * np.float32(1 / temperature)).astype(np.float64)
        keep = np.ones(z.shape, bool)
        if top_k and top_k < z.size:
            keep &= z >= np.sort(z)[-top_k]
        if top_p is not None and top_p < 1:
            e = np.where(keep, np.exp(z - z.max()), 0)
            order = np.argsort(-z, kind="stable")
            before = np.cumsum(e[order]) - e[order]
            kept = np.zeros(z.shape, bool)
            kept[order] = before < top_p * e.sum()
            keep &= kept
        out.append(int(np.argmax(np.where(keep, z - np.log(-np.log(uu)), -np.inf))))
    return np.array(out)


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (0.0, None, None), (1.0, None, None), (0.7, 5, None), (1.3, None, 0.8), (0.9, 40, 0.6), (1.0, 1, None),
    (1.0, None, 0.02), (2.0, 1000, 1.0),
])
def test_sample_matches_reference(queue, rng, temperature, top_k, top_p):
    rows, vocab = 5, 301
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    u = rng.random((rows, vocab)).astype(np.float32)
    out = ops.sample(Tensor.from_host(queue, logits), temperature=temperature, top_k=top_k, top_p=top_p,
                     uniforms=Tensor.from_host(queue, u))
    np.testing.assert_array_equal(out.to_host(), reference(logits, u, temperature, top_k, top_p))


@pytest.mark.parametrize("layout", ["cpu", "gpu"])
def test_top_p_of_far_negative_logits(queue, rng, monkeypatch, layout):
    """top_p's masses are exp(z - max) with max the row's own (every z near -150 here: measured from 0
    instead, each would underflow to 0 and the cut would keep nothing)."""
    from netcl.ops import sampling

    monkeypatch.setattr(sampling, "variant_override", layout)
    logits = (rng.standard_normal((4, 301)) * 3 - 150).astype(np.float32)
    u = rng.random(logits.shape).astype(np.float32)
    out = ops.sample(Tensor.from_host(queue, logits), temperature=1.0, top_p=0.8,
                     uniforms=Tensor.from_host(queue, u))
    np.testing.assert_array_equal(out.to_host(), reference(logits, u, 1.0, None, 0.8))


def test_greedy_takes_the_first_of_equal_maxima_and_writes_strided_out(queue):
    logits = np.zeros((3, 9), np.float32)
    logits[0, [2, 7]] = 5
    logits[1, 8] = 1
    logits[2] = -1
    out = Tensor.full(queue, (3, 2), -5, np.int32)
    ops.sample(Tensor.from_host(queue, logits), out[:, 1], temperature=0)
    np.testing.assert_array_equal(out.to_host(), [[-5, 2], [-5, 8], [-5, 0]])


def test_sample_frequencies_follow_the_softmax(queue):
    """Many rows of one distribution: top_k=3 at temperature 0.5 leaves softmax(z / 0.5) over the top 3."""
    z = np.array([2.0, 1.5, 1.0, 0.9, -1.0], np.float32)
    rows = 6000
    logits = Tensor.from_host(queue, np.tile(z, (rows, 1)))
    tokens = ops.sample(logits, temperature=0.5, top_k=3, generator=Generator(1)).to_host()
    p = np.exp(z[:3] / 0.5 - (z[:3] / 0.5).max())
    p /= p.sum()
    counts = np.bincount(tokens, minlength=5) / rows
    assert counts[3:].sum() == 0
    np.testing.assert_allclose(counts[:3], p, atol=0.02)


def test_sample_with_a_generator_is_reproducible(queue, rng):
    logits = Tensor.from_host(queue, rng.standard_normal((4, 50)).astype(np.float32))
    a = ops.sample(logits, temperature=1.0, top_p=0.9, generator=Generator(7)).to_host()
    b = ops.sample(logits, temperature=1.0, top_p=0.9, generator=Generator(7)).to_host()
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("layout", ["cpu", "gpu"])
def test_drawn_inside_equals_rand_then_given(queue, rng, monkeypatch, layout):
    """Without uniforms the kernel draws the numbers rand((rows, vocab), generator=...) would (the same Philox
    blocks, taken from the generator alike): the same tokens as rand's draw given, on both layouts, for
    vocabularies whose rows start inside a block, and the generator left where rand leaves it."""
    from netcl.ops import sampling
    from netcl.ops.random import rand

    monkeypatch.setattr(sampling, "variant_override", layout)
    for rows, vocab in ((1, 1), (3, 7), (5, 301), (2, 5003)):
        logits = Tensor.from_host(queue, (rng.standard_normal((rows, vocab)) * 3).astype(np.float32))
        for temperature, top_k, top_p in ((1.0, None, None), (0.8, 5, None), (1.3, None, 0.8),
                                          (0.9, 40, 0.6)):
            drawn, given = Generator(11), Generator(11)
            drawn.take(3)   # (a counter past zero)
            given.take(3)
            for _ in range(3):   # (each call takes the next blocks)
                out = ops.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=drawn)
                u = rand(queue, (rows, vocab), np.float32, generator=given)
                want = ops.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, uniforms=u)
                np.testing.assert_array_equal(out.to_host(), want.to_host(),
                                              err_msg=f"{rows} x {vocab}, {temperature}, {top_k}, {top_p}")
            assert drawn.counter == given.counter


@pytest.mark.parametrize("layout", ["cpu", "gpu"])
def test_a_token_is_skipped_only_when_it_cannot_win(queue, monkeypatch, layout):
    """A work-item skips a token whose z + 16.75 is below the best value it holds, since u < 1 caps
    -log(-log(u)) at 16.64: a token 16.0 below the first one that wins by the largest noise (u = 1 - 2^-24)
    is still drawn, also where z's ulp is 8, and u >= 1 (given: -log(-log(1)) is +inf) is never skipped."""
    from netcl.ops import sampling

    monkeypatch.setattr(sampling, "variant_override", layout)
    top = np.float32(1 - 2 ** -24)
    logits = np.full((3, 8), -100.0, np.float32)
    u = np.full((3, 8), 0.5, np.float32)
    logits[0, 0], logits[0, 3] = 16.0, 0.0   # v 16.0 + 0.37 against 0.0 + 16.64 (the same work-item)
    u[0, 3] = top
    logits[1, 0], logits[1, 2] = 1e8, 1e8 - 8   # z's ulp 8: 1e8 + 0.37 rounds to 1e8, the other to 1e8 + 8
    u[1, 0], u[1, 2] = 0.5, top
    logits[2, 0], logits[2, 1] = 50.0, 0.0   # u = 1 wins from anywhere
    u[2, 1] = 1.0
    out = ops.sample(Tensor.from_host(queue, logits), temperature=1.0, uniforms=Tensor.from_host(queue, u))
    np.testing.assert_array_equal(out.to_host(), [3, 2, 1])
    np.testing.assert_array_equal(out.to_host()[:2], reference(logits[:2], u[:2], 1.0, None, None))


@pytest.mark.parametrize("layout", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", [np.float32, dtypes.bfloat16])
def test_greedy_on_each_layout(queue, rng, monkeypatch, layout, dtype):
    """Greedy on both layouts (a work-item a row; a work-group a row, GREEDY_UNROLL loads a work-item in
    flight): vocabularies shorter than one round of loads and longer than several, equal maxima far apart
    (the first wins, wherever the work-items' rounds put them), -0.0 and 0.0 equal, and NaN as torch.argmax
    takes it: the largest, its first occurrence."""
    from netcl.ops import sampling

    monkeypatch.setattr(sampling, "variant_override", layout)
    for vocab in (1, 7, 300, 32001):
        logits = rng.standard_normal((6, vocab)).astype(dtype)
        if vocab > 1:
            logits[1, [vocab - 1, vocab // 3]] = 50   # a tie: the smaller index wins
            logits[2] = 0.0
            logits[2, : vocab // 2] = -0.0              # -0.0 first: it ties with 0.0 and is first
            logits[3, [vocab - 1, vocab // 2]] = np.nan  # the first NaN
            logits[4] = -np.inf
            logits[4, vocab - 1] = np.inf
        logits[5] = -np.inf                             # all equal: the first
        want = [int(np.argmax(r.astype(np.float32))) for r in logits]  # NaN: NumPy as torch
        out = ops.sample(Tensor.from_host(queue, logits), temperature=0)
        np.testing.assert_array_equal(out.to_host(), want, err_msg=f"vocab {vocab}")


@pytest.mark.parametrize("layout", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, dtypes.bfloat16])
def test_greedy_reads_chunks_then_the_rest(queue, rng, monkeypatch, layout, dtype):
    """A row that starts on 16 bytes is read in 16-byte chunks and its last values one by one; one that does
    not, one by one throughout: equal maxima in a chunk and in the rest (the chunk's, first, wins), the
    maximum in the rest alone, and the same rows read through a view one element off (not on 16 bytes)."""
    from netcl.ops import sampling

    monkeypatch.setattr(sampling, "variant_override", layout)
    vocab = 16 * 37 + 5   # 8-value and 4-value chunks, then 5 values
    host = rng.standard_normal((3, vocab)).astype(dtype)
    host[0, [9, vocab - 2]] = 40          # a tie: the chunk's
    host[1, vocab - 1] = 40               # the rest's
    host[2, [vocab - 3, vocab - 1]] = 40  # a tie in the rest
    want = [9, vocab - 1, vocab - 3]
    flat = Tensor.from_host(queue, host)
    out = ops.sample(flat, temperature=0)
    np.testing.assert_array_equal(out.to_host(), want)
    padded = np.zeros((3, vocab + 1), dtype)
    padded[:, 1:] = host
    view = Tensor.from_host(queue, padded)[:, 1:]   # every row one element past a chunk's start
    np.testing.assert_array_equal(ops.sample(view, temperature=0).to_host(), want)


@pytest.mark.parametrize("layout", ["cpu", "gpu"])
@pytest.mark.parametrize("groups", [2, 5, 9])
def test_a_row_spread_over_work_groups(queue, rng, monkeypatch, layout, groups):
    """Greedy and the unfiltered draw with a row spread over work-groups (slices of a multiple of 8 tokens,
    trailing ones empty where the row is short): the same tokens as one work-group a row, equal maxima in
    two slices (the first wins), NaN in a later slice, rows starting inside a Philox block; the filtered
    modes keep one work-group a row."""
    from netcl.ops import sampling

    monkeypatch.setattr(sampling, "variant_override", layout)
    launched = []
    real = sampling.splits

    def fixed(device, vocab, filtered):
        launched.append(1 if filtered else groups)
        return 1 if filtered else groups

    for vocab in (9, 67, 301):
        logits = (rng.standard_normal((4, vocab)) * 3).astype(np.float32)
        logits[1, [vocab - 1, vocab // 3]] = 50   # a tie across slices: the first
        logits[2, [1, vocab - 2]] = np.nan         # the first NaN
        u = rng.random(logits.shape).astype(np.float32)
        t, g = Tensor.from_host(queue, logits), Tensor.from_host(queue, u)
        monkeypatch.setattr(sampling, "splits", real)
        monkeypatch.setattr(sampling, "SPLIT_TOKENS", 0)
        want = [ops.sample(t, temperature=0).to_host(), ops.sample(t, temperature=0.7, uniforms=g).to_host(),
                ops.sample(t, temperature=0.7, generator=Generator(3)).to_host()]
        np.testing.assert_array_equal(want[0], [int(np.argmax(r)) for r in logits])
        monkeypatch.setattr(sampling, "splits", fixed)
        got = [ops.sample(t, temperature=0).to_host(), ops.sample(t, temperature=0.7, uniforms=g).to_host(),
               ops.sample(t, temperature=0.7, generator=Generator(3)).to_host()]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"vocab {vocab}, {groups} groups")
        ops.sample(t, temperature=0.7, top_k=3, uniforms=g)
        assert launched[-1] == 1


@pytest.mark.parametrize("layout", ["cpu", "gpu"])
def test_top_p_after_top_k_listed_or_not(queue, rng, monkeypatch, layout):
    """top_p after top_k visits the kept tokens listed in local memory, or the whole row where more are kept
    than the list holds (ops.sampling.KEPT_MAX): the same tokens either way, ties at the k-th value too."""
    from netcl.ops import sampling

    monkeypatch.setattr(sampling, "variant_override", layout)
    logits = np.round(rng.standard_normal((8, 3001)) * 6) / 2   # many ties
    u = rng.random(logits.shape).astype(np.float32)
    t, g = Tensor.from_host(queue, logits.astype(np.float32)), Tensor.from_host(queue, u)
    runs = []
    for kept_max in (1024, 4):
        monkeypatch.setattr(sampling, "KEPT_MAX", kept_max)
        runs.append([ops.sample(t, temperature=0.9, top_k=k, top_p=p, uniforms=g).to_host()
                     for k, p in ((3, 0.8), (40, 0.9), (700, 0.95))])
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("layout", ["cpu", "gpu"])
def test_top_k_on_each_layout(queue, rng, monkeypatch, layout):
    """top_k's radix select on both layouts (a work-item a row; a work-group a row counting into one local
    histogram): k of 1, 2, half and all but one of the row; the k-th value tied many times (every tie kept);
    keys that share their high bytes and differ in the lowest (floats an ulp apart); negative and positive
    values; one value everywhere; with top_p after it."""
    from netcl.ops import sampling

    monkeypatch.setattr(sampling, "variant_override", layout)
    for vocab in (2, 301, 5000):
        logits = (rng.standard_normal((6, vocab)) * 3).astype(np.float32)
        logits[1, rng.permutation(vocab)[: max(1, vocab // 4)]] = 0.5       # the k-th value tied often
        logits[2] = np.float32(1.0) + np.arange(vocab, dtype=np.float32) % 7 * np.float32(2 ** -23)
        logits[3] = -np.abs(logits[3])                                       # all negative
        logits[4] = 2.0                                                      # one value everywhere
        logits[5, rng.permutation(vocab)[: max(1, vocab // 3)]] = -1.25
        u = rng.random(logits.shape).astype(np.float32)
        for top_k, top_p, rows in ((1, None, ...), (2, None, ...), (max(1, vocab // 2), None, ...),
                                   (vocab - 1, None, ...), (max(1, vocab // 4), 0.7, [0, 3])):
            # (top_p where no tie straddles its cut: the reference keeps ties in index order there)
            z, uu = np.ascontiguousarray(logits[rows]), np.ascontiguousarray(u[rows])
            out = ops.sample(Tensor.from_host(queue, z), temperature=1.0, top_k=top_k, top_p=top_p,
                             uniforms=Tensor.from_host(queue, uu))
            np.testing.assert_array_equal(out.to_host(), reference(z, uu, 1.0, top_k, top_p),
                                          err_msg=f"vocab {vocab}, top_k {top_k}, top_p {top_p}")
        if vocab < 7:
            continue
        # the k-th value 1 + 5 ulp (an odd key): 1 + 4 ulp, one bit lower, must not be drawn; 16 draws
        m = np.arange(vocab) % 7
        z = np.tile(np.float32(1.0) + m.astype(np.float32) * np.float32(2 ** -23), (16, 1))
        uu = rng.random(z.shape).astype(np.float32)
        top_k = int((m >= 5).sum())
        out = ops.sample(Tensor.from_host(queue, z), temperature=1.0, top_k=top_k,
                         uniforms=Tensor.from_host(queue, uu))
        np.testing.assert_array_equal(out.to_host(), reference(z, uu, 1.0, top_k, None),
                                      err_msg=f"vocab {vocab}")


def test_greedy_takes_the_work_group_its_kernel_allows(queue, rng, monkeypatch):
    """Where the kernel built for the layout's work-group takes fewer work-items (its registers: NVIDIA's H100
    allowed 256 of a greedy build for 1,024), the sampler builds it again for what it takes and the tokens
    are the same."""
    from netcl.core import backend
    from netcl.ops import sampling

    monkeypatch.setattr(sampling, "variant_override", "gpu")
    logits = rng.standard_normal((3, 5000)).astype(np.float32)
    want = logits.argmax(1)
    real = backend.Kernel.max_work_group_size

    def limited(self):
        return min(real.fget(self), 64) if self.name == "sample_tokens" else real.fget(self)

    monkeypatch.setattr(backend.Kernel, "max_work_group_size", property(limited))
    launched = []
    call = backend.Kernel.__call__

    def spy(self, queue_, global_size, local_size=None, *args, **kwargs):
        if self.name == "sample_tokens":
            launched.append(tuple(local_size))
        return call(self, queue_, global_size, local_size, *args, **kwargs)

    monkeypatch.setattr(backend.Kernel, "__call__", spy)
    out = ops.sample(Tensor.from_host(queue, logits), temperature=0)
    np.testing.assert_array_equal(out.to_host(), want)
    assert launched == [(64,)]


@pytest.mark.parametrize("dtype", [np.float64, np.float16, dtypes.bfloat16])
def test_sample_other_float_logits(queue, rng, dtype):
    logits = rng.standard_normal((2, 33)).astype(dtype)
    out = ops.sample(Tensor.from_host(queue, logits), temperature=0)
    np.testing.assert_array_equal(out.to_host(), logits.astype(np.float64).argmax(1))


def test_sample_bad_input(queue):
    logits = Tensor.zeros(queue, (2, 5))
    with pytest.raises(ValueError, match="temperature"):
        ops.sample(logits, temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        ops.sample(logits, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        ops.sample(logits, top_p=1.5)
    with pytest.raises(ShapeError, match=r"\(batch, vocab\)"):
        ops.sample(Tensor.zeros(queue, (5,)))
    with pytest.raises(ShapeError, match="out must be an int32"):
        ops.sample(logits, Tensor.zeros(queue, (2,), np.int64))
    with pytest.raises(ShapeError, match="uniforms"):
        ops.sample(logits, uniforms=Tensor.zeros(queue, (2, 4)))


@pytest.mark.parametrize("layout", ["cpu", "gpu"])
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("dtype,dim", [(np.float32, 5), (dtypes.bfloat16, 6), (np.float16, 3), (np.uint8, 7)])
def test_the_next_input_in_the_sampling_launch(queue, rng, monkeypatch, layout, groups, dtype, dim):
    """embed= and advance= (a decode step's next input): each row's token embedding (its table row's bits:
    4-, 2- and 1-byte copy words by the row's size and offsets, a table with more rows than the vocabulary,
    rows a view inside a larger tensor) and its position advanced, in the sampling launch, for greedy, the
    unfiltered draw (a row over `groups` work-groups where the layout allows) and top-k: the same tokens as
    without, and what ops.embedding and an add make of them; nothing else of `rows` or `position` touched."""
    from netcl.ops import sampling

    monkeypatch.setattr(sampling, "variant_override", layout)
    monkeypatch.setattr(sampling, "splits", lambda device, vocab, filtered: 1 if filtered else groups)
    vocab, b = 300, 3
    logits = Tensor.from_host(queue, (rng.standard_normal((b, vocab)) * 3).astype(np.float32))
    host = (rng.integers(0, 256, (vocab + 4, dim)) if dtype == np.uint8
            else rng.standard_normal((vocab + 4, dim))).astype(dtype)
    table = Tensor.from_host(queue, host)
    for mode in ({"temperature": 0}, {"temperature": 0.8}, {"temperature": 0.8, "top_k": 5}):
        kw = {**mode, "generator": Generator(7)}
        want = ops.sample(logits, **kw).to_host()
        kw["generator"] = Generator(7)
        big = Tensor.from_host(queue, np.zeros(b * dim + 3, dtype))
        rows = big[1:1 + b * dim].reshape(b, dim)   # offset 1: the copy takes smaller words
        position = Tensor.from_host(queue, np.array([4, 0, 9], np.int32))
        got = ops.sample(logits, **kw, embed=(table, rows), advance=(position, 2)).to_host()
        np.testing.assert_array_equal(got, want, err_msg=str(kw))
        expect = np.zeros(b * dim + 3, dtype)
        expect[1:1 + b * dim] = host[want].reshape(-1)
        np.testing.assert_array_equal(big.to_host().view(np.uint8), expect.view(np.uint8), err_msg=str(kw))
        np.testing.assert_array_equal(rows.to_host().view(np.uint8),
                                      ops.embedding(table, Tensor.from_host(queue, want.astype(np.int32)))
                                      .to_host().view(np.uint8))
        np.testing.assert_array_equal(position.to_host(), [6, 2, 11])


def test_the_next_input_bad_operands(queue):
    logits = Tensor.zeros(queue, (2, 5))
    table = Tensor.zeros(queue, (5, 4))
    rows = Tensor.zeros(queue, (2, 4))
    position = Tensor.zeros(queue, (2,), np.int32)
    with pytest.raises(TypeError, match="embed must be a tuple"):
        ops.sample(logits, temperature=0, embed=table)
    with pytest.raises(ShapeError, match="fewer than the logits' vocabulary 5"):
        ops.sample(logits, temperature=0, embed=(Tensor.zeros(queue, (4, 4)), rows))
    with pytest.raises(ShapeError, match="contiguous 2-D"):
        ops.sample(logits, temperature=0, embed=(Tensor.zeros(queue, (4, 5)).T, rows))
    with pytest.raises(ShapeError, match=r"shape \(2, 4\)"):
        ops.sample(logits, temperature=0, embed=(table, Tensor.zeros(queue, (2, 3))))
    with pytest.raises(ShapeError, match="float32 Tensor"):
        ops.sample(logits, temperature=0, embed=(table, Tensor.zeros(queue, (2, 4), np.float16)))
    with pytest.raises(TypeError, match="advance must be a tuple"):
        ops.sample(logits, temperature=0, advance=position)
    with pytest.raises(ShapeError, match="int32 Tensor of shape"):
        ops.sample(logits, temperature=0, advance=(Tensor.zeros(queue, (2,), np.int64), 1))
    with pytest.raises(ValueError, match="advance's step"):
        ops.sample(logits, temperature=0, advance=(position, -1))
    with pytest.raises(ValueError, match="advance's step"):
        ops.sample(logits, temperature=0, advance=(position, 1.0))
    np.testing.assert_array_equal(rows.to_host(), 0)   # nothing written by a refused call
    np.testing.assert_array_equal(position.to_host(), 0)
    g = Generator(5)   # and nothing drawn from the generator: the stream is where it was
    with pytest.raises(ValueError, match="advance's step"):
        ops.sample(logits, temperature=0.7, generator=g, advance=(position, -1))
    assert g.take(1) == Generator(5).take(1)
