"""Hugging Face naming for netcl.models.GPT: one table per family (LlamaForCausalLM, GPT2LMHeadModel; Mistral
and Qwen2 read through Llama's) mapping HF tensors to netcl parameters, and the config.json fields to
GPTConfig.

A table row is (HF names, netcl names, conversion): most rows are one tensor each way; GPT-2's Conv1D
weights are stored (in, out) and are transposed; GPT-2's c_attn holds q, k and v side by side and splits
into three parameters. Hugging Face's Llama q/k projections are ordered for rotate_half (netcl's "half"
pairing); a model with rope_pairing "interleaved" (Meta's original layout) gets its q/k rows permuted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from netcl.core.files import atomic_write
from netcl.core.memory import format_bytes
from netcl.io import huggingface as hf_io
from netcl.io.huggingface import PretrainedError
from netcl.models.config import GPTConfig
from netcl.ops.rope import ROPE_SCALINGS, rope_tables_host_bytes

GENERATION_CONFIG = "generation_config.json"

Arrays = list[np.ndarray]
Rule = tuple[
    list[str], list[str], Callable[[Arrays, GPTConfig], Arrays], Callable[[Arrays, GPTConfig], Arrays]
]

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                "gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu"}
_HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


# -- conversions (HF arrays -> netcl arrays, and back)
# ---------------------------------------------------------
def _same(arrays: Arrays, _c: GPTConfig) -> Arrays:
    return [arrays[0]]


def _transpose(arrays: Arrays, _c: GPTConfig) -> Arrays:
    return [np.ascontiguousarray(arrays[0].T)]


def _split_qkv(arrays: Arrays, c: GPTConfig) -> Arrays:
    """GPT-2's c_attn, (dim, 3 dim) weight or (3 dim,) bias, into q, k, v as Linear weights/biases."""
    w = arrays[0]
    parts = np.split(w, 3, axis=-1)
    return [np.ascontiguousarray(p.T) if p.ndim == 2 else np.ascontiguousarray(p) for p in parts]


def _join_qkv(arrays: Arrays, _c: GPTConfig) -> Arrays:
    return [np.ascontiguousarray(np.concatenate([a.T if a.ndim == 2 else a for a in arrays], axis=-1))]


