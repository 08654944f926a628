"""flash_attention on Nodes: streaming attention (netcl.ops.attention) with its backward rule beside it.

The forward keeps out and the log-sum-exp of each query row; the backward recomputes the probabilities
tile by tile (flash_attention_backward: a pass for dq, one for dk and dv, each skipped when no input it
feeds requires a gradient). Dropout's mask is regenerated from the forward's DropoutDraw. The mask and
kv_len are constants (no gradient flows to them).
"""

from __future__ import annotations

from typing import Any

from netcl.autograd import autocast
from netcl.autograd.engine import Node, as_node, needs_grad, record
from netcl.core.tensor import Tensor
from netcl.ops import attention as attn
from netcl.ops.random import Generator

__all__ = ["flash_attention"]


def _constant(x: Any) -> Any:
    return x.value if isinstance(x, Node) else x


def flash_attention(
    q: Node,
    k: Node,
    v: Node,
    *,
    causal: bool = False,
    scale: float | None = None,
    mask: Node | Tensor | None = None,
    dropout_p: float = 0.0,
    generator: Generator | None = None,
    kv_len: Tensor | None = None,
) -> Node:
    """softmax(q k^T * scale + mask) v on (B, Hq, Sq, D) queries and (B, Hkv, Sk, D) keys and values, as
    netcl.ops.flash_attention (its docstring has the options); gradients for whichever of q, k, v require
    them."""
    q, k, v = autocast.cast_inputs("flash_attention", as_node(q), as_node(k), as_node(v))
    mask, kv_len = _constant(mask), _constant(kv_len)
    draw = attn.DropoutDraw(generator) if dropout_p and dropout_p > 0 else None
    out, lse = attn.flash_attention_forward(q.value, k.value, v.value, causal=causal, scale=scale, mask=mask,
                                            dropout_p=dropout_p, kv_len=kv_len, dropout_draw=draw)
    if not needs_grad(q, k, v):
        return record(out, (q, k, v), None, "flash_attention")
    qv, kv, vv = q.value, k.value, v.value

    def backward(g: Tensor):
        dq, dk, dv = attn.flash_attention_backward(
            qv,
            kv,
            vv,
            out,
            lse,
            g,
            causal=causal,
            scale=scale,
            mask=mask,
            dropout_p=dropout_p,
            kv_len=kv_len,
            dropout_draw=draw,
            need_dq=q.requires_grad,
            need_dkv=k.requires_grad or v.requires_grad,
        )
        return dq, (dk if k.requires_grad else None), (dv if v.requires_grad else None)

    return record(out, (q, k, v), backward, "flash_attention")
