"""netcl.models.GPT and GPTConfig: forward and loss against the float64 NumPy reference, gradients by a
directional derivative, training steps repeated bit for bit, configs and their errors."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, ShapeError
from netcl.models import GPT, GPTConfig
from netcl.ops import attention as attn
from netcl.ops import determinism
from netcl.ops.random import Generator
from netcl.optim import AdamW
from tests.models import reference_gpt as ref

CONFIGS = {
    "llama": dict(
        arch="llama",
        vocab_size=23,
        dim=16,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=12,
        rope_base=500.0,
    ),
    "llama-tied-interleaved": dict(
        arch="llama",
        vocab_size=19,
        dim=12,
        n_layers=1,
        n_heads=3,
        n_kv_heads=1,
        max_seq_len=10,
        tie_embeddings=True,
        rope_pairing="interleaved",
        attn_bias=True,
    ),
    "gpt2": dict(arch="gpt2", vocab_size=21, dim=12, n_layers=2, n_heads=3, max_seq_len=9),
}


def model_of(queue, name, dtype="float64", seed=0):
    model = GPT(queue, GPTConfig(**CONFIGS[name], dtype=dtype), generator=Generator(seed))
    rng = np.random.default_rng(seed)
    for pname, p in model.named_parameters():  # larger than the 0.02 init, so every part matters
        noise = rng.standard_normal(p.shape)
        p.value.copy_from_host(1 + 0.1 * noise if "norm.weight" in pname else 0.2 * noise)
    return model


def state_of(model):
    return {k: v.to_host().astype(np.float64) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_matches_numpy(queue, name):
    model = model_of(queue, name)
    c = model.config
    ids = np.random.default_rng(1).integers(0, c.vocab_size, (2, c.max_seq_len - 1))
    got = model(ids).value.to_host()
    assert got.shape == (2, c.max_seq_len - 1, c.vocab_size)
    np.testing.assert_allclose(got, ref.gpt_logits(ids, state_of(model), c), rtol=1e-10, atol=1e-10)


def test_forward_with_padding_mask(queue):
    model = model_of(queue, "llama")
    ids = np.random.default_rng(2).integers(0, 23, (2, 6))
    mask = np.ones((2, 6), np.int32)
    mask[0, 4:] = 0
    got = model(ids, attention_mask=mask).value.to_host()
    np.testing.assert_allclose(
        got, ref.gpt_logits(ids, state_of(model), model.config, mask), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_loss_and_its_gradient(queue, name):
    model = model_of(queue, name)
    c = model.config
    rng = np.random.default_rng(3)
    ids = rng.integers(0, c.vocab_size, (2, 7))
    targets = rng.integers(0, c.vocab_size, (2, 7))
    targets[0, 1] = -100
    loss_mask = rng.integers(0, 2, (2, 7)).astype(bool)
    loss_mask[1, :2] = True
    keep = loss_mask & (targets != -100)
    state = state_of(model)

    def reference(st):
        return ref.cross_entropy(ref.gpt_logits(ids, st, c), np.where(keep, targets, 0), keep)

    with ag.Tape() as tape:
        loss = model.loss(Tensor.from_host(queue, ids.astype(np.int32)), targets.astype(np.int32), loss_mask)
    tape.backward(loss)
    assert loss.shape == (1,)
    np.testing.assert_allclose(loss.value.to_host()[0], reference(state), rtol=1e-10)
    grads = {n: p.grad.to_host() for n, p in model.named_parameters()}
    direction = {n: rng.standard_normal(v.shape) for n, v in state.items()}
    analytic = sum(float((grads[n] * direction[n]).sum()) for n in state)
    eps = 1e-6
    numeric = (reference({n: v + eps * direction[n] for n, v in state.items()})
               - reference({n: v - eps * direction[n] for n, v in state.items()})) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6)


def test_loss_mask_drops_positions(queue):
    """A position the mask drops carries no gradient: its logits' gradient is exactly zero."""
    model = model_of(queue, "gpt2", "float32")
    ids = np.arange(10, dtype=np.int32).reshape(2, 5)
    mask = np.array([[1, 1, 0, 0, 1], [0, 0, 0, 1, 1]])
    with ag.Tape() as tape:
        logits = model(ids)
        logits.retain_grad()
        loss = ag.cross_entropy(
            logits, Tensor.from_host(queue, np.where(mask > 0, ids, -100).astype(np.int32))
        )
    tape.backward(loss)
    masked_logit_grads = np.abs(logits.grad.to_host()).sum(-1)
    assert (masked_logit_grads[mask == 0] == 0).all() and (masked_logit_grads[mask == 1] > 0).all()
    with ag.Tape():
        via_loss = model.loss(ids, ids, loss_mask=mask).value.to_host()
    np.testing.assert_allclose(via_loss, loss.value.to_host(), rtol=1e-6)