def _rope_rows(proj: str, to_interleaved: bool) -> Callable[[Arrays, GPTConfig], Arrays]:
    """Reorder a q/k projection's output rows between rotate_half ("half", Hugging Face's order) and
    Meta's interleaved pairs, per head; identity for a "half" model."""
    def convert(arrays: Arrays, c: GPTConfig) -> Arrays:
        w = arrays[0]
        if c.rope_pairing == "half":
            return [w]
        n = c.n_heads if proj == "q" else c.n_kv_heads
        d = c.head_dim
        rows = (
            w.reshape(n, 2, d // 2, *w.shape[1:]) if to_interleaved else w.reshape(n, d // 2, 2, *w.shape[1:])
        )
        return [np.ascontiguousarray(np.swapaxes(rows, 1, 2).reshape(w.shape))]

    return convert


# -- the tables
# --------------------------------------------------------------------------------------------------
def _llama_rules(c: GPTConfig) -> list[Rule]:
    same = (_same, _same)
    rules: list[Rule] = [(["model.embed_tokens.weight"], ["tok_embeddings.weight"], *same),
                         (["model.norm.weight"], ["norm.weight"], *same)]
    if not c.tie_embeddings:
        rules.append((["lm_head.weight"], ["lm_head.weight"], *same))
    for i in range(c.n_layers):
        hf, nc = f"model.layers.{i}.", f"layers.{i}."
        rules += [([hf + "input_layernorm.weight"], [nc + "attn_norm.weight"], *same),
                  ([hf + "post_attention_layernorm.weight"], [nc + "mlp_norm.weight"], *same)]
        for p in ["weight", "bias"] if c.attn_bias else ["weight"]:
            rules += [([f"{hf}self_attn.{n}_proj.{p}"], [f"{nc}attn.{n}_proj.{p}"], _rope_rows(n, True),
                       _rope_rows(n, False)) for n in "qk"]
            rules.append(([f"{hf}self_attn.v_proj.{p}"], [f"{nc}attn.v_proj.{p}"], *same))
        for p in ["weight", "bias"] if c.attn_out_bias else ["weight"]:
            rules.append(([f"{hf}self_attn.o_proj.{p}"], [f"{nc}attn.o_proj.{p}"], *same))
        for p in (["weight", "bias"] if c.mlp_bias else ["weight"]):
            rules += [([f"{hf}mlp.gate_proj.{p}"], [f"{nc}mlp.w1.{p}"], *same),
                      ([f"{hf}mlp.up_proj.{p}"], [f"{nc}mlp.w3.{p}"], *same),
                      ([f"{hf}mlp.down_proj.{p}"], [f"{nc}mlp.w2.{p}"], *same)]
    return rules


def _gpt2_rules(c: GPTConfig) -> list[Rule]:
    same, conv1d = (_same, _same), (_transpose, _transpose)
    rules: list[Rule] = [(["transformer.wte.weight"], ["tok_embeddings.weight"], *same),
                         (["transformer.wpe.weight"], ["pos_embeddings.weight"], *same),
                         (["transformer.ln_f.weight"], ["norm.weight"], *same),
                         (["transformer.ln_f.bias"], ["norm.bias"], *same)]
    if not c.tie_embeddings:
        rules.append((["lm_head.weight"], ["lm_head.weight"], *same))
    for i in range(c.n_layers):
        hf, nc = f"transformer.h.{i}.", f"layers.{i}."
        for p in ("weight", "bias"):
            rules += [
                ([f"{hf}ln_1.{p}"], [f"{nc}attn_norm.{p}"], *same),
                ([f"{hf}ln_2.{p}"], [f"{nc}mlp_norm.{p}"], *same),
                ([f"{hf}attn.c_attn.{p}"], [f"{nc}attn.{n}_proj.{p}" for n in "qkv"], _split_qkv, _join_qkv),
                ([f"{hf}attn.c_proj.{p}"], [f"{nc}attn.o_proj.{p}"], *(conv1d if p == "weight" else same)),
                ([f"{hf}mlp.c_fc.{p}"], [f"{nc}mlp.fc.{p}"], *(conv1d if p == "weight" else same)),
                ([f"{hf}mlp.c_proj.{p}"], [f"{nc}mlp.proj.{p}"], *(conv1d if p == "weight" else same)),
            ]
    return rules


_RULES = {"llama": _llama_rules, "gpt2": _gpt2_rules}
# tensors some checkpoints carry that are not weights (a causal-mask buffer, rotary frequencies)
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


# -- config.json <-> GPTConfig
# ------------------------------------------------------------------------------------
# family -> (model_type, architecture). Mistral and Qwen2 are Llama's tensors under Llama's names: Qwen2 with
# biases on q/k/v (not on o), Mistral and Qwen2 with an optional sliding attention window, which netcl does
# not implement: their max_seq_len is capped at the window, inside which it changes nothing.
_FAMILIES = {"llama": ("llama", "LlamaForCausalLM"), "mistral": ("mistral", "MistralForCausalLM"),
             "qwen2": ("qwen2", "Qwen2ForCausalLM"), "gpt2": ("gpt2", "GPT2LMHeadModel")}


def _sliding_window(family: str, config: dict[str, Any]) -> int | None:
    """The attention window of a Mistral or Qwen2 config that has one, else None."""
    window = config.get("sliding_window")
    if family == "qwen2":
        layer_types = config.get("layer_types")
        if layer_types is not None:
            return window if "sliding_attention" in layer_types else None
        sliding = config.get("use_sliding_window", False) and config.get(
            "max_window_layers", 28
        ) < config.get("num_hidden_layers", 0)
        return window if sliding else None
    return window if family == "mistral" else None


def _family(config: dict[str, Any]) -> str:
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    for family, (kind, arch) in _FAMILIES.items():
        if model_type == kind or arch in archs:
            return family
    raise PretrainedError(
        f"netcl loads {', '.join(arch for _, arch in _FAMILIES.values())} directories; this "
        f"one is model_type={model_type!r}, architectures={archs}"
    )


# netcl field -> the config.json key it is read from, per table (errors about config.json's values name the
# keys)
_KEYS = {
    "llama": {"vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_hidden_layers",
              "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
              "hidden_dim": "intermediate_size", "max_seq_len": "max_position_embeddings",
              "norm_eps": "rms_norm_eps", "rope_base": "rope_theta"},
    "gpt2": {"vocab_size": "vocab_size", "dim": "n_embd", "n_layers": "n_layer", "n_heads": "n_head",
             "hidden_dim": "n_inner", "max_seq_len": "n_positions", "norm_eps": "layer_norm_epsilon"},
}
# the sizes config.json must give: transformers would take its classes' defaults (a 4096-wide Llama of 32000
# tokens), which the weights then contradict
_REQUIRED = {"llama": ("vocab_size", "dim", "n_layers", "n_heads", "hidden_dim"),
             "gpt2": ("vocab_size", "dim", "n_layers", "n_heads")}


def _special_ids(config: dict[str, Any], generation: dict[str, Any]) -> dict[str, Any]:
    """bos_token_id and eos_token_ids as transformers' generate takes them: generation_config.json's where
    it names one, else config.json's."""
    out: dict[str, Any] = {}
    for key, field in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_ids")):
        files = (("generation_config.json", generation), ("config.json", config))
        source, value = next(((n, doc[key]) for n, doc in files if doc.get(key) is not None), (None, None))
        if value is None:
            continue
        many = field == "eos_token_ids" and isinstance(value, list)
        ids = value if many else [value]
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            kind = "a token id (an integer >= 0)" + (" or a list of them" if field == "eos_token_ids" else "")
            raise PretrainedError(f"{source}'s {key} must be {kind}, got {value!r}")
        out[field] = tuple(ids) if field == "eos_token_ids" else value
    return out


def _check_overrides(overrides: dict[str, Any]) -> None:
    """Each override's value by GPTConfig's rule for its field, apart from config.json's values (a bad one is
    the caller's argument, named as such)."""
    try:
        GPTConfig(vocab_size=1, dim=2, n_layers=1, n_heads=1, **overrides)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"from_pretrained: {str(exc).removeprefix('GPTConfig: ')}") from None


