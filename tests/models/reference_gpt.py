"""A float64 NumPy reference of netcl's transformer layers and GPT, written from the formulas (not from
netcl's code): the tests of netcl.nn.transformer and netcl.models compare against it."""

from __future__ import annotations

import math

import numpy as np


def rope(x: np.ndarray, positions: np.ndarray, base: float = 10000.0, pairing: str = "half") -> np.ndarray:
    """x (B, H, S, D) rotated at positions (B, S) (or (S,))."""
    b, h, s, d = x.shape
    pos = np.broadcast_to(np.asarray(positions, np.float64), (b, s))
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = pos[:, None, :, None] * inv  # (B, 1, S, D/2)
    c, sn = np.cos(ang), np.sin(ang)
    if pairing == "half":
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x1 * c - x2 * sn, x2 * c + x1 * sn], -1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x, dtype=np.float64)
    out[..., 0::2] = x1 * c - x2 * sn
    out[..., 1::2] = x2 * c + x1 * sn
    return out


def attention(q, k, v, causal=True, mask=None, kv_len=None):
    """softmax(q k^T / sqrt(D) + mask) v with GQA; causal bottom-right aligned over the first kv_len keys."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    k = np.repeat(k, hq // hkv, axis=1)
    v = np.repeat(v, hq // hkv, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    lengths = np.broadcast_to(np.asarray(sk if kv_len is None else kv_len), (b,))
    allowed = np.ones((b, 1, sq, sk), bool)
    for i in range(b):
        length = int(lengths[i])
        allowed[i, :, :, length:] = False
        if causal:
            allowed[i] &= np.arange(sk)[None, :] <= np.arange(sq)[:, None] + length - sq
    if mask is not None:
        if mask.dtype == bool:
            allowed = allowed & mask
        else:
            scores = scores + mask
    scores = np.where(allowed, scores, -np.inf)
    m = scores.max(-1, keepdims=True)
    e = np.where(allowed, np.exp(scores - np.where(np.isfinite(m), m, 0)), 0)
    denom = e.sum(-1, keepdims=True)
    p = np.where(denom > 0, e / np.where(denom > 0, denom, 1), 0)
    return p @ v


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def silu(x):
    return x / (1 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def linear(x, p, name):
    y = x @ p[name + ".weight"].T
    return y + p[name + ".bias"] if name + ".bias" in p else y


def sub(params: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def mha(x, p, n_heads, n_kv_heads, head_dim, positions=None, base=1e4, pairing="half", use_rope=True,
        causal=True, mask=None):
    b, s, _ = x.shape
    def heads(t, n):
        return t.reshape(b, s, n, head_dim).transpose(0, 2, 1, 3)
    q = heads(linear(x, p, "q_proj"), n_heads)
    k = heads(linear(x, p, "k_proj"), n_kv_heads)
    v = heads(linear(x, p, "v_proj"), n_kv_heads)
    if use_rope:
        pos = np.arange(s) if positions is None else positions
        q, k = rope(q, pos, base, pairing), rope(k, pos, base, pairing)
    o = attention(q, k, v, causal, mask).transpose(0, 2, 1, 3).reshape(b, s, n_heads * head_dim)
    return linear(o, p, "o_proj")


def block(
    x, p, arch, n_heads, n_kv_heads, head_dim, eps, base=1e4, pairing="half", mask=None, positions=None
):
    norm = (lambda t, n: rms_norm(t, p[n + ".weight"], eps)) if arch == "llama" else \
        (lambda t, n: layer_norm(t, p[n + ".weight"], p[n + ".bias"], eps))
    h = x + mha(
        norm(x, "attn_norm"),
        sub(p, "attn."),
        n_heads,
        n_kv_heads,
        head_dim,
        positions,
        base,
        pairing,
        use_rope=arch == "llama",
        mask=mask,
    )
    m = sub(p, "mlp.")
    y = norm(h, "mlp_norm")
    if arch == "llama":
        f = linear(silu(linear(y, m, "w1")) * linear(y, m, "w3"), m, "w2")
    else:
        f = linear(gelu_tanh(linear(y, m, "fc")), m, "proj")
    return h + f


def gpt_logits(ids, params, c, attention_mask=None):
    """logits (B, S, V) of netcl's GPT with state `params` (netcl names -> float64 arrays), config c."""
    ids = np.asarray(ids)
    b, s = ids.shape
    h = params["tok_embeddings.weight"][ids]
    if c.arch == "gpt2":
        h = h + params["pos_embeddings.weight"][np.arange(s)]
    mask = None if attention_mask is None else np.asarray(attention_mask, bool).reshape(b, 1, 1, s)
    for i in range(c.n_layers):
        h = block(h, sub(params, f"layers.{i}."), c.arch, c.n_heads, c.n_kv_heads, c.head_dim, c.norm_eps,
                  c.rope_base, c.rope_pairing, mask)
    h = rms_norm(h, params["norm.weight"], c.norm_eps) if c.arch == "llama" else \
        layer_norm(h, params["norm.weight"], params["norm.bias"], c.norm_eps)
    head = params["tok_embeddings.weight"] if c.tie_embeddings else params["lm_head.weight"]
    return h @ head.T


def cross_entropy(logits, targets, keep):
    """Mean over kept positions of -log softmax(logits)[target]."""
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    return -(picked * keep).sum() / keep.sum()