def _train_steps(queue, seed, steps=2):
    """Losses and final weights of `steps` AdamW steps of a tiny float32 GPT from `seed`: 40 positions of 4
    sequences over a vocabulary of 7 (every id many times in the embedding's backward), grouped-query
    attention over 2 key tiles of the GPU kernels, dropout on the residual stream and the probabilities."""
    config = GPTConfig(arch="gpt2", vocab_size=7, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=40,
                       dropout=0.1, attn_dropout=0.1, tie_embeddings=False)
    model = GPT(queue, config, generator=Generator(seed))
    opt = AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        ids, targets = (rng.integers(0, 7, (4, 40)).astype(np.int32) for _ in "it")
        with ag.Tape() as tape:
            loss = model.loss(Tensor.from_host(queue, ids), targets)
        tape.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.value.to_host()[0])
    return losses, {k: v.to_host() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("variant", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu_shaped)])
def test_training_steps_repeat_bit_for_bit(queue, monkeypatch, variant):
    """Determinism on (the default): two runs of the same training steps from the same seed give the same
    losses and weights, bit for bit, with the CPU attention kernels and with the GPU ones (their fused
    backward: dq summed from per-work-group copies); the embeddings' gradients by sorted segments."""
    monkeypatch.setattr(determinism, "_deterministic", [True])
    monkeypatch.setattr(attn, "variant_override", variant)
    first_losses, first = _train_steps(queue, 5)
    again_losses, again = _train_steps(queue, 5)
    assert first_losses == again_losses
    assert first.keys() == again.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], again[name], err_msg=name)
    init = GPT(queue, GPTConfig(arch="gpt2", vocab_size=7, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                max_seq_len=40, tie_embeddings=False), generator=Generator(5)).state_dict()
    for name in ("tok_embeddings.weight", "pos_embeddings.weight"):   # (the steps did train them)
        assert not np.array_equal(first[name], init[name].to_host()), name


def test_init_scheme(queue):
    c = GPTConfig(vocab_size=300, dim=64, n_layers=4, n_heads=4, max_seq_len=64)
    model = GPT(queue, c, generator=Generator(0))
    sd = {k: v.to_host() for k, v in model.state_dict().items()}
    assert sum(v.size for v in sd.values()) == c.num_parameters() == model.num_parameters()
    assert abs(sd["layers.0.attn.q_proj.weight"].std() - 0.02) < 0.003
    assert abs(sd["layers.1.attn.o_proj.weight"].std() - 0.02 / np.sqrt(8)) < 0.002
    assert (sd["norm.weight"] == 1).all()
    gpt2 = GPTConfig(arch="gpt2", vocab_size=50, dim=16, n_layers=1, n_heads=2, max_seq_len=8)
    g = GPT(queue, gpt2)
    assert g.num_parameters() == gpt2.num_parameters() and "lm_head.weight" not in g.state_dict()
    assert (g.state_dict()["layers.0.attn.q_proj.bias"].to_host() == 0).all()
    qwen = GPTConfig(vocab_size=50, dim=16, n_layers=2, n_heads=2, attn_bias=True, attn_out_bias=False)
    q2 = GPT(queue, qwen)
    assert q2.num_parameters() == qwen.num_parameters() and "layers.1.attn.o_proj.bias" not in q2.state_dict()
    assert "layers.1.attn.k_proj.bias" in q2.state_dict()


def test_config_defaults_and_roundtrip():
    c = GPTConfig(vocab_size=100, dim=96, n_heads=6, n_kv_heads=2)
    assert (c.head_dim, c.hidden_dim, c.tie_embeddings, c.attn_bias) == (16, 256, False, False)
    g = GPTConfig(arch="gpt2", vocab_size=100, dim=96, n_heads=6)
    assert (g.hidden_dim, g.tie_embeddings, g.attn_bias, g.mlp_bias, g.attn_out_bias) == (
        384,
        True,
        True,
        True,
        True,
    )
    assert (
        c.attn_out_bias is False and GPTConfig(vocab_size=9, dim=8, n_heads=2, attn_bias=True).attn_out_bias
    )
    assert GPTConfig.from_dict(c.to_dict()) == c
    scaled = GPTConfig(vocab_size=100, dim=96, n_heads=6, rope_scaling={"rope_type": "linear", "factor": 4})
    assert scaled.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    assert GPTConfig.from_dict(scaled.to_dict()) == scaled


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        (dict(arch="bert"), ValueError, "arch must be one of"),
        (dict(n_heads=5), ShapeError, "not divisible by n_heads=5"),
        (dict(n_kv_heads=3), ShapeError, "must divide n_heads=4"),
        (dict(head_dim=7, dim=28, n_heads=4), ShapeError, "even head_dim"),
        (dict(dim=0), ShapeError, "dim must be at least 1"),
        (dict(dropout=1.0), ValueError, r"dropout must lie in \[0.0, 1.0\)"),
        (dict(rope_pairing="neox"), ValueError, "rope_pairing"),
        (dict(tie_embeddings="yes"), TypeError, "tie_embeddings"),
        (dict(dtype="int8"), ValueError, "dtype"),
        (dict(norm_eps=0), ValueError, "norm_eps"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), ValueError, "rope_type must be one of"),
        (
            dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
            ValueError,
            r"missing \['low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings'\]",
        ),
        (
            dict(rope_scaling={"rope_type": "linear", "factor": 2.0, "beta": 1}),
            ValueError,
            r"unknown \['beta'\]",
        ),
        (dict(rope_scaling={"rope_type": "linear", "factor": -2.0}), ValueError, "positive finite"),
        (
            dict(
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 4.0,
                    "high_freq_factor": 1.0,
                    "original_max_position_embeddings": 64,
                }
            ),
            ValueError,
            "high_freq_factor > low_freq_factor",
        ),
        (dict(rope_scaling=("linear", 2.0)), TypeError, "GPTConfig: rope scaling must be a dict"),
        (
            dict(arch="gpt2", rope_scaling={"rope_type": "linear", "factor": 2.0}),
            ValueError,
            "learned positions",
        ),
    ],
)
def test_config_errors(kwargs, error, words):
    with pytest.raises(error, match=words):
        GPTConfig(**{"vocab_size": 10, "dim": 16, "n_heads": 4, **kwargs})


