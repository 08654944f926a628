"""A Hugging Face Llama directory with random weights and a real model's config: config.json and
model.safetensors that transformers' LlamaForCausalLM and netcl's GPT.from_pretrained both load, for
benchmarks and tests without a download.

    python bench/random_llama.py /tmp/tinyllama                      # TinyLlama-1.1B's shape, bfloat16
    python bench/random_llama.py /tmp/llama32 --shape llama-3.2-1b
    python bench/random_llama.py /tmp/tiny --shape tiny --dtype float32   # a CPU smoke test's size

Weights are N(0, 0.02) (transformers' initializer_range), norms 1, drawn with NumPy from --seed; written
with netcl.io.huggingface.write (2.2 GB and about a minute for the 1.1B shape).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netcl.core import dtypes  # noqa: E402
from netcl.io import huggingface as hf_io  # noqa: E402

# config.json fields of the real models (the Hub's, minus tokenizer ids); "tiny" keeps TinyLlama's
# proportions (grouped-query heads 8:1 -> 4:1, head_dim 16, SwiGLU width 2.75 dim) at a CPU test's size
SHAPES: dict[str, dict[str, Any]] = {
    "tinyllama-1.1b": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "llama-3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "vocab_size": 256,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
}


def hf_config(shape: str, dtype: str) -> dict[str, Any]:
    """The config.json of `shape` (a key of SHAPES) in `dtype`."""
    fields = dict(SHAPES[shape])
    fields.setdefault("head_dim", fields["hidden_size"] // fields["num_attention_heads"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "torch_dtype": dtype,
        "dtype": dtype,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        **fields,
    }


def hf_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape of a LlamaForCausalLM of config `cfg`."""
    d, h, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = (v, d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update(
            {
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (q, d),
                p + "self_attn.k_proj.weight": (kv, d),
                p + "self_attn.v_proj.weight": (kv, d),
                p + "self_attn.o_proj.weight": (d, q),
                p + "mlp.gate_proj.weight": (h, d),
                p + "mlp.up_proj.weight": (h, d),
                p + "mlp.down_proj.weight": (d, h),
            }
        )
    return out


def write_random_llama(
    path: str | Path, shape: str = "tinyllama-1.1b", dtype: str = "bfloat16", seed: int = 0, std: float = 0.02
) -> dict[str, Any]:
    """Write a random LlamaForCausalLM of `shape` in `dtype` to `path`; returns its config.json."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {sorted(SHAPES)}, got {shape!r}")
    cfg = hf_config(shape, dtype)
    dt = dtypes.normalize(dtype)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, size in hf_shapes(cfg).items():
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(size, dt)
        else:
            tensors[name] = (rng.standard_normal(size, np.float32) * np.float32(std)).astype(dt)
    hf_io.write(path, cfg, tensors, max_shard_bytes=2**31)
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="the directory to write (made if missing)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama-1.1b")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    cfg = write_random_llama(args.path, args.shape, args.dtype, args.seed)
    n = sum(int(np.prod(s)) for s in hf_shapes(cfg).values())
    print(
        f"wrote {args.path}: {args.shape}, {n / 1e6:,.1f} M parameters in {args.dtype} "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
