"""Weight-only int8 GPTs (GPT.quantize_int8): the quantized model computes what a float model with the
dequantized weights computes (logits; greedy tokens through the recorded decode step, batched and ragged),
stays close to the original, and holds a quarter of float32's bytes in its linear layers."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.core import dtypes
from netcl.errors import NetclError
from netcl.models import GPT, GPTConfig
from netcl.nn.layers import Linear
from netcl.ops.random import Generator

CONFIG = dict(vocab_size=67, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=88, max_seq_len=48)


def pair(queue, kind, dtype):
    """(int8 model, float model holding the int8 model's dequantized weights, the original's logits fn)."""
    extra = {"arch": "gpt2"} if kind == "gpt2" else {}
    cfg = GPTConfig(**{**CONFIG, **extra}, dtype=dtype)
    model = GPT(queue, cfg, generator=Generator(3))
    rng = np.random.default_rng(3)
    for name, p in model.named_parameters():
        if "norm" not in name:  # sharp logits: greedy tokens follow the weights, not rounding
            p.value.copy_from_host((0.3 * rng.standard_normal(p.shape)).astype(p.value.dtype))
    original = {k: v.to_host() for k, v in model.state_dict().items()}
    model.quantize_int8()
    twin = GPT(queue, cfg)
    state = {}
    for name, m in model.named_modules():
        if isinstance(m, Linear):
            q, s = m.weight.value.to_host(), m.weight_scale.to_host()
            state[f"{name}.weight"] = ((q.astype(np.float32) - 128) * s[:, None]).astype(np.dtype(dtype))
    twin.load_state_dict({**original, **state})
    return model, twin, original


@pytest.mark.parametrize("kind,dtype", [("llama", "float32"), ("llama", "bfloat16"), ("gpt2", "float16")])
def test_int8_model_equals_the_dequantized_float_model(queue, kind, dtype):
    model, twin, _ = pair(queue, kind, dtype)
    for m in model.modules():
        if isinstance(m, Linear):
            assert m.weight.value.dtype == dtypes.uint8 and m.weight_scale.shape == (m.out_features,)
    ids = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (2, 11))
    got = model(ids).value.to_host().astype(np.float64)
    want = twin(ids).value.to_host().astype(np.float64)
    tol = 1e-5 if dtype == "float32" else 2e-2
    assert np.abs(got - want).max() < tol * np.abs(want).max()
    # decode steps (the gemv kernel dequantizing in registers) against the twin's
    prompts = [[5, 9, 2], [7, 1, 4, 4, 8, 3], [11]]
    rows = np.array(list(model.generate(prompts, 10, temperature=0)))
    for r, prompt in enumerate(prompts):
        assert rows[:, r].tolist() == list(twin.generate(prompt, 10, temperature=0)), r


def test_int8_logits_stay_close_to_the_original(queue):
    model, _, original = pair(queue, "llama", "float32")
    full = GPT(queue, GPTConfig(**CONFIG))
    full.load_state_dict(original)
    ids = np.random.default_rng(1).integers(0, CONFIG["vocab_size"], (1, 20))
    a, b = model(ids).value.to_host(), full(ids).value.to_host()
    err = np.abs(a - b).max() / np.abs(b).max()
    # each weight moves by up to max|row| / 254 (~1% of a row of 88-ish N(0, 0.3) draws); logits by a few %
    assert 1e-4 < err < 0.1, err


def test_int8_weights_take_a_quarter_of_float32s_bytes(queue):
    model = GPT(queue, GPTConfig(**CONFIG), generator=Generator(0))
    linear = [m for m in model.modules() if isinstance(m, Linear)]
    before = sum(m.weight.value.nbytes for m in linear)
    model.quantize_int8()
    after = sum(m.weight.value.nbytes + m.weight_scale.nbytes for m in linear)
    assert after == before // 4 + sum(4 * m.out_features for m in linear)
    assert not any(m.weight.requires_grad for m in linear)


def test_an_int8_model_is_not_saved_as_a_hugging_face_checkpoint(queue, tmp_path):
    """save_pretrained wrote the int8 values under the float weights' names and no scales: transformers read
    them as weights, and netcl's reload decoded garbage. Refused, with what to do, and nothing written."""
    model, _, _ = pair(queue, "llama", "float32")
    with pytest.raises(NetclError, match=r"linear weights are int8.*Save the model before quantizing"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_int8_models_state_dict_holds_its_scales(queue):
    """The scales were no state: a quantized model's state_dict loaded into another quantized model kept that
    model's own scales (of its own weights) beside the loaded int8 values, and decoded garbage silently."""
    model, twin, _ = pair(queue, "llama", "float32")
    state = model.state_dict()
    assert "layers.0.attn.q_proj.weight_scale" in state and "lm_head.weight_scale" in state
    other = GPT(queue, model.config, generator=Generator(11)).quantize_int8()
    other.load_state_dict(state)
    ids = np.array([[5, 3, 9, 1, 7, 2]], np.int32)
    np.testing.assert_array_equal(other(ids).value.to_host(), model(ids).value.to_host())
    greedy = list(model.generate([5, 3, 9], 6, temperature=0))
    assert list(other.generate([5, 3, 9], 6, temperature=0)) == greedy
    with pytest.raises(Exception, match="weight_scale"):  # a float model has no scales to load them into
        GPT(queue, model.config).load_state_dict(state)
    assert model.to("bfloat16").lm_head.weight_scale.dtype == np.float32  # scales stay float32
