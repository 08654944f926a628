"""GPT generation: cached decoding equals a full forward, the recorded decode step equals the eager one,
sampling options, stop tokens, batches, reuse of the recorded step, and argument errors."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import amp, ops
from netcl.autograd import Parameter
from netcl.core import dtypes
from netcl.core.tensor import Tensor
from netcl.errors import ShapeError
from netcl.models import GPT, GPTConfig
from netcl.nn import KVCache
from netcl.ops.random import Generator, manual_seed

LLAMA = dict(arch="llama", vocab_size=41, dim=16, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=40)
GPT2 = dict(arch="gpt2", vocab_size=37, dim=12, n_layers=2, n_heads=3, max_seq_len=40)


def make(queue, kind, seed=0, dtype="float32", **config):
    base = {**(LLAMA if kind == "llama" else GPT2), **config}
    model = GPT(queue, GPTConfig(**base, dtype=dtype), generator=Generator(seed))
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        if "norm" not in name:  # sharper distributions than the 0.02 init: tokens depend on the weights
            p.value.copy_from_host(0.3 * rng.standard_normal(p.shape))
    return model


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_cached_decoding_equals_the_full_forward(queue, kind):
    model = make(queue, kind, dtype="float64")
    c = model.config
    ids = np.random.default_rng(1).integers(0, c.vocab_size, (2, 9)).astype(np.int32)
    full = model(ids).value.to_host()
    caches = [KVCache(queue, 2, c.n_kv_heads, 16, c.head_dim, "float64") for _ in range(c.n_layers)]
    position = Tensor.zeros(queue, (1,), np.int32)
    got = []
    for lo, hi in ((0, 5), (5, 6), (6, 7), (7, 9)):
        kv_len = ops.add(position, hi - lo).realize()
        h = model.hidden(
            Tensor.from_host(queue, ids[:, lo:hi]), caches=caches, position=position, kv_len=kv_len
        )
        got.append(model.logits(h).value.to_host())
        position.copy_(kv_len)
    np.testing.assert_allclose(np.concatenate(got, 1), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_greedy_generation_follows_the_full_forward(queue, kind):
    model = make(queue, kind)
    prompt = [3, 1, 4, 1, 5]
    tokens = list(model.generate(prompt, 8, temperature=0))
    assert len(tokens) == 8 and all(isinstance(t, int) for t in tokens)
    seq = list(prompt)
    for t in tokens:
        assert t == int(model(np.array([seq], np.int32)).value.to_host()[0, -1].argmax())
        seq.append(t)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize(
    "options",
    [
        dict(temperature=0),
        dict(temperature=0.9, top_k=7),
        dict(temperature=1.2, top_p=0.8),
        dict(temperature=0.7, top_k=12, top_p=0.9),
    ],
)
def test_recorded_decode_step_equals_the_eager_one(queue, kind, options):
    model = make(queue, kind)
    prompt = np.array([[2, 7, 1], [8, 2, 8]], np.int32)
    eager = np.array(list(model.generate(prompt, 12, seed=5, use_graph=False, **options)))
    recorded = np.array(list(model.generate(prompt, 12, seed=5, **options)))
    assert model._decoder.graph is not None
    np.testing.assert_array_equal(recorded, eager)
    again = np.array(list(model.generate(prompt, 12, seed=5, **options)))  # replays only: the same draws
    np.testing.assert_array_equal(again, eager)
    if options.get("temperature"):
        other = np.array(list(model.generate(prompt, 12, seed=6, **options)))
        assert not np.array_equal(other, eager)


def test_generation_under_autocast_caches_half_keys_and_values(queue):
    """Inside autocast the projections write half keys and values: the caches take the autocast dtype (they
    were float32 and the first write refused the bfloat16 keys), the recorded step equals the eager one, and
    a float32 call after it gets float32 caches and its own tokens back."""
    model = make(queue, "llama")
    prompt = np.array([[2, 7, 1], [8, 2, 8]], np.int32)
    plain = np.array(list(model.generate(prompt, 8, seed=3)))
    assert model._decoder.caches[0].k.dtype == np.float32
    with amp.autocast("bfloat16"):
        eager = np.array(list(model.generate(prompt, 8, seed=3, use_graph=False)))
        assert model._decoder.caches[0].k.dtype == dtypes.bfloat16
        recorded = np.array(list(model.generate(prompt, 8, seed=3)))
    np.testing.assert_array_equal(recorded, eager)
    np.testing.assert_array_equal(np.array(list(model.generate(prompt, 8, seed=3))), plain)
    assert model._decoder.caches[0].k.dtype == np.float32


def test_the_recorded_step_is_reused_and_follows_new_weights(queue):
    model = make(queue, "llama")
    first = list(model.generate([1, 2, 3], 6, temperature=0))
    graph = model._decoder.graph
    assert list(model.generate([1, 2, 3], 6, temperature=0)) == first and model._decoder.graph is graph
    other = make(queue, "llama", seed=9)
    model.load_state_dict(other.state_dict())  # in place: the recorded step reads the new values
    assert list(model.generate([1, 2, 3], 6, temperature=0)) == list(
        other.generate([1, 2, 3], 6, temperature=0)
    )
    assert model._decoder.graph is graph
    for name, p in model.named_parameters():  # new Tensors (the old ones freed): recorded again
        p.value = Tensor.from_host(queue, other.state_dict()[name].to_host() * 0.5)
    halved = make(queue, "llama", seed=9)
    halved.load_state_dict({k: v.to_host() * 0.5 for k, v in other.state_dict().items()})
    assert list(model.generate([1, 2, 3], 6, temperature=0)) == list(
        halved.generate([1, 2, 3], 6, temperature=0)
    )
    assert model._decoder.graph is not graph


def test_a_parameter_replaced_by_a_new_one_is_followed(queue):
    """A new Parameter object assigned to a layer between two generations (not a new value of the old one):
    the decode loop's flat lists of modules and parameters, kept while no module's parameters or children
    change (nn.module.structure_version), are made again and the step recorded again."""
    model = make(queue, "llama")
    first = list(model.generate([1, 2, 3], 6, temperature=0))
    rng = np.random.default_rng(5)
    new = {"layers.1.attn.o_proj": (0.6 * rng.standard_normal((16, 16))).astype(np.float32),
           "layers.0.mlp.w2": (0.6 * rng.standard_normal((16, 64))).astype(np.float32)}
    reference = make(queue, "llama")
    modules, ref_modules = dict(model.named_modules()), dict(reference.named_modules())
    for name, w in new.items():
        ref_modules[name].weight.value.copy_from_host(w)                 # in place
        modules[name].weight = Parameter(Tensor.from_host(queue, w))    # a new Parameter
    expected = list(reference.generate([1, 2, 3], 6, temperature=0))
    assert expected != first
    assert list(model.generate([1, 2, 3], 6, temperature=0)) == expected


def test_each_module_keeps_its_own_mode_after_generating(queue):
    """Generation runs every module in eval mode and gives each back its own mode: a block the user put in
    eval mode inside a training model stays in eval mode (model.train() after would have undone it)."""
    model = make(queue, "llama")
    model.train()
    model.layers[0].eval()
    before = {name: m.training for name, m in model.named_modules()}
    assert not before["layers.0.mlp"] and before["layers.1.mlp"]
    list(model.generate([1, 2], 3, temperature=0))
    assert {name: m.training for name, m in model.named_modules()} == before


def test_seed_none_follows_manual_seed(queue):
    model = make(queue, "gpt2")
    manual_seed(11)
    a = list(model.generate([4, 4], 10, temperature=1.5))
    manual_seed(11)
    b = list(model.generate([4, 4], 10, temperature=1.5))
    assert a == b


def test_stop_tokens_and_batches(queue):
    model = make(queue, "llama")
    free = list(model.generate([5, 6], 10, temperature=0))
    stop = free[3]
    cut = list(model.generate([5, 6], 10, temperature=0, stop_tokens=[stop]))
    assert cut == free[: free.index(stop) + 1]
    batch = np.array([[5, 6], [6, 5]], np.int32)
    rows = np.array(list(model.generate(batch, 10, temperature=0, stop_tokens=[stop])))
    solo = [list(model.generate(list(r), 10, temperature=0)) for r in batch]
    for r in range(2):
        col = rows[:, r]
        n = solo[r].index(stop) + 1 if stop in solo[r] else len(col)
        np.testing.assert_array_equal(col[:n], solo[r][:n])
        assert (col[n:] == -1).all()
    assert list(model.generate([5, 6], 0)) == []


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("use_graph", [True, False])
def test_ragged_prompts_decode_as_each_prompt_alone(queue, kind, use_graph):
    """Prompts of different lengths in one batch (right-padded, per-row positions and key counts): each
    row's greedy tokens are the tokens of its prompt generated alone."""
    model = make(queue, kind)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in (3, 9, 1, 6)]
    rows = np.array(list(model.generate(prompts, 8, temperature=0, use_graph=use_graph)))
    assert rows.shape == (8, 4)
    for r, prompt in enumerate(prompts):
        assert rows[:, r].tolist() == list(model.generate(prompt, 8, temperature=0)), r
    with pytest.raises(ShapeError, match="each prompt of a batch must be a non-empty list"):
        model.generate([[1, 2], []], 4)