def config_from_hf(config: dict[str, Any], overrides: dict[str, Any] | None = None,
                   generation: dict[str, Any] | None = None) -> GPTConfig:
    """The GPTConfig of a Hugging Face config.json (settings netcl does not implement are refused), with
    `overrides` of its fields and the special-token ids of `generation` (generation_config.json) where it
    has them. A bad override is a ValueError or TypeError naming the argument; a bad config.json value a
    PretrainedError naming its key."""
    overrides = dict(overrides or {})
    _check_overrides(overrides)
    family = _family(config)
    arch = "gpt2" if family == "gpt2" else "llama"
    get = config.get
    read = {field: get(key) for field, key in _KEYS[arch].items() if field != "rope_base"}
    absent = [_KEYS[arch][f] for f in _REQUIRED[arch] if read[f] is None]
    if absent:
        raise PretrainedError(f"config.json does not describe a model netcl can build: it has no "
                              f"{', '.join(absent)} (netcl takes no default for a model's sizes)")
    if arch == "llama":
        rope = get("rope_parameters") or get("rope_scaling") or {}
        rope_type = (
            rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        )
        scaling = None
        if rope_type in ROPE_SCALINGS:
            scaling = {"rope_type": rope_type, **{k: rope[k] for k in ROPE_SCALINGS[rope_type] if k in rope}}
            if rope_type == "llama3" and rope.get("original_max_position_embeddings") is None:
                # transformers' too
                scaling["original_max_position_embeddings"] = get("max_position_embeddings")
        elif rope_type not in (None, "default"):
            raise PretrainedError(
                f"rope scaling {rope_type!r} is not implemented by netcl (plain RoPE and the "
                f"static scalings {sorted(ROPE_SCALINGS)})"
            )
        if get("hidden_act", "silu") not in ("silu", "swish"):
            raise PretrainedError(f"Llama hidden_act {get('hidden_act')!r}: netcl's SwiGLU uses silu")
        theta = (
            rope["rope_theta"] if isinstance(rope, dict) and "rope_theta" in rope else get("rope_theta", 1e4)
        )
        fields = dict(
            read,
            arch="llama",
            max_seq_len=get("max_position_embeddings", 2048),
            norm_eps=get("rms_norm_eps", 1e-6),
            rope_base=theta,
            rope_scaling=scaling,
            tie_embeddings=bool(get("tie_word_embeddings", False)),
            attn_bias=family == "qwen2" or bool(get("attention_bias", False)),
            attn_out_bias=family != "qwen2" and bool(get("attention_bias", False)),
            mlp_bias=bool(get("mlp_bias", False)),
        )
        window = _sliding_window(family, config)
        if window is not None:
            wanted = overrides.get("max_seq_len", fields["max_seq_len"])
            if wanted is not None and wanted > window:
                if "max_seq_len" in overrides:
                    raise PretrainedError(
                        f"max_seq_len={wanted} exceeds the {family} model's sliding attention "
                        f"window of {window}, which netcl does not implement"
                    )
                fields["max_seq_len"] = window
    else:
        act = get("activation_function", "gelu_new")
        if act not in _ACTIVATIONS:
            raise PretrainedError(f"GPT-2 activation_function {act!r} is not one netcl implements "
                                  f"({sorted(_ACTIVATIONS)})")
        if not get("scale_attn_weights", True) or get("scale_attn_by_inverse_layer_idx", False):
            raise PretrainedError(
                "GPT-2 attention without 1/sqrt(head_dim) scaling, or scaled by the inverse "
                "layer index, is not implemented by netcl"
            )
        fields = dict(
            read,
            arch="gpt2",
            max_seq_len=get("n_positions", 1024),  # transformers' default
            norm_eps=get("layer_norm_epsilon", 1e-5),
            activation=_ACTIVATIONS[act],
            tie_embeddings=bool(get("tie_word_embeddings", True)),
            attn_bias=True,
            mlp_bias=True,
        )
    fields = {k: v for k, v in fields.items() if v is not None}
    fields.update(_special_ids(config, generation or {}))
    fields.update(overrides)
    try:
        return GPTConfig(**fields)
    except (TypeError, ValueError) as exc:
        # the fields config.json gave, under its own names (an override was checked on its own)
        names = {f: k for f, k in _KEYS[arch].items() if f not in overrides}
        text = re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: names[m[1]],
                      str(exc).removeprefix("GPTConfig: "))
        raise PretrainedError(f"config.json does not describe a model netcl can build: {text}") from None


