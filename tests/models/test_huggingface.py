"""Hugging Face weights: tiny LlamaForCausalLM and GPT2LMHeadModel from random configs, saved with
transformers' save_pretrained; netcl loads them (logits within 1e-4 relative, greedy tokens as HF's
generate), saves them back for transformers, and refuses bad directories with every problem named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from netcl.models import GPT, GPTConfig, PretrainedError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 61


def hf_llama(**overrides):
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=44,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=48,
        rms_norm_eps=1e-5,
        rope_theta=5000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    cfg.update(overrides)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))


def hf_gpt2(**overrides):
    cfg = dict(vocab_size=VOCAB, n_embd=24, n_layer=2, n_head=3, n_positions=40, bos_token_id=None,
               eos_token_id=None, pad_token_id=None)
    cfg.update(overrides)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg))


# Llama 3.1's frequency scaling with head_dim 8 and theta 5000: wavelengths 6.3, 53, 444 and 3736 positions
# against the thresholds 40 / 4 = 10 and 40 / 0.5 = 80 cover the kept, the blended and the divided ones
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0, "low_freq_factor": 0.5,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 40}
LINEAR_ROPE = {"rope_type": "linear", "rope_theta": 5000.0, "factor": 3.0}
def hf_family(name, **overrides):
    """A Mistral or Qwen2 (Llama's tensors, Qwen2 with q/k/v biases) of hf_llama's sizes."""
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=44,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=48,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    cfg.update(overrides)
    config, model = {"mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
                     "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[name]
    return model(config(**cfg))


MODELS = {
    "llama": hf_llama,
    "llama-gqa-bias-tied": lambda: hf_llama(
        num_key_value_heads=1, attention_bias=True, mlp_bias=True, tie_word_embeddings=True
    ),
    "llama3-rope-scaling": lambda: hf_llama(rope_parameters=LLAMA3_ROPE),
    "llama-linear-rope-scaling": lambda: hf_llama(rope_parameters=LINEAR_ROPE),
    "mistral-sliding-window": lambda: hf_family("mistral", sliding_window=24),
    "qwen2-qkv-bias": lambda: hf_family("qwen2", tie_word_embeddings=True),
    "gpt2": hf_gpt2,
}


def saved(tmp_path, name, seed=0, **save_kwargs):
    torch.manual_seed(seed)
    model = MODELS[name]()
    with torch.no_grad():  # weights well away from 0.02 so every tensor moves the logits
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.eval()
    path = tmp_path / name
    model.save_pretrained(path, **save_kwargs)
    return model, path


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids, dtype=torch.long)).logits.numpy().astype(np.float64)


def assert_logits_close(got, want):
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-4, err


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_greedy_tokens_match_transformers(queue, tmp_path, name):
    hf, path = saved(tmp_path, name)
    model = GPT.from_pretrained(path, queue)
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 11))
    assert_logits_close(model(ids).value.to_host(), hf_logits(hf, ids))
    prompt = ids[:1, :5]
    with torch.no_grad():
        want = hf.generate(torch.tensor(prompt), max_new_tokens=12, do_sample=False, pad_token_id=0,
                           eos_token_id=None)[0, 5:].tolist()
    assert list(model.generate(prompt[0], 12, temperature=0)) == want


@pytest.mark.parametrize("name", list(MODELS))
def test_save_pretrained_loads_back_into_transformers(queue, tmp_path, name):
    hf, path = saved(tmp_path, name)
    model = GPT.from_pretrained(path, queue)
    out = tmp_path / "netcl-export"
    model.save_pretrained(out)
    back = transformers.AutoModelForCausalLM.from_pretrained(out)  # a Mistral comes back as a Llama
    back.eval()
    assert type(back).__name__ == {"gpt2": "GPT2LMHeadModel", "qwen2-qkv-bias": "Qwen2ForCausalLM"}.get(
        name, "LlamaForCausalLM")
    ids = np.random.default_rng(1).integers(0, VOCAB, (1, 9))
    assert_logits_close(hf_logits(back, ids), hf_logits(hf, ids))
    assert GPT.from_pretrained(out, queue).config == model.config


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        LINEAR_ROPE,
        LLAMA3_ROPE,
        {
            **LLAMA3_ROPE,
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
@pytest.mark.parametrize("head_dim", [8, 64, 128])
def test_rope_frequencies_match_transformers(scaling, head_dim):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from netcl.ops import rope_inv_freq

    theta = scaling["rope_theta"] if scaling else 10000.0
    params = {**(scaling or {"rope_type": "default"}), "rope_theta": theta}
    config = transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, rope_parameters=params,
                                      max_position_embeddings=16384)
    if scaling is None:
        want = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    else:
        want, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
    ours = {k: v for k, v in (scaling or {}).items() if k != "rope_theta"} or None
    # float32 step for step; torch's float32 pow may differ from a correctly rounded one by an ulp
    np.testing.assert_allclose(rope_inv_freq(head_dim, theta, ours), want.numpy(), rtol=4e-7, atol=0)


def test_sharded_directories_both_ways(queue, tmp_path):
    hf, path = saved(tmp_path, "llama", max_shard_size="40KB")
    assert (path / "model.safetensors.index.json").exists()
    model = GPT.from_pretrained(path, queue)
    ids = np.random.default_rng(2).integers(0, VOCAB, (1, 7))
    assert_logits_close(model(ids).value.to_host(), hf_logits(hf, ids))
    out = tmp_path / "sharded-export"
    model.save_pretrained(out, max_shard_bytes=30_000)
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1 and not (out / "model.safetensors").exists()
    back = type(hf).from_pretrained(out)
    back.eval()
    assert_logits_close(hf_logits(back, ids), hf_logits(hf, ids))


def test_sliding_windows_cap_the_context(queue, tmp_path):
    _, path = saved(tmp_path, "mistral-sliding-window")
    assert GPT.from_pretrained(path, queue).config.max_seq_len == 24
    assert GPT.from_pretrained(path, queue, max_seq_len=16).config.max_seq_len == 16
    with pytest.raises(PretrainedError, match="exceeds the mistral model's sliding attention window of 24"):
        GPT.from_pretrained(path, queue, max_seq_len=32)
    _, path = saved(tmp_path, "qwen2-qkv-bias")  # use_sliding_window False: the window is not used
    model = GPT.from_pretrained(path, queue)
    assert model.config.max_seq_len == 48 and (model.config.attn_bias, model.config.attn_out_bias) == (
        True,
        False,
    )
    assert "layers.0.attn.o_proj.bias" not in model.state_dict()


def test_biases_without_a_hugging_face_architecture_are_refused(queue, tmp_path):
    from netcl.models import GPTConfig

    model = GPT(
        queue, GPTConfig(vocab_size=10, dim=8, n_layers=1, n_heads=2, attn_bias=False, attn_out_bias=True)
    )
    with pytest.raises(PretrainedError, match="no Hugging Face architecture netcl writes"):
        model.save_pretrained(tmp_path / "x")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_base_model_names_without_the_prefix(queue, tmp_path, name):
    """The Hub's GPT-2 is saved from GPT2Model: 'h.0.attn.c_attn.weight', 'wte.weight', no lm_head (tied),
    and the old causal-mask buffers 'h.N.attn.bias'."""
    from safetensors.numpy import load_file, save_file

    hf, path = saved(tmp_path, name)
    prefix = "transformer." if name == "gpt2" else "model."
    tensors = {k.removeprefix(prefix): v for k, v in load_file(path / "model.safetensors").items()}
    if name == "gpt2":
        tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 40, 40), np.float32))
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    ids = np.random.default_rng(5).integers(0, VOCAB, (1, 8))
    assert_logits_close(GPT.from_pretrained(path, queue)(ids).value.to_host(), hf_logits(hf, ids))


def test_interleaved_pairing_permutes_q_and_k(queue, tmp_path):
    """Meta's interleaved rotary pairs with the q/k rows permuted to match compute the same logits."""
    hf, path = saved(tmp_path, "llama")
    model = GPT.from_pretrained(path, queue, rope_pairing="interleaved")
    assert model.config.rope_pairing == "interleaved"
    half = GPT.from_pretrained(path, queue)
    q_half = half.state_dict()["layers.0.attn.q_proj.weight"].to_host()
    q_inter = model.state_dict()["layers.0.attn.q_proj.weight"].to_host()
    assert not np.array_equal(q_half, q_inter)
    ids = np.random.default_rng(3).integers(0, VOCAB, (1, 10))
    assert_logits_close(model(ids).value.to_host(), hf_logits(hf, ids))
    out = tmp_path / "interleaved-export"
    model.save_pretrained(out)  # written back in Hugging Face's (rotate_half) order
    back = type(hf).from_pretrained(out)
    back.eval()
    assert_logits_close(hf_logits(back, ids), hf_logits(hf, ids))


def test_bfloat16_weights_load_as_float32(queue, tmp_path):
    torch.manual_seed(0)
    hf = hf_llama()
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model = GPT.from_pretrained(tmp_path / "bf16", queue)
    ids = np.random.default_rng(4).integers(0, VOCAB, (1, 6))
    hf.float().eval()
    assert_logits_close(model(ids).value.to_host(), hf_logits(hf, ids))


def test_mismatched_weights_are_all_listed(queue, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, path = saved(tmp_path, "llama")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    del tensors["model.norm.weight"]
    tensors["model.layers.0.self_attn.k_proj.weight"] = tensors["model.layers.0.self_attn.k_proj.weight"][:4]
    tensors["model.layers.0.mlp.down_proj.weight"] = tensors["model.layers.0.mlp.down_proj.weight"].T.copy()
    tensors["model.layers.0.self_attn.extra.weight"] = np.zeros(3, np.float32)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(PretrainedError) as info:
        GPT.from_pretrained(path, queue)
    text = str(info.value)
    for words in (
        "unknown tensors (1): model.layers.0.self_attn.extra.weight",
        "missing tensors (2): model.layers.1.mlp.up_proj.weight, model.norm.weight",
        "mis-shaped tensors (2)",
        "model.layers.0.self_attn.k_proj.weight: (4, 32) in the file, (16, 32)",
        "model.layers.0.mlp.down_proj.weight: (44, 32) in the file, (32, 44) expected",
    ):
        assert words in text, text


def test_bad_directories(queue, tmp_path):
    with pytest.raises(PretrainedError, match="is not a directory"):
        GPT.from_pretrained(tmp_path / "nowhere", queue)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PretrainedError, match="has no config.json"):
        GPT.from_pretrained(empty, queue)
    _, path = saved(tmp_path, "gpt2")
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(PretrainedError, match="safetensors only"):
        GPT.from_pretrained(path, queue)
    _, path = saved(tmp_path, "llama", seed=1)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(
        json.dumps({**cfg, "model_type": "gemma", "architectures": ["GemmaForCausalLM"]})
    )
    with pytest.raises(PretrainedError, match="model_type=.gemma."):
        GPT.from_pretrained(path, queue)
    (path / "config.json").write_text(
        json.dumps({**cfg, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}})
    )
    with pytest.raises(PretrainedError, match="rope scaling 'yarn'"):
        GPT.from_pretrained(path, queue)
    (path / "config.json").write_text(
        json.dumps({**cfg, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}})
    )
    with pytest.raises(PretrainedError, match="missing .'low_freq_factor'"):
        GPT.from_pretrained(path, queue)
    (path / "config.json").write_text("{not json")
    with pytest.raises(PretrainedError, match="cannot read"):
        GPT.from_pretrained(path, queue)
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(PretrainedError, match="truncated"):
        GPT.from_pretrained(path, queue)
    _, sharded = saved(tmp_path / "s", "llama", max_shard_size="40KB")
    next(sharded.glob("model-00001-*.safetensors")).unlink()
    with pytest.raises(PretrainedError, match="shard files that are not in"):
        GPT.from_pretrained(sharded, queue)
    with pytest.raises(ValueError, match="cannot be overridden"):
        GPT.from_pretrained(path, queue, n_layers=1)
    # transformers' argument names and typos are not config fields: their error said 'cannot be overridden
    # (they would change what the weights mean)'
    with pytest.raises(TypeError, match=r"arguments \['torch_dtype'\].*for torch_dtype pass dtype="):
        GPT.from_pretrained(path, queue, torch_dtype="float16")
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['max_seq'\]; it takes the path"):
        GPT.from_pretrained(path, queue, max_seq=8)