def test_a_generator_left_early_leaves_the_next_call_right(queue):
    """The step after the last token read is already enqueued when a caller stops iterating."""
    model = make(queue, "gpt2")
    full = list(model.generate([3, 1, 4], 9, temperature=0))
    early = model.generate([3, 1, 4], 9, temperature=0)
    assert [next(early), next(early)] == full[:2]
    early.close()
    assert list(model.generate([3, 1, 4], 9, temperature=0)) == full
    assert list(model.generate([3, 1, 4], 9, temperature=0, use_graph=False)) == full


def test_two_streams_of_one_model_read_side_by_side(queue):
    """A stream started while another of the same model is going gets caches of its own (they shared the
    model's: the second prompt's prefill overwrote the first's cache and position: both came out wrong)."""
    model = make(queue, "llama")
    a = list(model.generate([3, 1, 4], 9, temperature=0))
    b = list(model.generate([[5, 9, 2, 6], [7]], 9, temperature=0.8, seed=3))
    pairs = list(zip(model.generate([3, 1, 4], 9, temperature=0),
                     model.generate([[5, 9, 2, 6], [7]], 9, temperature=0.8, seed=3)))
    assert [x for x, _ in pairs] == a
    np.testing.assert_array_equal([y for _, y in pairs], b)
    kept = model._decoder
    assert kept is not None and not kept.busy  # the first stream's state stays the model's, the other's freed
    assert list(model.generate([3, 1, 4], 9, temperature=0)) == a and model._decoder is kept