def _special_ids_to_hf(c: GPTConfig) -> dict[str, Any]:
    """config.json's (and generation_config.json's) bos_token_id and eos_token_id: one id as an int, several
    as a list, none as null."""
    eos = c.eos_token_ids
    return {"bos_token_id": c.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else list(eos) or None}


def config_to_hf(c: GPTConfig) -> dict[str, Any]:
    """config.json of a GPTConfig (what transformers needs to rebuild the same model)."""
    if c.arch == "llama":
        qwen2 = c.attn_bias and not c.attn_out_bias
        if c.attn_out_bias and not c.attn_bias or qwen2 and c.mlp_bias:
            raise PretrainedError(
                f"attn_bias={c.attn_bias}, attn_out_bias={c.attn_out_bias}, mlp_bias={c.mlp_bias}: "
                "no Hugging Face architecture netcl writes has these biases (Llama: attention biases "
                "on all four projections or none; Qwen2: on q/k/v, none on o and the MLP)"
            )
        family, arch = _FAMILIES["qwen2" if qwen2 else "llama"]
        return {
            "architectures": [arch],
            "model_type": family,
            "vocab_size": c.vocab_size,
            "hidden_size": c.dim,
            "intermediate_size": c.hidden_dim,
            "num_hidden_layers": c.n_layers,
            "num_attention_heads": c.n_heads,
            "num_key_value_heads": c.n_kv_heads,
            "head_dim": c.head_dim,
            "max_position_embeddings": c.max_seq_len,
            "rms_norm_eps": c.norm_eps,
            "rope_theta": c.rope_base,
            "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_base, **(c.rope_scaling or {})},
            # transformers 4.x reads the scaling from rope_scaling (5.x from rope_parameters)
            "rope_scaling": dict(c.rope_scaling) if c.rope_scaling else None,
            **(
                {"use_sliding_window": False, "sliding_window": None}
                if qwen2
                else {"attention_bias": c.attn_bias, "mlp_bias": c.mlp_bias}
            ),
            "tie_word_embeddings": c.tie_embeddings,
            "hidden_act": "silu",
            "attention_dropout": c.attn_dropout,
            "torch_dtype": c.dtype,
            "dtype": c.dtype,
            **_special_ids_to_hf(c),
            "pad_token_id": None,
        }
    biases = c.attn_bias and c.attn_out_bias and c.mlp_bias
    if not biases or c.n_kv_heads != c.n_heads or c.head_dim * c.n_heads != c.dim:
        raise PretrainedError(
            "GPT-2's format needs biases everywhere, n_kv_heads == n_heads and head_dim * n_heads "
            f"== dim; this model has attn_bias={c.attn_bias}, mlp_bias={c.mlp_bias}, "
            f"n_kv_heads={c.n_kv_heads}, head_dim={c.head_dim}"
        )
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_embd": c.dim,
        "n_layer": c.n_layers,
        "n_head": c.n_heads,
        "n_inner": c.hidden_dim,
        "n_positions": c.max_seq_len,
        "n_ctx": c.max_seq_len,
        "layer_norm_epsilon": c.norm_eps,
        "activation_function": _HF_ACTIVATION[c.activation],
        "tie_word_embeddings": c.tie_embeddings,
        "resid_pdrop": c.dropout,
        "embd_pdrop": c.dropout,
        "attn_pdrop": c.attn_dropout,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "torch_dtype": c.dtype,
        "dtype": c.dtype,
        **_special_ids_to_hf(c),
        "pad_token_id": None,
    }


