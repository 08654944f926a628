"""GPT: a decoder-only transformer, Llama-style or GPT-2 style, from the blocks of netcl.nn.transformer.

    model = GPT(q, GPTConfig(vocab_size=4096, dim=256, n_layers=4, n_heads=4, n_kv_heads=2))
    with ag.Tape() as tape:
        loss = model.loss(ids, targets)           # ids, targets: (B, S) int32 Tensors
    tape.backward(loss)
    for token in model.generate([1, 2, 3], max_new_tokens=20, temperature=0.8, top_p=0.9, seed=0):
        print(token)

Parameter names (state_dict): tok_embeddings.weight, pos_embeddings.weight (gpt2), layers.{i}.attn_norm.*,
layers.{i}.attn.{q,k,v,o}_proj.*, layers.{i}.mlp_norm.*, layers.{i}.mlp.{w1,w2,w3}.* (SwiGLU: gate, down,
up) or layers.{i}.mlp.{fc,proj}.* (GELU), norm.*, lm_head.weight (untied). Hugging Face naming is
netcl.models.huggingface's table.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl import ops
from netcl.autograd.engine import Node, as_node
from netcl.core import dtypes
from netcl.core.backend import as_queue
from netcl.core.tensor import Tensor
from netcl.errors import DTypeError, NetclError, ShapeError
from netcl.models import generation, huggingface
from netcl.models.config import GPTConfig
from netcl.nn import init
from netcl.nn.layers import Embedding, LayerNorm, Linear, ModuleList, RMSNorm
from netcl.nn.module import Module
from netcl.nn.transformer import KVCache, RoPE, TransformerBlock, decode_layers, padding_mask
from netcl.ops import random

INIT_STD = 0.02


class GPT(Module):
    """A stack of pre-norm TransformerBlocks between token embeddings and a language-model head.

    forward(ids (B, S) int) -> logits (B, S, vocab) as a Node (trainable through netcl.autograd);
    loss(ids, targets, loss_mask) -> mean cross entropy; generate(...) yields tokens as they come
    (prefill once, then one decode step per token over a KV cache, recorded once and replayed).
    Weights start as N(0, 0.02) (the residual projections o_proj and w2/proj N(0, 0.02 / sqrt(2
    n_layers)), GPT-2's and nanoGPT's scheme), biases at 0, norms at 1."""

    transient_attributes = ("_decoder",)   # the recorded decode step: a copy records its own

    def __init__(self, queue: Any, config: GPTConfig, generator: random.Generator | None = None):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT takes a GPTConfig, got {type(config).__name__}")
        if generator is not None and not isinstance(generator, random.Generator):
            raise TypeError(f"GPT: generator must be a netcl.ops.random.Generator, got "
                            f"{type(generator).__name__} {generator!r}: Generator({generator!r}), or "
                            "netcl.ops.random.manual_seed for the default one")
        q = as_queue(queue)
        c = config
        self.config = c
        self.queue = q
        dt = c.dtype
        self.tok_embeddings = Embedding(q, c.vocab_size, c.dim, dtype=dt)
        if c.arch == "gpt2":
            self.pos_embeddings = Embedding(q, c.max_seq_len, c.dim, dtype=dt)
        rope = RoPE(q, c.head_dim, c.max_seq_len, c.rope_base, c.rope_pairing, dt,
                    c.rope_scaling) if c.uses_rope else None
        norm = "rms" if c.arch == "llama" else "layer"
        mlp = "swiglu" if c.arch == "llama" else "gelu"
        self.layers = ModuleList(
            [
                TransformerBlock(
                    q,
                    c.dim,
                    c.n_heads,
                    c.hidden_dim,
                    c.n_kv_heads,
                    c.head_dim,
                    norm=norm,
                    mlp=mlp,
                    norm_eps=c.norm_eps,
                    bias=c.attn_bias,
                    out_bias=c.attn_out_bias,
                    mlp_bias=c.mlp_bias,
                    activation=c.activation,
                    rope=rope,
                    dropout=c.dropout,
                    attn_dropout=c.attn_dropout,
                    dtype=dt,
                    generator=generator,
                )
                for _ in range(c.n_layers)
            ]
        )
        self.norm = (
            RMSNorm(q, c.dim, c.norm_eps, dt) if norm == "rms" else LayerNorm(q, c.dim, c.norm_eps, dtype=dt)
        )
        if not c.tie_embeddings:
            self.lm_head = Linear(q, c.dim, c.vocab_size, bias=False, dtype=dt)
        self.generator = generator
        self._init_weights(generator)
        self._decoder: generation.DecodeState | None = None

    def _init_weights(self, generator: random.Generator | None) -> None:
        c = self.config
        residual_std = INIT_STD / math.sqrt(2 * c.n_layers)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.value = init.zeros(self.queue, p.shape, c.dtype)
            elif "norm" in name.split(".")[-2]:
                p.value = init.ones(self.queue, p.shape, c.dtype)
            else:
                std = (
                    residual_std
                    if name.endswith(("o_proj.weight", "mlp.w2.weight", "mlp.proj.weight"))
                    else INIT_STD
                )
                p.value = init.normal(self.queue, p.shape, std=std, dtype=c.dtype, generator=generator)

    def _moved(self, queue: Any, dtype: Any) -> None:
        """After Module.to: the model's queue or its config's dtype (the storage generation's caches take)
        follow the parameters, and the recorded decode step, which read the old buffers, is dropped."""
        if queue is not None:
            self.queue = queue
        if dtype is not None:
            self.config = dataclasses.replace(self.config, dtype=np.dtype(dtype).name)
        if self._decoder is not None:
            self._decoder.close()
            self._decoder = None

    # -- the forward pass ----------------------------------------------------------------------------------
    def _ids(self, ids: Any) -> Tensor:
        t = ids.value if isinstance(ids, Node) else ids
        if not isinstance(t, Tensor):
            arr = np.asarray(t)
            if arr.dtype.kind not in "iu":
                raise DTypeError(f"GPT: ids must be integers, got {arr.dtype}")
            t = Tensor.from_host(self.queue, arr.astype(np.int32))
        if t.dtype not in (dtypes.int32, dtypes.int64):
            raise DTypeError(f"GPT: ids must be an int32 or int64 Tensor, got {t.dtype}")
        if t.ndim != 2 or t.shape[1] == 0:
            raise ShapeError(f"GPT: ids must be (batch, positions) with at least one position, got {t.shape}")
        return t

    def hidden(self, ids: Any, attention_mask: Any = None, caches: list[KVCache] | None = None,
               position: Tensor | None = None, kv_len: Tensor | None = None,
               embedded: Tensor | None = None) -> Node:
        """The last block's output (B, S, dim), before the final norm. With caches and position (an int32
        device Tensor (1,) or (B,): the tokens already cached), ids are the next positions. embedded: ids'
        token embeddings (B, S, dim) already made (a decode step's, written by the sampling launch before
        it: ops.sample's embed=), used instead of looking them up."""
        c = self.config
        ids = self._ids(ids)
        b, s = ids.shape
        if caches is None and s > c.max_seq_len:
            raise ShapeError(f"GPT: {s} positions exceed the model's max_seq_len {c.max_seq_len}")
        if caches is not None and len(caches) != c.n_layers:
            raise ShapeError(f"GPT: {len(caches)} caches for {c.n_layers} layers")
        if caches is not None and attention_mask is not None:
            raise ShapeError("GPT: attention_mask is for the uncached forward (a cache holds no padding)")
        if embedded is None:
            h = ag.embedding(self.tok_embeddings.weight, ids)
        else:
            table = self.tok_embeddings.weight.value
            if not isinstance(embedded, Tensor) or embedded.shape != (b, s, c.dim) \
                    or embedded.dtype != table.dtype:
                raise ShapeError(f"GPT: embedded must be a {table.dtype} Tensor of shape {(b, s, c.dim)}, "
                                 f"got {getattr(embedded, 'dtype', None)} {getattr(embedded, 'shape', None)}")
            h = as_node(embedded)
        if c.arch == "gpt2":
            pos = ops.arange(self.queue, s, dtype=np.int32).reshape(1, s)
            if position is not None:
                pos = ops.add(pos, position.reshape(-1, 1))
            h = h + ag.embedding(self.pos_embeddings.weight, pos)
        if self.training and c.dropout > 0:
            h = ag.dropout(h, c.dropout, True, generator=self.generator or random.default_generator)
        mask = padding_mask(attention_mask, b, s, self.queue) if attention_mask is not None else None
        if caches is None:
            for layer in self.layers:
                h = layer(h, mask, None, position, kv_len)
            return h
        # a decode step: one row through whole-layer launches where the blocks fit them (decode_layers: they
        # read the position alone, so no kv_len is made for them); else each block's decode chain may make
        # the next block's normalized q/k/v product (TransformerBlock.forward's `then`), one launch a layer
        # fewer
        out = decode_layers(list(self.layers), h, caches, position, mask)
        if out is not None:
            return out
        if kv_len is None:
            kv_len = ops.add(position, s).realize()
        qkv, last = None, len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if i == last:
                h = layer(h, mask, caches[i], position, kv_len, qkv=qkv)
            else:
                h, qkv = layer(h, mask, caches[i], position, kv_len, qkv=qkv, then=self.layers[i + 1])
        return h

    def logits(self, hidden: Node) -> Node:
        """The final norm and the language-model head: (..., dim) -> (..., vocab). An RMSNorm outside a
        gradient recording runs in the head's launch (netcl.ops.rms_norm_linear: one launch a decode step)."""
        if isinstance(self.norm, RMSNorm) and self.norm.fusable(hidden):
            tied = self.config.tie_embeddings
            weight = self.tok_embeddings.weight.value if tied else self.lm_head.weight.value
            bias = None if tied or self.lm_head.bias is None else self.lm_head.bias.value
            scales = None if tied else self.lm_head.weight_scale
            return as_node(ops.rms_norm_linear(as_node(hidden).value, self.norm.weight.value, self.norm.eps,
                                               weight, bias, scales))
        h = self.norm(hidden)
        if self.config.tie_embeddings:
            return ag.linear(h, self.tok_embeddings.weight)
        return self.lm_head(h)

    def forward(self, ids: Any, attention_mask: Any = None) -> Node:
        """logits (B, S, vocab) of ids (B, S) (an int32/int64 Tensor or Node, or integers): position s
        predicts token s + 1. attention_mask (B, S) (nonzero = a real token) hides padding keys."""
        return self.logits(self.hidden(ids, attention_mask))

    def loss(self, ids: Any, targets: Any, loss_mask: Any = None, ignore_index: int = -100,
             attention_mask: Any = None) -> Node:
        """Mean cross entropy of forward(ids) against targets (B, S) over the positions that count:
        targets equal to ignore_index and, with loss_mask (B, S), positions where it is 0/False (a chat's
        user turns) count for nothing. A Node of shape (1,)."""
        logits = self.forward(ids, attention_mask)
        tgt = self._ids(targets)
        if tgt.shape != logits.shape[:2]:
            raise ShapeError(
                f"GPT.loss: targets of shape {tgt.shape} do not match ids of shape {logits.shape[:2]}"
            )
        if loss_mask is not None:
            m = loss_mask.value if isinstance(loss_mask, Node) else loss_mask
            if not isinstance(m, Tensor):
                m = Tensor.from_host(self.queue, np.asarray(m))
            if m.shape != tgt.shape:
                raise ShapeError(f"GPT.loss: loss_mask of shape {m.shape} does not match targets {tgt.shape}")
            tgt = ops.where(ops.ne(m, 0), tgt, ignore_index)
        return ag.cross_entropy(logits, tgt, ignore_index=ignore_index)

    # -- generation ----------------------------------------------------------------------------------------
    def generate(self, ids: Any, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, stop_tokens: Any = (),
                 use_graph: bool = True, **other: Any) -> Iterator[Any]:
        """Yield new tokens as they come: an int per step for a 1-D prompt (a list of ids), an int32 array
        (B,) per step for a batch: a (B, S) array, or a list of B prompts of any lengths (rows that already
        stopped show -1).

        The prompt is run once (prefill) into per-layer KV caches; each further token is one decode step
        whose attention covers only the tokens so far. With use_graph the decode step is recorded once
        (netcl.graph) and replayed; sampling runs on the device (netcl.ops.sample: the host reads only
        the chosen ids, never a logits row). temperature 0 is greedy; top_k / top_p filter as Hugging
        Face's warpers; seed makes sampling reproducible (None: drawn from netcl's default generator).
        Generation ends after max_new_tokens, or once every row produced one of stop_tokens (which is
        yielded). The prompt plus max_new_tokens must fit max_seq_len. Hugging Face's names (max_length,
        do_sample, eos_token_id, ...) are a TypeError that says netcl's."""
        if other:
            generation.refuse_other_arguments(other)
        return generation.generate(self, ids, max_new_tokens, temperature, top_k, top_p, seed, stop_tokens,
                                   use_graph)

    def quantize_int8(self) -> GPT:
        """Weight-only int8 for inference: every linear layer's weight (the attention and feed-forward
        projections, an untied lm_head; not the embedding table) as int8 with one float32 scale per output
        channel, dequantized on the fly (netcl.ops.linear_int8). Returns self."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.quantize_int8()
        return self.stack_projections()

    def stack_projections(self) -> GPT:
        """Each block's q, k and v projections (and SwiGLU's gate and up) as one matrix whose row blocks
        are the parameters (netcl.nn.LinearStack): inference then runs them as one GEMM, one launch instead
        of three (two) a layer in every decode step. from_pretrained and quantize_int8 do it; training is
        unchanged (the parameters are views, each updated in place). Returns self."""
        for block in self.layers:
            block.attn.stack_projections()
            if hasattr(block.mlp, "stack_projections"):
                block.mlp.stack_projections()
        return self

    # -- Hugging Face weights ------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, queue: Any, **overrides: Any) -> GPT:
        """A GPT from a local Hugging Face directory (config.json + model.safetensors, or shards with
        model.safetensors.index.json) of a LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or
        GPT2LMHeadModel (a sliding attention window caps max_seq_len at the window). `overrides` change config
        fields that do not change the weights' meaning (max_seq_len, dropout, rope_pairing: "interleaved"
        permutes the q/k projections to Meta's pairing, dtype: the weights' storage, "float32" (default),
        "bfloat16" or "float16", converted on the host once; half models compute in float32 on half
        storage). Unknown, missing or mis-shaped tensors raise PretrainedError listing all of them."""
        config, arrays = huggingface.load(path, overrides)
        with init.skipped():  # every parameter is loaded next (strict): no random fill of the model's size
            model = cls(queue, config)
        model.load_state_dict(arrays)
        return model.stack_projections()

    def save_pretrained(self, path: str | os.PathLike, max_shard_bytes: int | None = None) -> list[Path]:
        """Write config.json and model.safetensors (sharded with an index above max_shard_bytes) in Hugging
        Face's naming (GPT2LMHeadModel, Qwen2ForCausalLM for a Qwen2's biases, else LlamaForCausalLM), so
        transformers' AutoModelForCausalLM.from_pretrained(path) loads this model. Returns the paths
        written. A model after quantize_int8() is refused: its int8 weights and scales have no Hugging Face
        layout (save before quantizing, and quantize again after loading)."""
        if any(isinstance(m, Linear) and m.weight_scale is not None for m in self.modules()):
            raise NetclError(
                "save_pretrained: this model's linear weights are int8 (quantize_int8()), which a Hugging "
                "Face checkpoint cannot hold (transformers would read the int8 values as weights, and the "
                "scales would be lost). Save the model before quantizing it, and quantize after loading "
                "(GPT.from_pretrained(...).quantize_int8(), `netcl generate --int8`)")
        return huggingface.save(path, self.config, {k: v.to_host() for k, v in self.state_dict().items()},
                         max_shard_bytes)


__all__ = ["GPT", "GPTConfig"]