def test_seeds_outside_64_bits_are_refused(queue):
    """2**64 wrapped onto seed 0's stream; torch.manual_seed's range: [-2**63, 2**64), a negative seed as its
    two's complement."""
    model = make(queue, "gpt2")
    for seed in (1 << 64, 2 ** 70, -(1 << 63) - 1):
        with pytest.raises(ValueError, match=r"seed must lie in \[-2\*\*63, 2\*\*64\)"):
            model.generate([1, 2], 4, seed=seed)
        with pytest.raises(ValueError, match="seed must lie"):
            manual_seed(seed)
    with pytest.raises(TypeError, match="seed must be an int"):
        model.generate([1, 2], 4, seed=True)
    assert list(model.generate([1, 2], 6, seed=-1)) == list(model.generate([1, 2], 6, seed=(1 << 64) - 1))
    assert Generator(-5).seed == (1 << 64) - 5


@pytest.mark.parametrize("dtype", ["float64", "bfloat16", "float16"])
def test_a_model_converted_by_to_generates_in_its_new_dtype(queue, dtype):
    """Module.to(dtype) on a GPT: the config's dtype (the caches') and RoPE's tables follow, the stacked
    projections are stacked again (generate failed: 'rope: out must be bfloat16', float64's forward too)."""
    model = make(queue, "llama").stack_projections()
    assert model.to(dtype) is model and model.config.dtype == dtype
    assert all(p.dtype == np.dtype(dtypes.normalize(dtype)) for p in model.parameters())
    ref = make(queue, "llama", dtype=dtype)
    ref.load_state_dict(model.state_dict())  # the same (converted) weights in a model built in the dtype
    ref.stack_projections()
    ids = np.array([[3, 1, 4, 1, 5]], np.int32)
    np.testing.assert_array_equal(model(ids).value.to_host(), ref(ids).value.to_host())
    greedy = list(ref.generate([3, 1, 4], 8, temperature=0))
    assert list(model.generate([3, 1, 4], 8, temperature=0)) == greedy
    assert model.layers[0].attn._qkv.intact() and model.layers[0].mlp._gate_up.intact()