# -- loading and saving
# ------------------------------------------------------------------------------------------
# the base model's prefix of each table's names (the decoder stack without the language-model head)
_BASE_PREFIX = {"llama": "model.", "gpt2": "transformer."}


def _with_base_prefix(tensors: dict[str, np.ndarray], prefix: str, known: set[str]) -> dict[str, np.ndarray]:
    """Names as the table writes them. A directory saved from the base model (GPT2Model, LlamaModel: the
    Hub's openai-community/gpt2 is one) names its tensors without the prefix, which transformers adds on
    loading; so does netcl when no tensor carries it and it makes names known."""
    if any(k.startswith(prefix) for k in tensors) or not any(prefix + k in known for k in tensors):
        return tensors
    return {k if k == "lm_head.weight" else prefix + k: v for k, v in tensors.items()}


def _shapes(c: GPTConfig) -> dict[str, tuple[int, ...]]:
    """netcl parameter name -> shape for config c (the model's state_dict, without building it)."""
    d, q_out, kv_out, h = c.dim, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.hidden_dim
    out: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (c.vocab_size, d), "norm.weight": (d,)}
    if c.arch == "gpt2":
        out.update({"pos_embeddings.weight": (c.max_seq_len, d), "norm.bias": (d,)})
    if not c.tie_embeddings:
        out["lm_head.weight"] = (c.vocab_size, d)
    for i in range(c.n_layers):
        p = f"layers.{i}."
        for norm in ("attn_norm", "mlp_norm"):
            out[f"{p}{norm}.weight"] = (d,)
            if c.arch == "gpt2":
                out[f"{p}{norm}.bias"] = (d,)
        for name, rows in (("q", q_out), ("k", kv_out), ("v", kv_out)):
            out[f"{p}attn.{name}_proj.weight"] = (rows, d)
            if c.attn_bias:
                out[f"{p}attn.{name}_proj.bias"] = (rows,)
        out[f"{p}attn.o_proj.weight"] = (d, q_out)
        if c.attn_out_bias:
            out[f"{p}attn.o_proj.bias"] = (d,)
        layers = (
            (("w1", h, d), ("w3", h, d), ("w2", d, h))
            if c.arch == "llama"
            else (("fc", h, d), ("proj", d, h))
        )
        for name, rows, cols in layers:
            out[f"{p}mlp.{name}.weight"] = (rows, cols)
            if c.mlp_bias:
                out[f"{p}mlp.{name}.bias"] = (rows,)
    return out


def _read_generation_config(path: str | os.PathLike) -> dict[str, Any]:
    """generation_config.json of a model directory as a dict ({} where there is none)."""
    return hf_io.read_json(Path(path) / GENERATION_CONFIG) or {}


