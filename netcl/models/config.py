"""GPTConfig: the shape and flavour of a GPT (Llama-style or GPT-2 style), checked where it is made."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from netcl.core import shapes
from netcl.errors import ShapeError
from netcl.ops.rope import ROPE_PAIRINGS, rope_scaling

ARCHS = ("llama", "gpt2")
# the weights' storage dtype; half models compute in float32 on half storage (netcl.core.dtypes.HALF)
DTYPES = ("float32", "float64", "bfloat16", "float16")
_MLP_ACTIVATIONS = ("gelu_tanh", "gelu", "relu", "silu")


@dataclass
class GPTConfig:
    """A decoder-only transformer.

    arch "llama": RMSNorm, rotary embeddings (rope_base, rope_pairing), SwiGLU feed-forward, no biases,
    untied embeddings by default. arch "gpt2": LayerNorm, learned positions, GELU (tanh) feed-forward,
    biases, tied embeddings by default. Fields left None take the arch's default when the config is made:
    n_kv_heads = n_heads (grouped-query attention when smaller, dividing n_heads), head_dim = dim /
    n_heads, hidden_dim (the feed-forward width) = 8/3 dim rounded up to a multiple of 32 for llama,
    4 dim for gpt2; norm_eps 1e-5; tie_embeddings, attn_bias (q/k/v projections) and mlp_bias per arch,
    attn_out_bias (the output projection) = attn_bias (Qwen2: False beside a True attn_bias). rope_scaling:
    None,
    {"rope_type": "linear", "factor": f} or Llama 3.1's {"rope_type": "llama3", "factor",
    "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} (netcl.ops.rope_scaling).
    bos_token_id (the token a text starts from) and eos_token_ids (the tokens that end one) are not the
    network's shape: they travel with it, from a Hugging Face directory's config.json and
    generation_config.json to the ones save_pretrained writes; eos_token_ids takes an id or ids.
    """

    vocab_size: int
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    head_dim: int | None = None
    hidden_dim: int | None = None
    max_seq_len: int = 512
    arch: str = "llama"
    norm_eps: float | None = None
    rope_base: float = 10000.0
    rope_pairing: str = "half"
    rope_scaling: dict[str, Any] | None = None
    tie_embeddings: bool | None = None
    attn_bias: bool | None = None
    mlp_bias: bool | None = None
    attn_out_bias: bool | None = None
    activation: str = "gelu_tanh"
    dropout: float = 0.0
    attn_dropout: float = 0.0
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"GPTConfig: arch must be one of {ARCHS}, got {self.arch!r}")
        llama = self.arch == "llama"
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
            setattr(self, name, shapes.size(getattr(self, name), f"GPTConfig: {name}", minimum=1))
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        self.n_kv_heads = shapes.size(self.n_kv_heads, "GPTConfig: n_kv_heads", minimum=1)
        if self.n_heads % self.n_kv_heads:
            raise ShapeError(f"GPTConfig: n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise ShapeError(f"GPTConfig: dim={self.dim} is not divisible by n_heads={self.n_heads}; set "
                                 "head_dim")
            self.head_dim = self.dim // self.n_heads
        self.head_dim = shapes.size(self.head_dim, "GPTConfig: head_dim", minimum=1)
        if llama and self.head_dim % 2:
            raise ShapeError(f"GPTConfig: rotary embeddings need an even head_dim, got {self.head_dim}")
        if self.hidden_dim is None:
            self.hidden_dim = 32 * math.ceil(8 * self.dim / 3 / 32) if llama else 4 * self.dim
        self.hidden_dim = shapes.size(self.hidden_dim, "GPTConfig: hidden_dim", minimum=1)
        if self.norm_eps is None:
            self.norm_eps = 1e-5
        self.norm_eps = _number("norm_eps", self.norm_eps, low=0.0, low_open=True)
        self.rope_base = _number("rope_base", self.rope_base, low=1.0, low_open=True)
        if self.rope_pairing not in ROPE_PAIRINGS:
            raise ValueError(f"GPTConfig: rope_pairing must be one of {sorted(ROPE_PAIRINGS)}, got "
                             f"{self.rope_pairing!r}")
        try:
            self.rope_scaling = rope_scaling(self.rope_scaling)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"GPTConfig: {exc}") from None
        if self.rope_scaling is not None and not llama:
            raise ValueError("GPTConfig: rope_scaling is for arch 'llama' (gpt2 has learned positions)")
        defaults = {"tie_embeddings": not llama, "attn_bias": not llama, "mlp_bias": not llama}
        for name in (*defaults, "attn_out_bias"):
            value = getattr(self, name)
            if value is None:
                value = defaults[name] if name in defaults else self.attn_bias
            if not isinstance(value, bool):
                raise TypeError(f"GPTConfig: {name} must be True, False or None, got {value!r}")
            setattr(self, name, value)
        if self.activation not in _MLP_ACTIVATIONS:
            raise ValueError(
                f"GPTConfig: activation must be one of {_MLP_ACTIVATIONS}, got {self.activation!r}"
            )
        for name in ("dropout", "attn_dropout"):
            setattr(self, name, _number(name, getattr(self, name), low=0.0, high=1.0))
        if self.dtype not in DTYPES:
            raise ValueError(f"GPTConfig: dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.bos_token_id is not None:
            self.bos_token_id = shapes.size(self.bos_token_id, "GPTConfig: bos_token_id", minimum=0)
        eos = () if self.eos_token_ids is None else self.eos_token_ids
        self.eos_token_ids = shapes.sizes(
            [eos] if isinstance(eos, numbers.Integral) else eos, "GPTConfig: eos_token_ids", minimum=0
        )

    @property
    def uses_rope(self) -> bool:
        return self.arch == "llama"

    def to_dict(self) -> dict[str, Any]:
        """Every field (a JSON-able dict; GPTConfig.from_dict(d) gives the config back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        """The config of `d` (as to_dict wrote it); an unknown key is an error naming it."""
        if not isinstance(d, dict):
            raise TypeError(f"GPTConfig.from_dict takes a dict, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"GPTConfig.from_dict: unknown fields {unknown} (known: {sorted(names)})")
        return cls(**d)

    def num_parameters(self) -> int:
        """Parameters of the model this config describes (tied embeddings counted once)."""
        d, v, h = self.dim, self.vocab_size, self.hidden_dim
        q_out, kv_out = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        attn = d * q_out + 2 * d * kv_out + q_out * d
        attn += (q_out + 2 * kv_out if self.attn_bias else 0) + (d if self.attn_out_bias else 0)
        if self.arch == "llama":
            mlp = 3 * d * h + (2 * h + d if self.mlp_bias else 0)
            norms = 2 * d
        else:
            mlp = 2 * d * h + (h + d if self.mlp_bias else 0)
            norms = 4 * d
        total = self.n_layers * (attn + mlp + norms) + v * d + (d if self.arch == "llama" else 2 * d)
        if self.arch == "gpt2":
            total += self.max_seq_len * d
        if not self.tie_embeddings:
            total += v * d
        return total


def _number(name: str, value: Any, low: float, high: float | None = None, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"GPTConfig: {name} must be a finite number, got {value!r}")
    value = float(value)
    if value < low or (low_open and value == low) or (high is not None and value >= high):
        bounds = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'})"
        raise ValueError(f"GPTConfig: {name} must lie in {bounds}, got {value}")
    return value