@pytest.mark.parametrize("int8", [False, True])
def test_a_model_moved_to_another_queue_generates_there(queue, device, int8):
    """Module.to(queue) on a GPT: its queue, RoPE's tables, an int8 layer's scales and the stacked
    projections follow (it kept the old queue, and forward met tensors of two queues)."""
    model = make(queue, "llama").stack_projections()
    if int8:
        model.quantize_int8()
    ids = np.array([[3, 1, 4, 1, 5]], np.int32)
    want, tokens = model(ids).value.to_host(), list(model.generate([3, 1, 4], 8, temperature=0))
    q2 = device.new_queue()
    model.to(q2)
    assert model.queue is q2 and model.layers[0].attn.rope.cos.queue is q2
    stack = model.layers[0].attn._qkv
    assert stack.intact() and stack.weight.queue is q2
    if int8:
        assert stack.scale.queue is q2 and model.lm_head.weight_scale.queue is q2
    got = model(ids).value
    assert got.queue is q2
    np.testing.assert_array_equal(got.to_host(), want)
    assert list(model.generate([3, 1, 4], 8, temperature=0)) == tokens


def test_training_mode_is_restored_and_dropout_off_while_generating(queue):
    model = GPT(queue, GPTConfig(**LLAMA, dropout=0.5, attn_dropout=0.5))
    model.train()
    a = list(model.generate([1, 2], 5, temperature=0))
    assert model.training
    assert a == list(model.generate([1, 2], 5, temperature=0, use_graph=False))


