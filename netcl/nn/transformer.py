"""Transformer layers: rotary embeddings, SwiGLU and GELU feed-forwards, multi-head attention with
grouped-query heads and a KV cache, and the pre-norm block made of them.

Shapes: activations are (batch, positions, dim); heads are (batch, heads, positions, head_dim) views of
the projections (a permute, no copy). A residual add runs in the epilogue of the GEMM that ends each
branch (netcl.autograd.linear_residual), so a block costs no separate add launches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl import ops
from netcl.autograd.engine import Node, as_node
from netcl.core import dtypes, shapes
from netcl.core.backend import as_queue
from netcl.core.tensor import Tensor
from netcl.errors import ShapeError
from netcl.nn.layers import LayerNorm, Linear, LinearStack, RMSNorm, _probability
from netcl.nn.module import Module
from netcl.ops import random
from netcl.ops.gemm import chain
from netcl.ops.rope import ROPE_PAIRINGS

__all__ = ["GELUMLP", "KVCache", "MultiHeadAttention", "RoPE", "SwiGLU", "TransformerBlock", "decode_layers"]

# A decode step's MLP half (o-projection + residual, RMSNorm + gate/up + SwiGLU, down + residual) as one
# launch where it keeps the three launches' bits (TransformerBlock._mlp_half_chain; ops.gemm.gemv_chain).
# False: three launches a layer (bench/decode.py --no-chain compares).
DECODE_CHAIN = True
# With DECODE_CHAIN, the layer's attention (rope, cache writes, the split-key decode kernel) as the chain's
# first tiles where the block before made the q/k/v product in its chain: one launch a layer
# (MultiHeadAttention.decode_phase; gemm_gemv.cl's CHAIN_ATTN). False: the attention its own launch
# (bench/decode.py --no-attention-chain compares).
DECODE_ATTENTION_CHAIN = True
# With both, a one-row decode step's layers as whole-layer launches (decode_layers; gemm_gemv.cl's
# gemv_layers): every layer in one launch where the device's kernel-argument space holds them (NVIDIA: 30).
# False: a launch a layer as above (bench/decode.py --no-layer-chain compares).
DECODE_LAYER_CHAIN = True


class RoPE(Module):
    """Rotary position embedding of heads x (B, H, S, D): pair i of the head vector at position p is
    rotated by p * base^(-2i/D). pairing "half" pairs x[i] with x[i + D/2] (GPT-NeoX, Hugging Face Llama),
    "interleaved" x[2i] with x[2i+1] (Meta's Llama, GPT-J). scaling rescales the frequencies (None,
    {"rope_type": "linear", ...} or Llama 3.1's {"rope_type": "llama3", ...}: see netcl.ops.rope_scaling).
    The cos/sin tables (max_len, D/2) are made once per (max_len, D, base, scaling) and are not state (no
    parameters, nothing in state_dict)."""

    def __init__(self, q: Any, head_dim: int, max_len: int, base: float = 10000.0, pairing: str = "half",
                 dtype: Any = "float32", scaling: dict[str, Any] | None = None):
        super().__init__()
        if pairing not in ROPE_PAIRINGS:
            raise ValueError(f"RoPE: pairing must be one of {sorted(ROPE_PAIRINGS)}, got {pairing!r}")
        self.head_dim = shapes.size(head_dim, "RoPE: head_dim", minimum=2)
        self.max_len = shapes.size(max_len, "RoPE: max_len", minimum=1)
        self.base, self.pairing = float(base), pairing
        self.scaling = ops.rope_scaling(scaling)
        self.dtype = dtype
        self.cos, self.sin = ops.rope_tables(as_queue(q), self.max_len, self.head_dim, self.base, dtype,
                                             self.scaling)

    def _moved(self, queue: Any, dtype: Any) -> None:
        self.dtype = self.dtype if dtype is None else dtype
        self.cos, self.sin = ops.rope_tables(queue or self.cos.queue, self.max_len, self.head_dim, self.base,
                                             self.dtype, self.scaling)

    def forward(self, x: Node, offset: Tensor | None = None) -> Node:
        """x (B, H, S, D) rotated at positions s + offset (offset: None or an int32 device Tensor (1,) or
        (B,), e.g. a KV cache's length)."""
        return ag.rope(x, self.cos, self.sin, offset, self.pairing)

    def rotate_into(self, x: Tensor, cache: Tensor, offset: Tensor) -> None:
        """Rotate x (B, H, S, D) and write it into cache (B, H, capacity, D) at positions offset + s (one
        launch: the rotation is the cache write; no gradient)."""
        ops.rope(x, self.cos, self.sin, offset, self.pairing, out=cache, out_at_offset=True)

    def extra_repr(self) -> str:
        scaling = f", scaling={self.scaling}" if self.scaling else ""
        return (f"head_dim={self.head_dim}, max_len={self.max_len}, base={self.base}, "
                f"pairing={self.pairing!r}{scaling}")


class SwiGLU(Module):
    """w2(silu(w1 x) * w3 x): x (..., dim) -> (..., dim), hidden width hidden_dim. silu(a) * b is one
    fused launch (and one for both its gradients); a residual is added in w2's GEMM epilogue."""

    def __init__(self, q: Any, dim: int, hidden_dim: int, bias: bool = False, dtype: Any = "float32",
                 generator: random.Generator | None = None):
        super().__init__()
        self.w1 = Linear(q, dim, hidden_dim, bias=bias, dtype=dtype, generator=generator)
        self.w3 = Linear(q, dim, hidden_dim, bias=bias, dtype=dtype, generator=generator)
        self.w2 = Linear(q, hidden_dim, dim, bias=bias, dtype=dtype, generator=generator)

        self._gate_up: LinearStack | None = None

    def stack_projections(self) -> None:
        """w1 and w3 as one matrix (LinearStack): an inference forward makes them one GEMM."""
        self._gate_up = LinearStack([self.w1, self.w3])

    def _moved(self, queue: Any, dtype: Any) -> None:
        if self._gate_up is not None:  # the layers' new tensors stacked again (the old matrix is freed)
            self.stack_projections()

    def forward(self, x: Node, residual: Node | None = None, norm: Module | None = None) -> Node:
        """x (..., dim) -> (..., dim) (+ residual); of norm(x) where a norm is given (an RMSNorm inside the
        gate/up GEMV's prologue when decoding)."""
        stack = self._gate_up
        if stack is not None and not ag.is_recording() and stack.intact() and stack.bias is None:
            # gate and up in one GEMM (one launch with silu * up, and the norm, a decode step)
            fused = _fused_norm(norm, x)
            h = stack.silu_mul(x if norm is None or fused else norm(x), fused)
        else:
            y = x if norm is None else norm(x)
            h = ag.silu_mul(self.w1(y), self.w3(y))
        return _project(h, self.w2, residual)


class GELUMLP(Module):
    """GPT-2's feed-forward proj(gelu(fc x)): x (..., dim) -> (..., dim); the activation ('gelu_tanh',
    'gelu', 'relu' or 'silu') follows fc's GEMM, a residual is added in proj's epilogue."""

    def __init__(self, q: Any, dim: int, hidden_dim: int, bias: bool = True, activation: str = "gelu_tanh",
                 dtype: Any = "float32", generator: random.Generator | None = None):
        super().__init__()
        if activation not in ("gelu_tanh", "gelu", "relu", "silu"):
            raise ValueError(
                f"GELUMLP: activation must be 'gelu_tanh', 'gelu', 'relu' or 'silu', got {activation!r}"
            )
        self.activation = activation
        self.fc = Linear(q, dim, hidden_dim, bias=bias, dtype=dtype, generator=generator)
        self.proj = Linear(q, hidden_dim, dim, bias=bias, dtype=dtype, generator=generator)

    def forward(self, x: Node, residual: Node | None = None, norm: Module | None = None) -> Node:
        h = self.fc(x if norm is None else norm(x), activation=self.activation)
        return _project(h, self.proj, residual)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


def _project(h: Node, layer: Linear, residual: Node | None) -> Node:
    return layer(h, residual=residual)


def _fused_norm(norm: Module | None, x: Node) -> RMSNorm | None:
    """`norm` where the next product may apply it to x in its own launch (RMSNorm.fusable)."""
    return norm if isinstance(norm, RMSNorm) and norm.fusable(x) else None


class KVCache:
    """Keys and values of one attention layer for cached decoding, preallocated (B, n_kv_heads, max_len,
    head_dim) each. Writes go to the position held by a device int32 tensor (the number of tokens already
    cached), so a recorded decode step replays at the next position."""

    def __init__(
        self, q: Any, batch: int, n_kv_heads: int, max_len: int, head_dim: int, dtype: Any = "float32"
    ):
        q = as_queue(q)
        shape = (
            shapes.size(batch, "KVCache: batch", minimum=1),
            shapes.size(n_kv_heads, "KVCache: n_kv_heads", 1),
            shapes.size(max_len, "KVCache: max_len", minimum=1),
            shapes.size(head_dim, "KVCache: head_dim", 1),
        )
        self.k = Tensor.zeros(q, shape, dtype)
        self.v = Tensor.zeros(q, shape, dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.k.shape

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def write(self, k: Tensor, v: Tensor, position: Tensor) -> None:
        """k, v (B, n_kv_heads, S, head_dim) into positions position .. position + S - 1."""
        ops.cache_write(self.k, k, position)
        ops.cache_write(self.v, v, position)

    def __repr__(self) -> str:
        return f"KVCache(shape={self.k.shape}, dtype={self.k.dtype})"


class MultiHeadAttention(Module):
    """Self-attention of x (B, S, dim) -> (B, S, dim): q, k, v projections to n_heads query heads and
    n_kv_heads key/value heads of head_dim (n_kv_heads divides n_heads: grouped-query attention), rotary
    embeddings on q and k when `rope` is given, streaming attention (netcl.autograd.flash_attention;
    causal by default, masks, dropout on the probabilities in training) and the output projection.

    With a KVCache and `position` (int32 device Tensor (1,) or (B,): how many tokens the cache holds),
    the new keys and values are written into the cache (k rotated straight into it) and the queries
    attend over the cache's first position + S keys: the work grows with the length, not the capacity."""

    def __init__(
        self,
        q: Any,
        dim: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = False,
        out_bias: bool | None = None,
        dropout: float = 0.0,
        causal: bool = True,
        rope: RoPE | None = None,
        dtype: Any = "float32",
        generator: random.Generator | None = None,
    ):
        super().__init__()
        self.dim = shapes.size(dim, "MultiHeadAttention: dim", minimum=1)
        self.n_heads = shapes.size(n_heads, "MultiHeadAttention: n_heads", minimum=1)
        self.n_kv_heads = shapes.size(n_heads if n_kv_heads is None else n_kv_heads,
                                      "MultiHeadAttention: n_kv_heads", minimum=1)
        if self.n_heads % self.n_kv_heads:
            raise ShapeError(
                f"MultiHeadAttention: n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}"
            )
        if head_dim is None and self.dim % self.n_heads:
            raise ShapeError(
                f"MultiHeadAttention: dim={self.dim} is not divisible by n_heads={self.n_heads}; "
                "pass head_dim"
            )
        self.head_dim = shapes.size(self.dim // self.n_heads if head_dim is None else head_dim,
                                    "MultiHeadAttention: head_dim", minimum=1)
        if rope is not None and (not isinstance(rope, RoPE) or rope.head_dim != self.head_dim):
            raise ShapeError(
                f"MultiHeadAttention: rope must be a RoPE of head_dim {self.head_dim}, got {rope!r}"
            )
        self.dropout = _probability(dropout, "MultiHeadAttention: dropout")
        if self.dropout == 1.0:  # (refused here, not at the first training forward by flash_attention)
            raise ValueError("MultiHeadAttention: dropout must be in [0, 1), got 1.0: attention's "
                             "probabilities are rescaled by 1 / (1 - dropout)")
        self.causal = bool(causal)
        self.generator = generator
        self.rope = rope
        hq, hkv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.q_proj = Linear(q, self.dim, hq, bias=bias, dtype=dtype, generator=generator)
        self.k_proj = Linear(q, self.dim, hkv, bias=bias, dtype=dtype, generator=generator)
        self.v_proj = Linear(q, self.dim, hkv, bias=bias, dtype=dtype, generator=generator)
        self.o_proj = Linear(q, hq, self.dim, bias=bias if out_bias is None else out_bias, dtype=dtype,
                             generator=generator)
        self._qkv: LinearStack | None = None

    def stack_projections(self) -> None:
        """q, k and v as one matrix (LinearStack): an inference forward makes them one GEMM."""
        self._qkv = LinearStack([self.q_proj, self.k_proj, self.v_proj])

    def _moved(self, queue: Any, dtype: Any) -> None:
        if self._qkv is not None:  # the layers' new tensors stacked again (the old matrix is freed)
            self.stack_projections()

    def _heads(self, t: Node, b: int, s: int, heads: int) -> Node:
        return ag.permute(ag.reshape(t, (b, s, heads, self.head_dim)), (0, 2, 1, 3))

    def _check_cache(self, cache: Any, position: Any, b: int) -> None:
        want = (b, self.n_kv_heads, getattr(cache, "capacity", 0), self.head_dim)
        if not isinstance(cache, KVCache) or cache.shape != want:
            raise ShapeError(
                f"MultiHeadAttention: cache must be a KVCache of shape ({b}, {self.n_kv_heads}, "
                f"capacity, {self.head_dim}), got {cache!r}"
            )
        if position is None:
            raise ShapeError(
                "MultiHeadAttention: a cache needs position= (an int32 device Tensor holding "
                "how many tokens the cache already holds)"
            )

    def decode_phase(self, x: Node, qkv: Tensor, mask: Any, cache: KVCache, position: Tensor) -> Any:
        """The attention of a cached decode step whose q/k/v product `qkv` of x is made (the block before
        made it in its decode chain), as an ops.DecodePhase not yet launched (rope_cache_decode_phase: the
        rotations, the cache writes and the attention, forward(..., project=False, qkv=qkv)'s bits), for the
        block's decode chain to take as its first tiles (one row: batch 1, one position); None where that one
        launch is not what forward would make, or more rows."""
        stack = self._qkv
        if self.rope is None or (self.training and self.dropout > 0) or stack is None or ag.is_recording() \
                or not stack.intact():
            return None
        x = as_node(x)
        if x.ndim != 3 or x.shape[2] != self.dim:
            raise ShapeError(f"MultiHeadAttention: x must be (batch, positions, {self.dim}), got {x.shape}")
        b, s, _ = x.shape
        self._check_cache(cache, position, b)
        if b * s != 1:
            return None
        y = qkv.reshape(b, s, self.n_heads + 2 * self.n_kv_heads, self.head_dim).permute(0, 2, 1, 3)
        return ops.rope_cache_decode_phase(y, self.n_heads, self.rope.cos, self.rope.sin, cache.k, cache.v,
                                           position, self.rope.pairing, causal=self.causal,
                                           mask=mask.value if isinstance(mask, Node) else mask)

    def forward(self, x: Node, mask: Any = None, cache: KVCache | None = None, position: Tensor | None = None,
                kv_len: Tensor | None = None, residual: Node | None = None,
                norm: Module | None = None, project: bool = True, qkv: Tensor | None = None) -> Node:
        """x (B, S, dim) -> (B, S, dim) (+ residual, added in the output projection's epilogue); of norm(x)
        where a norm is given (an RMSNorm inside the q/k/v GEMV's prologue when decoding). project=False:
        the heads' outputs side by side (B, S, n_heads * head_dim), before the output projection (the
        block's decode chain makes that product itself). qkv: a decode step's (normalized) q/k/v product of
        x, already made (the block before made it in its decode chain: TransformerBlock.forward's `then`).

        mask: bool (True = attend) or additive float, broadcastable to (B, n_heads, S, keys) (keys: S, or
        the cache's capacity). cache/position: the cached path (see the class docstring); kv_len: the
        number of valid cache keys, position + S, when the caller computed it once for every layer."""
        x = as_node(x)
        if x.ndim != 3 or x.shape[2] != self.dim:
            raise ShapeError(f"MultiHeadAttention: x must be (batch, positions, {self.dim}), got {x.shape}")
        b, s, _ = x.shape
        if cache is not None:
            self._check_cache(cache, position, b)
        stack = self._qkv
        stacked = stack is not None and not ag.is_recording() and stack.intact()
        p = self.dropout if self.training else 0.0
        decoding = stacked and cache is not None and self.rope is not None and p == 0.0
        if qkv is not None and not decoding:
            raise ShapeError("MultiHeadAttention: qkv= is a cached decode step's product (stacked "
                             "projections, rope, a cache, no dropout, no gradient recording)")
        fused = _fused_norm(norm, x) if decoding and qkv is None else None
        if norm is not None and fused is None and qkv is None:
            x = norm(x)
        if decoding:
            # one GEMM (with the norm) for q, k and v; the rotations, the cache writes and the attention in
            # one launch where the decode kernel runs (else rope_qkv_cache, then the attention)
            heads = self.n_heads + 2 * self.n_kv_heads
            y = stack.product(x, fused) if qkv is None else qkv
            y = y.reshape(b, s, heads, self.head_dim).permute(0, 2, 1, 3)
            o, _ = ops.rope_cache_decode_attention(y, self.n_heads, self.rope.cos, self.rope.sin, cache.k,
                                                   cache.v, position, self.rope.pairing, causal=self.causal,
                                                   mask=mask.value if isinstance(mask, Node) else mask,
                                                   kv_len=kv_len)
            o = as_node(o)
        else:
            q, k, v = stack(x) if stacked else (self.q_proj(x), self.k_proj(x), self.v_proj(x))
            qh = self._heads(q, b, s, self.n_heads)
            kh = self._heads(k, b, s, self.n_kv_heads)
            vh = self._heads(v, b, s, self.n_kv_heads)
            if cache is None:
                if self.rope is not None:
                    qh, kh = self.rope(qh, position), self.rope(kh, position)
                keys, values, lengths = kh, vh, None
            else:
                if self.rope is not None:
                    qh = self.rope(qh, position)
                    self.rope.rotate_into(kh.value, cache.k, position)
                else:
                    ops.cache_write(cache.k, kh.value, position)
                ops.cache_write(cache.v, vh.value, position)
                keys, values = cache.k, cache.v
                lengths = kv_len if kv_len is not None else ops.add(position, s)
            gen = self.generator if self.generator is not None else random.default_generator
            o = ag.flash_attention(qh, keys, values, causal=self.causal, mask=mask, dropout_p=p,
                                   generator=gen, kv_len=lengths)
        o = ag.reshape(ag.permute(o, (0, 2, 1, 3)), (b, s, self.n_heads * self.head_dim))
        return _project(o, self.o_proj, residual) if project else o

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"head_dim={self.head_dim}, "
            f"causal={self.causal}, dropout={self.dropout}"
        )


class TransformerBlock(Module):
    """Pre-norm block: h = x + attn(attn_norm(x)); out = h + mlp(mlp_norm(h)), x (B, S, dim).

    norm: "rms" (RMSNorm) or "layer" (LayerNorm, with bias when `bias`); mlp: "swiglu" (Llama) or "gelu"
    (GPT-2, `activation`). bias: on the q/k/v projections and, unless out_bias says otherwise, the output
    projection (Qwen2: q/k/v biased, the output not); mlp_bias defaults to bias. With dropout > 0 in
    training, each branch's output is dropped before its residual add (which then runs as its own launch
    instead of in the GEMM's epilogue)."""

    def __init__(
        self,
        q: Any,
        dim: int,
        n_heads: int,
        hidden_dim: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        norm: str = "rms",
        mlp: str = "swiglu",
        norm_eps: float = 1e-5,
        bias: bool = False,
        mlp_bias: bool | None = None,
        activation: str = "gelu_tanh",
        rope: RoPE | None = None,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        causal: bool = True,
        dtype: Any = "float32",
        generator: random.Generator | None = None,
        out_bias: bool | None = None,
    ):
        super().__init__()
        if norm not in ("rms", "layer"):
            raise ValueError(f"TransformerBlock: norm must be 'rms' or 'layer', got {norm!r}")
        if mlp not in ("swiglu", "gelu"):
            raise ValueError(f"TransformerBlock: mlp must be 'swiglu' or 'gelu', got {mlp!r}")
        mlp_bias = bias if mlp_bias is None else mlp_bias
        self.dropout = _probability(dropout, "TransformerBlock: dropout")
        self.generator = generator

        def make_norm() -> Module:
            if norm == "rms":
                return RMSNorm(q, dim, eps=norm_eps, dtype=dtype)
            return LayerNorm(q, dim, eps=norm_eps, bias=True, dtype=dtype)

        self.attn_norm = make_norm()
        self.attn = MultiHeadAttention(q, dim, n_heads, n_kv_heads, head_dim, bias=bias, out_bias=out_bias,
                                       dropout=attn_dropout,
                                       causal=causal, rope=rope, dtype=dtype, generator=generator)
        self.mlp_norm = make_norm()
        if mlp == "swiglu":
            self.mlp = SwiGLU(q, dim, hidden_dim, bias=mlp_bias, dtype=dtype, generator=generator)
        else:
            self.mlp = GELUMLP(q, dim, hidden_dim, bias=mlp_bias, activation=activation, dtype=dtype,
                               generator=generator)

    def _drop(self, x: Node) -> Node:
        gen = self.generator if self.generator is not None else random.default_generator
        return ag.dropout(x, self.dropout, True, generator=gen)

    def forward(self, x: Node, mask: Any = None, cache: KVCache | None = None, position: Tensor | None = None,
                kv_len: Tensor | None = None, qkv: Tensor | None = None,
                then: TransformerBlock | None = None) -> Node | tuple[Node, Tensor | None]:
        """x (B, S, dim) -> (B, S, dim); mask, cache, position, kv_len as MultiHeadAttention's.

        A decode step through several blocks may pass each block the next one as `then`: where the block's
        decode chain fits (one row, half storage; _mlp_half_chain), the chain's last phase makes then's
        RMSNorm + q/k/v product as well, one launch a layer fewer. With `then` the call returns (output,
        that product or None), and the caller hands the product to `then` as qkv= (GPT.hidden does)."""
        x = as_node(x)
        if self.training and self.dropout > 0:
            if qkv is not None:
                raise ShapeError("TransformerBlock: qkv= is for a cached decode step, not training with "
                                 "dropout")
            h = x + self._drop(self.attn(self.attn_norm(x), mask, cache, position, kv_len))
            out: Node = h + self._drop(self.mlp(self.mlp_norm(h)))
            return out if then is None else (out, None)
        # the norms go in with their inputs: an RMSNorm runs in the next product's launch when decoding
        following = None
        if cache is not None and DECODE_CHAIN and not ag.is_recording():
            phase = None
            if qkv is not None and DECODE_ATTENTION_CHAIN:
                phase = self.attn.decode_phase(x, qkv, mask, cache, position)
            if phase is not None:
                o = as_node(phase.out.reshape(x.shape[0], x.shape[1], -1))
            else:
                o = self.attn(x, mask, cache, position, kv_len, norm=self.attn_norm, project=False, qkv=qkv)
            chained = self._mlp_half_chain(o, x, then, phase)
            if chained is not None:
                out, following = chained
            else:
                if phase is not None:
                    phase.launch()
                h = _project(o, self.attn.o_proj, x)
                out = self.mlp(h, residual=h, norm=self.mlp_norm)
        else:
            h = self.attn(x, mask, cache, position, kv_len, residual=x, norm=self.attn_norm, qkv=qkv)
            out = self.mlp(h, residual=h, norm=self.mlp_norm)
        return out if then is None else (out, following)

    def _qkv_step(self, a: int, x: Tensor) -> chain.ChainStep | None:
        """This block's RMSNorm + q/k/v product (a decode step's) as a chain step reading step `a`'s output
        (shaped and typed as x), where it has the bits of the launch it replaces; else None."""
        attn, norm = self.attn, self.attn_norm
        stack = attn._qkv
        if attn.rope is None or (attn.training and attn.dropout > 0) or stack is None or not stack.intact():
            return None
        if stack.bias is not None or stack.scale is not None or _fused_norm(norm, as_node(x)) is None:
            return None
        if not chain.rms_step_fits(x, stack.weight):
            return None
        return chain.ChainStep(a, stack.weight, norm=(norm.weight.value, norm.eps))

    def _mlp_half_chain(self, o: Node, x: Node, then: TransformerBlock | None = None,
                        attention: Any = None) -> tuple[Node, Tensor | None] | None:
        """A decode step's o-projection + residual, RMSNorm + gate/up + SwiGLU and down-projection + residual
        as one launch (ops.gemm.gemv_chain), where the three launches it replaces would be the gemv kernel's
        (ops.gemm.chain.mlp_half_fits: the same bits), with `then`'s RMSNorm + q/k/v product as a fourth step
        where that fits too: (output, then's product or None); else None, having launched nothing.
        attention: the DecodePhase that makes o (not launched yet), the launch's first tiles where it fits
        (chain.attention_fits), else launched before the chain."""
        ov, xv = o.value, x.value
        weights = self._mlp_half_weights(ov, xv)
        if weights is None:
            return None
        wo, gate_up, down, nw = weights
        dim = xv.shape[-1]
        steps = [
            chain.ChainStep(ov.reshape(1, ov.shape[-1]), wo, residual=xv.reshape(1, dim)),
            chain.ChainStep(0, gate_up, norm=(nw, self.mlp_norm.eps), glu=True),
            chain.ChainStep(1, down, residual=0),
        ]
        step = then._qkv_step(2, xv) if isinstance(then, TransformerBlock) else None
        if step is not None:
            steps.append(step)
        if attention is not None and not chain.attention_fits(attention, steps[0].a, max(dim, down.shape[1])):
            attention.launch()
            attention = None
        outs = chain.gemv_chain(steps, attention)
        return as_node(outs[2].reshape(xv.shape)), (outs[3] if step is not None else None)

    def _mlp_half_weights(self, o: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """(o-projection, stacked gate/up, down-projection, the MLP norm's weight) where a decode step's MLP
        half after the attention's rows o may be one chain with the three launches' bits
        (chain.mlp_half_fits: an RMSNorm, SwiGLU's stack intact, no biases or int8 scales); else None."""
        mlp, wo, norm = self.mlp, self.attn.o_proj, self.mlp_norm
        if not isinstance(mlp, SwiGLU) or not isinstance(norm, RMSNorm) or len(norm.normalized_shape) != 1:
            return None
        stack = mlp._gate_up
        if stack is None or not stack.intact() or stack.bias is not None or stack.scale is not None:
            return None
        if any(layer.bias is not None or layer.weight_scale is not None for layer in (wo, mlp.w2)):
            return None
        nw = norm.weight.value
        if nw.dtype != x.dtype or not chain.mlp_half_fits(o, x, wo.weight.value, stack.weight,
                                                          mlp.w2.weight.value):
            return None
        return wo.weight.value, stack.weight, mlp.w2.weight.value, nw

    def _decode_layer(self, x: Tensor, cache: KVCache) -> chain.DecodeLayer | None:
        """This block as a layer of chain.gemv_layers for a one-row decode step of x (1, 1, dim), where each
        of its phases there has the bits of this block's own decode: the q/k/v product as _qkv_step's, the
        MLP half as _mlp_half_chain's (the attention's rows laid out as x: n_heads * head_dim = dim); else
        None."""
        step = self._qkv_step(0, x)
        attn = self.attn
        if step is None or step.norm is None or attn.n_heads * attn.head_dim != attn.dim:
            return None
        weights = self._mlp_half_weights(x, x)
        if weights is None:
            return None
        wo, gate_up, down, nw = weights
        return chain.DecodeLayer(step.weight, step.norm[0], cache.k, cache.v, wo, nw, gate_up, down)


def decode_layers(blocks: list[TransformerBlock], x: Node, caches: list[KVCache], position: Tensor,
                  mask: Any = None) -> Node | None:
    """A cached decode step of one row (x (1, 1, dim), position as MultiHeadAttention's) through `blocks` as
    whole-layer launches (chain.gemv_layers: every layer in one launch where the device's argument space
    holds them): the last block's output, with the bits of the blocks run one by one (forward with `then`)
    and their caches written alike. None, having launched nothing, where that is not so: a block that does
    not fit (_decode_layer), blocks or caches that differ in shape, norms' eps, rotary tables or causality,
    a mask, a gradient recording, the attention not fitting the launch (the caller then runs the blocks)."""
    if not (DECODE_CHAIN and DECODE_ATTENTION_CHAIN and DECODE_LAYER_CHAIN) or mask is not None \
            or ag.is_recording() or not blocks or len(blocks) != len(caches):
        return None
    xv = as_node(x).value
    if xv.ndim != 3 or xv.shape[0] * xv.shape[1] != 1:
        return None
    first = blocks[0]
    attn, norms = first.attn, (first.attn_norm, first.mlp_norm)
    layers = []
    for block, cache in zip(blocks, caches):
        if not isinstance(block, TransformerBlock):
            return None
        block.attn._check_cache(cache, position, 1)
        other = block.attn
        if (cache.k.shape != caches[0].k.shape or cache.k.dtype != xv.dtype or other.rope is not attn.rope
                or other.causal != attn.causal or other.n_heads != attn.n_heads
                or other.n_kv_heads != attn.n_kv_heads or other.head_dim != attn.head_dim
                or not isinstance(block.attn_norm, RMSNorm) or not isinstance(block.mlp_norm, RMSNorm)
                or (block.attn_norm.eps, block.mlp_norm.eps) != (norms[0].eps, norms[1].eps)):
            return None
        layer = block._decode_layer(xv, cache)
        if layer is None or (layers and any(a.shape != b.shape for a, b in zip(
                (layer.qkv, layer.o, layer.gate_up, layer.down),
                (layers[0].qkv, layers[0].o, layers[0].gate_up, layers[0].down)))):
            return None
        layers.append(layer)
    rope, heads = attn.rope, attn.n_heads + 2 * attn.n_kv_heads

    def phase(qkv: Tensor, n: int) -> Any:
        y = qkv.reshape(1, 1, heads, attn.head_dim).permute(0, 2, 1, 3)
        return ops.rope_cache_decode_phase(y, attn.n_heads, rope.cos, rope.sin, caches[0].k, caches[0].v,
                                           position, rope.pairing, causal=attn.causal, layers=n)
    out = chain.gemv_layers(xv.reshape(1, xv.shape[-1]), layers, (norms[0].eps, norms[1].eps), phase)
    return None if out is None else as_node(out.reshape(xv.shape))


def padding_mask(mask: Any, batch: int, keys: int, queue: Any) -> Tensor:
    """A (B, S) padding mask (nonzero / True = a real token) as flash attention's bool (B, 1, 1, S)."""
    t = mask.value if isinstance(mask, Node) else mask
    if not isinstance(t, Tensor):
        t = Tensor.from_host(queue, np.asarray(t))
    if t.shape != (batch, keys):
        raise ShapeError(f"attention_mask must be (batch, positions) = ({batch}, {keys}), got {t.shape}")
    if t.dtype != dtypes.bool_:
        t = ops.ne(t, 0)
    return t.reshape(batch, 1, 1, keys)