def test_special_token_ids_follow_transformers_and_survive_save_pretrained(queue, tmp_path):
    """generation_config.json's eos_token_id before config.json's (transformers' generate stops only at it);
    the ids load into GPTConfig and save_pretrained writes them back where transformers reads them."""
    torch.manual_seed(0)
    hf_llama(bos_token_id=3, eos_token_id=5).save_pretrained(tmp_path / "ids")
    path = tmp_path / "ids"
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == 5
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 3, "eos_token_id": [7, 9]}))
    want = transformers.AutoModelForCausalLM.from_pretrained(path).generation_config
    config = GPT.from_pretrained(path, queue).config
    got = (config.bos_token_id, list(config.eos_token_ids))
    assert got == (want.bos_token_id, want.eos_token_id) == (3, [7, 9])
    (path / "generation_config.json").unlink()  # none: config.json's, as transformers
    want = transformers.AutoModelForCausalLM.from_pretrained(path).generation_config
    config = GPT.from_pretrained(path, queue).config
    got = (config.bos_token_id, config.eos_token_ids)
    assert got == (want.bos_token_id, (want.eos_token_id,)) == (3, (5,))

    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    model = GPT.from_pretrained(path, queue)
    out = tmp_path / "resaved"
    model.save_pretrained(out)
    back = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert (back.generation_config.bos_token_id, back.generation_config.eos_token_id) == (3, [7, 9])
    assert (back.config.bos_token_id, back.config.eos_token_id) == (3, [7, 9])
    assert GPT.from_pretrained(out, queue).config == model.config
    # a model without ids removes the file an earlier save left
    GPT(queue, GPTConfig(vocab_size=VOCAB, dim=8, n_layers=1, n_heads=2)).save_pretrained(out)
    assert not (out / "generation_config.json").exists()
    assert GPT.from_pretrained(out, queue).config.eos_token_ids == ()