def test_generate_errors(queue):
    model = make(queue, "gpt2")
    with pytest.raises(ShapeError, match="exceeds the model's max_seq_len 40"):
        model.generate(list(range(30)), 11)
    with pytest.raises(ShapeError, match=r"ids must lie in \[0, 37\)"):
        model.generate([1, 40], 3)
    with pytest.raises(ShapeError, match="non-empty"):
        model.generate([], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate([1], -1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate([1], 3, temperature=-0.5)
    with pytest.raises(ValueError, match="top_p"):
        model.generate([1], 3, top_p=0.0)
    with pytest.raises(TypeError, match="stop_tokens"):
        model.generate([1], 3, stop_tokens=["eos"])
    for bad in ("eos", 1.5, {"eos": 2}):
        with pytest.raises(TypeError, match="stop_tokens must be token ids"):
            model.generate([1], 3, stop_tokens=bad)
    assert list(model.generate([1], 3, stop_tokens=None, seed=0)) == list(model.generate([1], 3, seed=0))
    with pytest.raises(TypeError, match=r"max_length: max_new_tokens= counts the new tokens only.*"
                                        r"do_sample: temperature=0 is greedy"):
        model.generate([1, 2], max_new_tokens=3, max_length=8, do_sample=False)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['bogus'\]; it takes ids"):
        model.generate([1, 2], 3, bogus=1)
    with pytest.raises(TypeError, match="seed"):
        model.generate([1], 3, seed=1.5)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_stacked_llama_decodes_with_its_norms_in_the_projections(queue, batch):
    """from_pretrained's layout (q/k/v and gate/up stacked): each RMSNorm of a decode step runs in the
    prologue of the GEMV after it (ops.rms_norm_linear), 6 launches a layer (q/k/v, rope + cache, attention,
    o_proj, gate/up, w2; 5 where the GPU decode kernel rotates and caches the new rows itself,
    ops.rope_cache_decode_attention) and 3 a step (kv_len, lm_head with the final norm, and the sampling
    launch, which also writes the next step's embeddings and advances the position: no lookup of its own, no
    add, no copy), and the greedy tokens follow the float64 NumPy reference's full forward on the same
    weights."""
    from tests.models import reference_gpt as ref

    model = make(queue, "llama").stack_projections()
    c = model.config
    state = {k: v.to_host().astype(np.float64) for k, v in model.state_dict().items()}
    prompt = np.random.default_rng(batch).integers(0, c.vocab_size, (batch, 5)).astype(np.int32)
    tokens = np.array(list(model.generate(prompt, 6, temperature=0))).reshape(6, batch)
    names = [op[1].name for op in model._decoder.graph.ops if op[0] == "k"]
    gpu_decode = "attention_decode_gpu" in names   # the device's own choice (NVIDIA: yes; PoCL: no)
    assert ("rope_qkv_cache" in names) != gpu_decode
    assert model._decoder.graph.launches == (5 if gpu_decode else 6) * c.n_layers + 3
    assert not [n for n in names if "gather" in n or "embedding" in n], names
    assert not [op for op in model._decoder.graph.ops if op[0] != "k"]
    seq = prompt
    for t in tokens:
        np.testing.assert_array_equal(t, ref.gpt_logits(seq, state, c)[:, -1].argmax(-1))
        seq = np.concatenate([seq, t[:, None]], 1)


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("dtype,pairing,batch", [("bfloat16", "half", 1), ("float32", "interleaved", 3)])
def test_the_decode_attention_rotates_and_caches_the_new_rows(queue, monkeypatch, dtype, pairing, batch):
    """With the GPU attention kernels (forced here), a stacked Llama's decode step runs rope_qkv_cache's work
    inside the decode attention (ops.rope_cache_decode_attention): one launch a layer fewer in the recorded
    step, and the same greedy tokens and caches bit for bit as the two launches (ragged prompts: positions
    differ per row; keys split over several work-groups; the prompt itself takes the two launches)."""
    from netcl.nn import transformer
    from netcl.ops import attention as attn

    monkeypatch.setattr(attn, "variant_override", "gpu")
    monkeypatch.setattr(attn, "DECODE_GROUPS_PER_CU", 1000)
    monkeypatch.setattr(attn, "DECODE_TILE_KEYS", (8,))   # a split of 8 keys a work-group
    # the attention its own launch, counted below (GPUs would join it to the layer's or the layers' launch)
    monkeypatch.setattr(transformer, "DECODE_ATTENTION_CHAIN", False)
    rng = np.random.default_rng(batch)
    prompts = [list(rng.integers(0, LLAMA["vocab_size"], n)) for n in (17, 9, 20)[:batch]]
    runs = []
    for fused in (True, False):
        monkeypatch.setattr(attn, "DECODE_ROPE_CACHE", fused)
        model = make(queue, "llama", dtype=dtype, dim=32, rope_pairing=pairing).stack_projections()
        tokens = np.array(list(model.generate(prompts if batch > 1 else prompts[0], 12, temperature=0)))
        state = model._decoder
        caches = [(c.k.to_host(), c.v.to_host()) for c in state.caches]
        runs.append((tokens, caches, state.graph.launches))
    (tokens, caches, launches), (want_tokens, want_caches, want_launches) = runs
    assert launches == want_launches - LLAMA["n_layers"]
    np.testing.assert_array_equal(tokens, want_tokens)
    for (k, v), (wk, wv) in zip(caches, want_caches, strict=True):
        np.testing.assert_array_equal(k.view(np.uint8), wk.view(np.uint8))
        np.testing.assert_array_equal(v.view(np.uint8), wv.view(np.uint8))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_mlp_half_of_a_decode_layer_is_one_launch(queue, monkeypatch, dtype, batch):
    """Where the gemv kernel normalizes rows in its prologue (the device's tile says GEMV_NORM: GPUs; forced
    here on CPUs, whose tile keeps the norm a launch of its own for speed), a one-row decode step makes each
    layer's o-projection + residual, RMSNorm + gate/up + SwiGLU and down + residual one launch
    (ops.gemm.gemv_chain), and the chain makes the next layer's RMSNorm + q/k/v product too: 3 launches a
    layer fewer (2 for the last), the same greedy tokens and caches bit for bit. Three rows (other GEMV tiles)
    and drivers that miscompile the prologue keep the separate launches."""
    from netcl.nn import transformer
    from netcl.ops.gemm import variants
    from netcl.ops.gemm.launch import gemv_rms_fits

    if queue.device.capabilities.kind == "cpu":
        for name in ("float16", "bfloat16"):
            monkeypatch.setitem(variants.CLASS_DEFAULTS["cpu"]["gemv"][name], "GEMV_NORM", 1)
    # the attention its own launch, counted below (GPUs would join it to the layer's or the layers' launch)
    monkeypatch.setattr(transformer, "DECODE_ATTENTION_CHAIN", False)
    rng = np.random.default_rng(batch)
    prompts = [list(rng.integers(0, LLAMA["vocab_size"], n)) for n in (7, 9, 5)[:batch]]
    runs = []
    for chained in (True, False):
        monkeypatch.setattr(transformer, "DECODE_CHAIN", chained)
        model = make(queue, "llama", dtype=dtype, dim=32).stack_projections()
        tokens = np.array(list(model.generate(prompts if batch > 1 else prompts[0], 8, temperature=0)))
        state = model._decoder
        names = [op[1].name for op in state.graph.ops if op[0] == "k"]
        runs.append((tokens, [(c.k.to_host(), c.v.to_host()) for c in state.caches], state.graph.launches,
                     names.count("gemv_chain")))
    (tokens, caches, launches, chains), (want_tokens, want_caches, want_launches, _) = runs
    hidden = model.layers[0].mlp.w2.in_features
    fits = batch == 1 and gemv_rms_fits(queue.device, dtypes.normalize(dtype), 1, hidden, 32, glu=True)
    qkv = model.layers[0].attn._qkv.weight.shape[0]
    qkv_fits = fits and gemv_rms_fits(queue.device, dtypes.normalize(dtype), 1, qkv, 32)
    layers = LLAMA["n_layers"]
    assert chains == (layers if fits else 0)
    # 2 launches a layer fewer, and the next layer's q/k/v product in the chain before it: 1 more
    assert launches == want_launches - ((2 * layers + (layers - 1) * qkv_fits) if fits else 0)
    np.testing.assert_array_equal(tokens, want_tokens)
    for (k, v), (wk, wv) in zip(caches, want_caches, strict=True):
        np.testing.assert_array_equal(k.view(np.uint8), wk.view(np.uint8))
        np.testing.assert_array_equal(v.view(np.uint8), wv.view(np.uint8))


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_decode_layer_is_one_launch(queue, monkeypatch, dtype):
    """With the GPU kernels (forced here: the split-key decode attention, the GPUs' gemv tile with the norm
    in its prologue), a one-row decode step runs each layer after the first as one launch: its attention
    (rope, the cache writes, the keys' splits and their merge) as the first tiles of the chain that makes the
    MLP half and the next layer's q/k/v (MultiHeadAttention.decode_phase, gemm_gemv.cl's CHAIN_ATTN): one
    launch a layer fewer than the attention launched alone, the same greedy tokens and caches bit for bit."""
    from netcl.nn import transformer
    from netcl.ops.gemm.launch import gemv_rms_fits
    from tests.ops.test_gemv_chain import gpu_shaped_chain

    gpu_shaped_chain(monkeypatch, 8)
    monkeypatch.setattr(transformer, "DECODE_LAYER_CHAIN", False)
    prompt = list(np.random.default_rng(4).integers(0, LLAMA["vocab_size"], 13))
    (launches, alone, chains), (want_launches, want_alone, _), hidden = _decode_both_ways(
        queue, monkeypatch, dtype, prompt, "DECODE_ATTENTION_CHAIN", ("attention_decode_gpu", "gemv_chain"))
    layers = LLAMA["n_layers"]
    # PyPI's PoCL 3.0 keeps the norm out of half rows' GEMVs (variants.gemv_rms_miscompiled): no chain there
    fits = gemv_rms_fits(queue.device, dtypes.normalize(dtype), 1, hidden, 32, glu=True)
    assert chains == (layers if fits else 0) and want_alone == layers
    assert (alone, launches) == ((1, want_launches - (layers - 1)) if fits else (layers, want_launches))


def _decode_both_ways(queue, monkeypatch, dtype, prompt, switch, kernels):
    """Greedy tokens of a small Llama (dim 32, hidden 128) with nn.transformer's `switch` on and then off:
    asserts the tokens and every cache equal bit for bit, and returns, for each way, (the recorded decode
    step's launches, how many of them are each of `kernels`), and the MLP's hidden width."""
    from netcl.nn import transformer

    runs = []
    for on in (True, False):
        monkeypatch.setattr(transformer, switch, on)
        model = make(queue, "llama", dtype=dtype, dim=32).stack_projections()
        tokens = np.array(list(model.generate(prompt, 10, temperature=0)))
        state = model._decoder
        names = [op[1].name for op in state.graph.ops if op[0] == "k"]
        runs.append((tokens, [(c.k.to_host(), c.v.to_host()) for c in state.caches],
                     (state.graph.launches, *[names.count(k) for k in kernels])))
    (tokens, caches, counts), (want_tokens, want_caches, want_counts) = runs
    np.testing.assert_array_equal(tokens, want_tokens)
    for (k, v), (wk, wv) in zip(caches, want_caches, strict=True):
        np.testing.assert_array_equal(k.view(np.uint8), wk.view(np.uint8))
        np.testing.assert_array_equal(v.view(np.uint8), wv.view(np.uint8))
    return counts, want_counts, model.layers[0].mlp.w2.in_features


@pytest.mark.gpu_shaped
@pytest.mark.parametrize("dtype,per", [("bfloat16", None), ("float16", 1)])
def test_a_decode_step_is_one_launch_for_all_layers(queue, monkeypatch, dtype, per):
    """With the GPU kernels (forced as above), a one-row decode step runs all its layers as one launch
    (transformer.decode_layers, gemm_gemv.cl's gemv_layers; `per` layers a launch where the device's argument
    space holds fewer, forced here): the same greedy tokens and caches, bit for bit, as the blocks run one by
    one with a launch a layer, and the layers' launches replaced by ceil(layers / per)."""
    from netcl.ops.gemm import chain
    from netcl.ops.gemm.launch import gemv_rms_fits
    from tests.ops.test_gemv_chain import gpu_shaped_chain

    gpu_shaped_chain(monkeypatch, 8)
    if per is not None:
        monkeypatch.setattr(chain, "layers_per_launch", lambda device: per)
    prompt = list(np.random.default_rng(5).integers(0, LLAMA["vocab_size"], 11))
    (launches, layer_launches), (want_launches, _), hidden = _decode_both_ways(
        queue, monkeypatch, dtype, prompt, "DECODE_LAYER_CHAIN", ("gemv_layers",))
    layers = LLAMA["n_layers"]
    # PyPI's PoCL 3.0 keeps the norm out of half rows' GEMVs (variants.gemv_rms_miscompiled): no chain there
    fits = gemv_rms_fits(queue.device, dtypes.normalize(dtype), 1, hidden, 32, glu=True)
    launched = -(-layers // (per or layers))
    assert layer_launches == (launched if fits else 0)
    # one launch a layer before (the first layer's q/k/v product and attention two more) -> `launched`, and
    # the step's kv_len (position + 1), which the whole-layer launches do not read, is not made
    assert launches == (want_launches - (layers + 2) - 1 + launched if fits else want_launches)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_hidden_from_embeddings_made_before(queue, kind):
    """GPT.hidden(..., embedded=): the tokens' embeddings made elsewhere (a decode step's sampling launch
    writes them) in place of the lookup: the same hidden states bit for bit (GPT-2's position embeddings
    still added), and a clear error for the wrong shape or dtype."""
    model = make(queue, kind)
    ids = np.array([[3, 7, 1], [0, model.config.vocab_size - 1, 2]], np.int32)
    dim = model.config.dim
    emb = ops.embedding(model.tok_embeddings.weight.value, Tensor.from_host(queue, ids))
    with ag.no_grad():
        want = model.hidden(ids).value.to_host()
        got = model.hidden(ids, embedded=emb).value.to_host()
        np.testing.assert_array_equal(got, want)
        with pytest.raises(ShapeError, match=rf"embedded must be a float32 Tensor of shape \(2, 3, {dim}\)"):
            model.hidden(ids, embedded=emb[:, :2])
        with pytest.raises(ShapeError, match="embedded must be"):
            model.hidden(ids, embedded=ops.cast(emb, np.float16))
