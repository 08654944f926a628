"""Half-precision Hugging Face weights: a Llama of a real config's shape, scaled down (TinyLlama's 8:1
grouped-query heads, head_dim 16, SwiGLU width 2.75 dim), loaded with dtype bfloat16 or float16. Weights are
stored in that dtype on the device; float16 decodes the greedy tokens of transformers' float16 model; bfloat16
logits are as close to the float32 computation as transformers' own bfloat16 ones are, and its greedy tokens
start as the float32 model's; the device holds the weights and the KV
cache, and little more, while it generates."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.core import dtypes
from netcl.core.memory import size_class
from netcl.models import GPT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 512
PROMPT = 6
NEW = 20
FOLLOW = 5


def tiny_llama(path, dtype, seed):
    """A random LlamaForCausalLM saved in `dtype` (weights N(0, 0.2): logits with margins above half
    rounding)."""
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=1, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        initializer_range=0.2,
    )
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(cfg).to(getattr(torch, dtype)).eval()
    hf.save_pretrained(path)
    return hf


def hf_greedy(hf, prompt):
    with torch.no_grad():
        out = hf.generate(torch.tensor(prompt[None]), max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                          eos_token_id=None)
    return out[0].tolist()


def hf_logits(hf, ids, dtype):
    with torch.no_grad():
        return hf.to(getattr(torch, dtype))(torch.tensor(ids)).logits.float().numpy()[0].astype(np.float64)


@pytest.mark.parametrize("seed", [0, 1])
def test_float16_greedy_tokens_equal_transformers(queue, tmp_path, seed):
    hf = tiny_llama(tmp_path, "float16", seed)
    model = GPT.from_pretrained(tmp_path, queue, dtype="float16")
    assert {p.value.dtype for p in model.parameters()} == {dtypes.float16}
    prompt = np.random.default_rng(seed).integers(0, VOCAB, PROMPT)
    want = hf_greedy(hf, prompt)[PROMPT:]
    assert list(model.generate(prompt, NEW, temperature=0)) == want


@pytest.mark.parametrize("seed", [0, 2])
def test_bfloat16_logits_and_greedy_choices(queue, tmp_path, seed):
    hf = tiny_llama(tmp_path, "bfloat16", seed)
    model = GPT.from_pretrained(tmp_path, queue, dtype="bfloat16")
    assert {p.value.dtype for p in model.parameters()} == {dtypes.bfloat16}
    prompt = np.random.default_rng(seed).integers(0, VOCAB, PROMPT)
    seq = np.array([hf_greedy(hf.float(), prompt)])  # float32 arithmetic on the same (bfloat16) weights
    exact = hf_logits(hf, seq, "float32")
    theirs = hf_logits(hf, seq, "bfloat16")
    ours = model(seq).value.to_host().astype(np.float64)[0]
    scale = np.abs(exact).max()
    err, hf_err = np.abs(ours - exact).max() / scale, np.abs(theirs - exact).max() / scale
    assert err < max(1.5 * hf_err, 0.01), (err, hf_err)
    # the cached decode (prefill, then one recorded step per token) follows the float32 run until
    # bfloat16's rounding meets a near-tie: 6 to 20 of 20 tokens on seeds 0-5 (transformers' bfloat16 run
    # does the same); the first FOLLOW are asserted
    got = list(model.generate(prompt, NEW, temperature=0))
    assert got[:FOLLOW] == seq[0, PROMPT:PROMPT + FOLLOW].tolist()


def test_the_device_holds_the_weights_and_the_kv_cache(queue, tmp_path):
    tiny_llama(tmp_path, "bfloat16", 0)
    pool = queue.device.pool
    before = pool.stats()["in_use"]
    model = GPT.from_pretrained(tmp_path, queue, dtype="bfloat16")
    c = model.config
    assert sum(p.value.nbytes for p in model.parameters()) == 2 * c.num_parameters()
    weights = sum(size_class(p.value.nbytes) for p in model.parameters())  # what the pool hands out
    loaded = pool.stats()["in_use"] - before
    # the weights, RoPE's two tables (unless another model made them) and nothing else; no float32 copy
    rope = 2 * size_class(c.max_seq_len * c.head_dim * 2)
    assert weights <= loaded <= weights + rope, (loaded, weights, rope)
    pool.reset_peak()
    prompt = np.arange(PROMPT)
    list(model.generate(prompt, NEW, temperature=0))
    cache = model._decoder.capacity * c.n_layers * 2 * c.n_kv_heads * c.head_dim * 2
    peak = pool.stats()["peak"] - before
    # activations of one step: a few (tokens, hidden_dim) and (tokens, vocab) rows, under 1/8 the weights
    assert weights + cache <= peak <= weights + cache + weights // 8, (peak, weights, cache)