def test_unreadable_generation_config_is_an_error(queue, tmp_path):
    _, path = saved(tmp_path, "llama")
    (path / "generation_config.json").write_text("{{")
    with pytest.raises(PretrainedError, match=r"cannot read .*generation_config.json: Expecting property"):
        GPT.from_pretrained(path, queue)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(PretrainedError, match="generation_config.json's eos_token_id must be a token id"):
        GPT.from_pretrained(path, queue)


def test_errors_name_the_argument_or_the_config_json_key(queue, tmp_path):
    _, path = saved(tmp_path, "llama")
    for dtype in ("auto", torch.bfloat16):
        with pytest.raises(ValueError, match=r"^from_pretrained: dtype must be one of \(") as info:
            GPT.from_pretrained(path, queue, dtype=dtype)
        assert "config.json" not in str(info.value)
    with pytest.raises(ValueError, match="^from_pretrained: max_seq_len must be at least 1, got 0"):
        GPT.from_pretrained(path, queue, max_seq_len=0)
    cfg = json.loads((path / "config.json").read_text())
    for change, words in [
        ({"vocab_size": None}, "it has no vocab_size (netcl takes no default for a model's sizes)"),
        ({"num_attention_heads": 3}, "num_key_value_heads=2 must divide num_attention_heads=3"),
        ({"hidden_size": "32"}, "hidden_size must be an integer, got '32' (str)"),
        ({"max_position_embeddings": 0}, "max_position_embeddings must be at least 1, got 0"),
    ]:
        (path / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(PretrainedError) as info:
            GPT.from_pretrained(path, queue)
        assert str(info.value) == f"config.json does not describe a model netcl can build: {words}"
    gpt2 = hf_gpt2().config.to_dict()
    (path / "config.json").write_text(json.dumps({**gpt2, "n_head": 5}))
    with pytest.raises(PretrainedError, match="n_embd=24 is not divisible by n_head=5"):
        GPT.from_pretrained(path, queue)


def test_a_context_too_long_for_this_host_is_a_clear_error(queue, tmp_path):
    """max_position_embeddings of 10**12: making the rotary tables was numpy's _ArrayMemoryError."""
    hf, path = saved(tmp_path, "llama")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 10**12}))
    with pytest.raises(PretrainedError) as info:
        GPT.from_pretrained(path, queue)
    text = str(info.value)
    assert text.startswith("config.json's max_position_embeddings=1000000000000: the rotary tables for that "
                           "many positions take 87.3 TiB of host memory to make, more than this host's")
    assert "from_pretrained(..., max_seq_len=N)" in text
    with pytest.raises(PretrainedError, match="^max_seq_len=1000000000000: the rotary tables"):
        GPT.from_pretrained(path, queue, max_seq_len=10**12)
    model = GPT.from_pretrained(path, queue, max_seq_len=40)  # the override it names
    ids = np.random.default_rng(6).integers(0, VOCAB, (1, 7))
    assert_logits_close(model(ids).value.to_host(), hf_logits(hf, ids))