def _host_memory() -> int | None:
    """This host's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check_rotary_tables(c: GPTConfig, overridden: bool) -> None:
    """A clear error where the rotary cos/sin tables of c.max_seq_len positions cannot be made on this host
    (netcl.ops.rope_tables_host_bytes), before any weight is read."""
    if not c.uses_rope:
        return
    staging = rope_tables_host_bytes(c.max_seq_len, c.head_dim, c.dtype)
    memory = _host_memory()
    if memory is None or staging <= memory:
        return
    given = "max_seq_len" if overridden else "config.json's max_position_embeddings"
    raise PretrainedError(
        f"{given}={c.max_seq_len}: the rotary tables for that many positions take "
        f"{format_bytes(staging)} of host memory to make, more than this host's {format_bytes(memory)}; "
        "load the model for fewer positions: from_pretrained(..., max_seq_len=N), or netcl generate/chat "
        "--max-seq-len N"
    )


def load(
    path: str | os.PathLike, overrides: dict[str, Any] | None = None
) -> tuple[GPTConfig, dict[str, np.ndarray]]:
    """(config, netcl-named arrays) of a Hugging Face directory. Every HF tensor must map to a parameter of
    the config's model, every parameter must be there, every shape must fit; otherwise one
    PretrainedError lists the unknown, missing and mis-shaped tensors (all of them)."""
    allowed = {"max_seq_len", "dropout", "attn_dropout", "rope_pairing", "dtype"}
    unknown = sorted(set(overrides or {}) - {f.name for f in dataclasses.fields(GPTConfig)})
    if unknown:  # transformers' from_pretrained arguments, typos: not "would change what the weights mean"
        hints = {"torch_dtype": "dtype=", "max_position_embeddings": "max_seq_len="}
        said = "".join(f"; for {k} pass {hints[k]}" for k in unknown if k in hints)
        raise TypeError(
            f"from_pretrained() got unexpected keyword arguments {unknown}; it takes the path, the queue and "
            f"overrides of {sorted(allowed)}{said}"
        )
    bad = sorted(set(overrides or {}) - allowed)
    if bad:
        raise ValueError(
            f"from_pretrained: {bad} cannot be overridden (they would change what the weights mean); "
            f"overridable: {sorted(allowed)}"
        )
    raw_config = hf_io.read_config(path)
    config = config_from_hf(raw_config, overrides, _read_generation_config(path))
    if config.arch == "gpt2" and "max_seq_len" in (overrides or {}):
        raise ValueError("from_pretrained: a GPT-2's max_seq_len is its learned position table (n_positions)")
    _check_rotary_tables(config, "max_seq_len" in (overrides or {}))
    shapes = _shapes(config)
    rules = _RULES[config.arch](config)
    known = {name for rule in rules for name in rule[0]}
    tensors = _with_base_prefix(hf_io.read_tensors(path), _BASE_PREFIX[config.arch], known)
    unknown = sorted(k for k in tensors if k not in known and not k.endswith(_IGNORED_SUFFIXES)
                     and not (k == "lm_head.weight" and config.tie_embeddings))
    missing = sorted(name for name in known if name not in tensors)
    misshaped, arrays = [], {}
    for hf_names, nc_names, to_netcl, to_hf in rules:
        if any(n not in tensors for n in hf_names):
            continue
        want = [s.shape for s in to_hf([np.empty(shapes[n], np.float32) for n in nc_names], config)]
        got = [tensors[n].shape for n in hf_names]
        wrong = [(n, g, w) for n, g, w in zip(hf_names, got, want) if tuple(g) != tuple(w)]
        if wrong:
            misshaped += [f"{n}: {tuple(g)} in the file, {tuple(w)} expected" for n, g, w in wrong]
            continue
        dt = np.dtype(config.dtype)
        for name, arr in zip(nc_names, to_netcl([tensors[n] for n in hf_names], config)):
            arrays[name] = np.ascontiguousarray(arr, dtype=dt)
    if unknown or missing or misshaped:
        lines = [f"{path}: the weights do not match the {config.arch} model its config.json describes:"]
        if unknown:
            lines.append(f"  unknown tensors ({len(unknown)}): {', '.join(unknown)}")
        if missing:
            lines.append(f"  missing tensors ({len(missing)}): {', '.join(missing)}")
        if misshaped:
            lines.append(f"  mis-shaped tensors ({len(misshaped)}):")
            lines += [f"    {m}" for m in misshaped]
        raise PretrainedError("\n".join(lines))
    return config, arrays


def save(path: str | os.PathLike, config: GPTConfig, state: dict[str, np.ndarray],
         max_shard_bytes: int | None = None) -> list[Path]:
    """Write a model's state (netcl names) as a Hugging Face directory of config's family, with
    generation_config.json holding its special-token ids where it has any; returns the paths written."""
    tensors: dict[str, np.ndarray] = {}
    for hf_names, nc_names, _to_netcl, to_hf in _RULES[config.arch](config):
        for name, arr in zip(hf_names, to_hf([state[n] for n in nc_names], config)):
            tensors[name] = arr
    written = hf_io.write(path, config_to_hf(config), tensors, max_shard_bytes)
    # transformers' generate takes the special-token ids from here before config.json; a model without them
    # removes the file an earlier model in the directory left, which would speak for this one
    generation = Path(path) / GENERATION_CONFIG
    if config.bos_token_id is None and not config.eos_token_ids:
        generation.unlink(missing_ok=True)
        return written
    atomic_write(generation, (json.dumps(_special_ids_to_hf(config), indent=2) + "\n").encode())
    return [*written, generation]


__all__ = ["PretrainedError", "config_from_hf", "config_to_hf", "load", "save"]