def test_config_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match=r"unknown fields \['layers'\]"):
        GPTConfig.from_dict({"vocab_size": 10, "layers": 3})


def test_forward_errors(queue):
    model = GPT(queue, GPTConfig(vocab_size=10, dim=8, n_layers=1, n_heads=2, max_seq_len=4))
    with pytest.raises(ShapeError, match="exceed the model's max_seq_len 4"):
        model(np.zeros((1, 5), np.int32))
    with pytest.raises(DTypeError, match="integers"):
        model(np.zeros((1, 2), np.float32))
    with pytest.raises(ShapeError, match=r"\(batch, positions\)"):
        model(np.zeros(3, np.int32))
    with pytest.raises(ShapeError, match="outside"):
        model(np.array([[1, 12]], np.int32)).value.to_host()
    with pytest.raises(ShapeError, match="targets of shape"):
        model.loss(np.zeros((1, 3), np.int32), np.zeros((1, 2), np.int32))
    with pytest.raises(TypeError, match="GPTConfig"):
        GPT(queue, {"vocab_size": 10})
    with pytest.raises(TypeError, match=r"GPT: generator must be a netcl.ops.random.Generator, got int 3"):
        GPT(queue, model.config, generator=3)


@pytest.mark.parametrize("name", ["llama", "llama-tied-interleaved", "gpt2"])
def test_stacked_projections_change_no_value_and_train_as_before(queue, name):
    """stack_projections: q, k, v (and SwiGLU's gate and up) as row blocks of one matrix. The forward without
    a tape runs them as one GEMM (fewer launches in a recorded decode step), with the same values; a
    training step (a tape: the layers one by one) updates the views exactly as the separate parameters."""
    from netcl.optim import SGD

    plain, stacked = model_of(queue, name), model_of(queue, name).stack_projections()
    ids = np.random.default_rng(1).integers(0, CONFIGS[name]["vocab_size"], (2, 7))
    np.testing.assert_allclose(stacked(ids).value.to_host(), plain(ids).value.to_host(), rtol=1e-12,
                               atol=1e-12)
    assert list(stacked.generate([1, 2, 3], 5, temperature=0)) == list(plain.generate([1, 2, 3], 5,
                                                                                        temperature=0))
    # gpt2: q, k, v 3 -> 1 launches; llama also: rope q, rope k into the cache, v into the cache 3 -> 1
    # (3 -> 0 where the GPU decode kernel rotates and caches the new rows itself,
    # ops.rope_cache_decode_attention), and gate, up 2 -> 1 (float64: the GEMM then silu * up; half dtypes:
    # one GLU launch)
    gpu_decode = any(op[0] == "k" and op[1].name == "attention_decode_gpu"
                     for op in stacked._decoder.graph.ops)
    saved = (2 if name == "gpt2" else 6 if gpu_decode else 5) * plain.config.n_layers
    assert stacked._decoder.graph.launches == plain._decoder.graph.launches - saved
    targets = np.random.default_rng(2).integers(0, CONFIGS[name]["vocab_size"], (2, 7))
    for model in (plain, stacked):
        opt = SGD(model.parameters(), lr=0.1)
        with ag.Tape() as tape:
            loss = model.loss(ids, targets)
        tape.backward(loss)
        opt.step()
    a, b = state_of(plain), state_of(stacked)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-12, atol=1e-12, err_msg=k)
    # the stacked forward still sees the views the optimizer updated in place
    np.testing.assert_allclose(stacked(ids).value.to_host(), plain(ids).value.to_host(), rtol=1e-12,
                               atol=1e-12)
