"""netcl.nn.transformer: RoPE, SwiGLU, GELUMLP, MultiHeadAttention (GQA, masks, KV cache), TransformerBlock,
forward against the float64 NumPy reference (tests/models/reference_gpt.py), backward by directional
derivatives of that reference (central differences in float64)."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import ops
from netcl.core.tensor import Tensor
from netcl.errors import ShapeError
from netcl.nn import GELUMLP, KVCache, MultiHeadAttention, RoPE, SwiGLU, TransformerBlock
from netcl.profiling import count_launches
from tests.models import reference_gpt as ref


def params_of(module) -> dict[str, np.ndarray]:
    return {k: v.to_host().astype(np.float64) for k, v in module.state_dict().items()}


def randomize(module, rng, scale=0.3):
    for p in module.parameters():
        p.value.copy_from_host(rng.standard_normal(p.shape) * scale)


def check_directional_grads(queue, module, forward, reference, x, rng, rtol=1e-6):
    """d/de of sum(w * f) along a random direction, for x and every parameter at once, from the tape and from
    central differences of the NumPy reference."""
    with ag.Tape() as tape:
        xn = ag.tensor(Tensor.from_host(queue, x), requires_grad=True)
        out = forward(xn)
    w = rng.standard_normal(out.shape)
    tape.backward(out, Tensor.from_host(queue, w))
    params = params_of(module)
    grads = {name: p.grad.to_host() for name, p in module.named_parameters()}
    assert set(grads) == set(params)
    dx = rng.standard_normal(x.shape)
    dp = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    analytic = float((xn.grad.to_host() * dx).sum()) + sum(float((grads[k] * dp[k]).sum()) for k in params)
    eps = 1e-6

    def f(sign):
        moved = {k: v + sign * eps * dp[k] for k, v in params.items()}
        return float((w * reference(x + sign * eps * dx, moved)).sum())

    numeric = (f(1) - f(-1)) / (2 * eps)
    assert abs(analytic - numeric) <= rtol * max(1.0, abs(numeric)), (analytic, numeric)
    for name, g in grads.items():  # every parameter gets a gradient that is not identically zero
        assert np.abs(g).max() > 0, name


def test_rope_module(queue, rng):
    rope = RoPE(queue, 8, 20, base=300.0, pairing="interleaved", dtype="float64")
    x = rng.standard_normal((2, 3, 4, 8))
    got = rope(ag.tensor(Tensor.from_host(queue, x)), Tensor.from_host(queue, np.array([5], np.int32)))
    np.testing.assert_allclose(
        got.value.to_host(), ref.rope(x, 5 + np.arange(4), 300.0, "interleaved"), atol=1e-12
    )
    assert rope.state_dict() == {} and rope.parameters() == []
    with pytest.raises(ValueError, match="pairing"):
        RoPE(queue, 8, 20, pairing="neox")


def test_swiglu_forward_backward_and_one_launch_gate(queue, rng):
    mlp = SwiGLU(queue, 6, 10, dtype="float64")
    randomize(mlp, rng)
    x = rng.standard_normal((2, 3, 6))
    p = params_of(mlp)

    def reference(xv, pv):
        return ref.linear(ref.silu(ref.linear(xv, pv, "w1")) * ref.linear(xv, pv, "w3"), pv, "w2")

    np.testing.assert_allclose(mlp(ag.tensor(Tensor.from_host(queue, x))).value.to_host(), reference(x, p),
                               rtol=1e-12, atol=1e-12)
    check_directional_grads(queue, mlp, lambda n: mlp(n), reference, x, rng)
    a, b = (Tensor.from_host(queue, rng.standard_normal((4, 10))) for _ in range(2))
    with count_launches() as launches:
        ag.silu_mul(ag.tensor(a), ag.tensor(b)).value.realize()
    assert launches.count == 1


def test_swiglu_residual_is_added_in_the_projection(queue, rng):
    mlp = SwiGLU(queue, 4, 8, bias=True, dtype="float64")
    randomize(mlp, rng)
    x = rng.standard_normal((3, 4))
    r = rng.standard_normal((3, 4))
    plain = mlp(ag.tensor(Tensor.from_host(queue, x))).value.to_host()
    with_res = mlp(ag.tensor(Tensor.from_host(queue, x)), residual=ag.tensor(Tensor.from_host(queue, r)))
    np.testing.assert_allclose(with_res.value.to_host(), plain + r, rtol=1e-12, atol=1e-12)


def test_gelu_mlp(queue, rng):
    mlp = GELUMLP(queue, 5, 7, dtype="float64")
    randomize(mlp, rng)
    x = rng.standard_normal((2, 5))

    def reference(xv, pv):
        return ref.linear(ref.gelu_tanh(ref.linear(xv, pv, "fc")), pv, "proj")

    np.testing.assert_allclose(mlp(ag.tensor(Tensor.from_host(queue, x))).value.to_host(),
                               reference(x, params_of(mlp)), rtol=1e-10, atol=1e-12)
    check_directional_grads(queue, mlp, lambda n: mlp(n), reference, x, rng)


@pytest.mark.parametrize("n_heads,n_kv_heads,use_rope,causal", [(4, 2, True, True), (3, 3, False, True),
                                                                 (4, 1, True, False)])
def test_attention_forward_backward(queue, rng, n_heads, n_kv_heads, use_rope, causal):
    d, hd, s = 12, 4, 7
    rope = RoPE(queue, hd, 16, dtype="float64") if use_rope else None
    attn = MultiHeadAttention(queue, d, n_heads, n_kv_heads, head_dim=hd, bias=True, causal=causal, rope=rope,
                              dtype="float64")
    randomize(attn, rng)
    x = rng.standard_normal((2, s, d))

    def reference(xv, pv):
        return ref.mha(xv, pv, n_heads, n_kv_heads, hd, use_rope=use_rope, causal=causal)

    got = attn(ag.tensor(Tensor.from_host(queue, x))).value.to_host()
    np.testing.assert_allclose(got, reference(x, params_of(attn)), rtol=1e-10, atol=1e-12)
    check_directional_grads(queue, attn, lambda n: attn(n), reference, x, rng)


@pytest.mark.parametrize("use_rope", [True, False])
def test_attention_heads_need_no_copies(queue, rng, monkeypatch, use_rope):
    """The heads are views of the projections (B, S, H, D) in and out: rope writes in its input's memory
    order, the attention's output and dq, dk, dv come in q's, k's and v's, so neither the output's reshape for
    the output projection nor the gradients' for the projections' backward copies (a strided copy each way
    a layer before), but for the fused float32 pass's dq below."""
    from netcl.ops import copy as copy_ops

    copies = []
    real = copy_ops.strided_copy
    monkeypatch.setattr(copy_ops, "strided_copy", lambda *a, **k: copies.append(a) or real(*a, **k))
    rope = RoPE(queue, 8, 16) if use_rope else None
    attn = MultiHeadAttention(queue, 32, 4, 2, causal=True, rope=rope)
    x = ag.tensor(Tensor.from_host(queue, rng.standard_normal((2, 9, 32)).astype(np.float32)))
    with ag.Tape() as tape:
        y = attn(x)
    tape.backward(y, Tensor.from_host(queue, rng.standard_normal((2, 9, 32)).astype(np.float32)))
    # but where float32's fused backward runs (a GPU): its dq, float atomic adds into a float32 buffer, is
    # contiguous, and without rope (whose backward writes in its input's order) dq's reshape copies
    from netcl.ops import attention as attn_ops

    q_, k_ = Tensor.empty(queue, (2, 4, 9, 8)), Tensor.empty(queue, (2, 2, 9, 8))
    pr = attn_ops._Problem("test", q_, k_, k_, True, None, None, 0.0, None)
    fused = pr.fused_backward() and not (pr.tf32_pass("dq") and pr.tf32_pass("dkdv"))   # (the TF32 units')
    assert len(copies) == (0 if use_rope or not fused else 1)
    assert all(p.grad is not None for p in attn.parameters())


def test_attention_padding_and_float_masks(queue, rng):
    d, h, s = 8, 2, 5
    attn = MultiHeadAttention(queue, d, h, rope=RoPE(queue, 4, 8, dtype="float64"), dtype="float64")
    randomize(attn, rng)
    x = rng.standard_normal((2, s, d))
    pad = np.ones((2, 1, 1, s), bool)
    pad[1, ..., 3:] = False
    bias = rng.standard_normal((1, h, s, s))
    p = params_of(attn)
    for mask in (pad, bias):
        got = attn(ag.tensor(Tensor.from_host(queue, x)), mask=Tensor.from_host(queue, mask)).value.to_host()
        np.testing.assert_allclose(got, ref.mha(x, p, h, h, 4, mask=mask), rtol=1e-10, atol=1e-12)


def test_attention_dropout_only_in_training(queue, rng):
    attn = MultiHeadAttention(queue, 8, 2, dropout=0.5, rope=RoPE(queue, 4, 8))
    x = Tensor.from_host(queue, rng.standard_normal((1, 6, 8)).astype(np.float32))
    attn.eval()
    a, b = attn(ag.tensor(x)).value.to_host(), attn(ag.tensor(x)).value.to_host()
    np.testing.assert_array_equal(a, b)
    attn.train()
    c = attn(ag.tensor(x)).value.to_host()
    assert not np.allclose(a, c)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_block_forward_backward(queue, rng, arch):
    d, h, kv, hd, hidden, s = 12, 4, 2, 3, 20, 6
    llama = arch == "llama"
    if llama:
        hd = 4
    rope = RoPE(queue, hd, 16, base=1000.0, dtype="float64") if llama else None
    block = TransformerBlock(
        queue,
        d,
        h,
        hidden,
        n_kv_heads=kv if llama else h,
        head_dim=hd,
        norm="rms" if llama else "layer",
        mlp="swiglu" if llama else "gelu",
        norm_eps=1e-5,
        bias=not llama,
        rope=rope,
        dtype="float64",
    )
    randomize(block, rng)
    for name, p in block.named_parameters():
        if "norm.weight" in name:
            p.value.copy_from_host(1 + 0.2 * rng.standard_normal(p.shape))
    x = rng.standard_normal((2, s, d))

    def reference(xv, pv):
        return ref.block(xv, pv, arch, h, kv if llama else h, hd, 1e-5, base=1000.0)

    got = block(ag.tensor(Tensor.from_host(queue, x))).value.to_host()
    np.testing.assert_allclose(got, reference(x, params_of(block)), rtol=1e-10, atol=1e-11)
    check_directional_grads(queue, block, lambda n: block(n), reference, x, rng)


def test_block_with_dropout_runs_the_residual_unfused(queue, rng):
    block = TransformerBlock(queue, 8, 2, 16, rope=RoPE(queue, 4, 8), dropout=0.3, attn_dropout=0.1)
    x = ag.tensor(
        Tensor.from_host(queue, rng.standard_normal((1, 4, 8)).astype(np.float32)), requires_grad=True
    )
    with ag.Tape() as tape:
        y = block(x)
    tape.backward(y, Tensor.ones(queue, y.shape))
    assert np.isfinite(x.grad.to_host()).all()
    block.eval()
    np.testing.assert_array_equal(block(x).value.to_host(), block(x).value.to_host())


@pytest.mark.parametrize("rotary", [True, False])
def test_cached_attention_matches_the_full_pass(queue, rng, rotary):
    """Prefill 4 tokens, then 1, then 2 at per-batch positions: the same outputs as one pass over all 7."""
    d, h, kv, hd = 12, 4, 2, 4
    rope = RoPE(queue, hd, 32, dtype="float64") if rotary else None
    block = TransformerBlock(queue, d, h, 16, n_kv_heads=kv, head_dim=hd, rope=rope, dtype="float64")
    randomize(block, rng)
    x = rng.standard_normal((2, 7, d))
    full = block(ag.tensor(Tensor.from_host(queue, x))).value.to_host()
    cache = KVCache(queue, 2, kv, 12, hd, "float64")
    position = Tensor.zeros(queue, (2,), np.int32)
    pieces = []
    for lo, hi in ((0, 4), (4, 5), (5, 7)):
        kv_len = ops.add(position, hi - lo).realize()
        pieces.append(block(ag.tensor(Tensor.from_host(queue, x[:, lo:hi])), cache=cache, position=position,
                            kv_len=kv_len).value.to_host())
        position.copy_(kv_len)
    np.testing.assert_allclose(np.concatenate(pieces, 1), full, rtol=1e-11, atol=1e-12)


def test_block_then_returns_the_next_blocks_product_or_none(queue, rng):
    """forward(then=next block) returns (output, next block's q/k/v product or None): None where the decode
    chain does not run (float64 here), with the output of the call without `then`."""
    d, h, kv, hd = 12, 4, 2, 4
    rope = RoPE(queue, hd, 32, dtype="float64")
    blocks = [TransformerBlock(queue, d, h, 16, n_kv_heads=kv, head_dim=hd, rope=rope, dtype="float64")
              for _ in range(2)]
    for b in blocks:
        randomize(b, rng)
        b.attn.stack_projections()
    x = Tensor.from_host(queue, rng.standard_normal((1, 1, d)))
    outs = []
    for then in (None, blocks[1]):
        cache = KVCache(queue, 1, kv, 8, hd, "float64")
        position = Tensor.zeros(queue, (1,), np.int32)
        got = blocks[0](ag.tensor(x), cache=cache, position=position, then=then)
        if then is not None:
            got, qkv = got
            assert qkv is None
        outs.append(got.value.to_host())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_attention_errors(queue):
    with pytest.raises(ShapeError, match="must divide"):
        MultiHeadAttention(queue, 12, 4, 3)
    with pytest.raises(ShapeError, match="not divisible"):
        MultiHeadAttention(queue, 10, 4)
    with pytest.raises(ShapeError, match="RoPE of head_dim 4"):
        MultiHeadAttention(queue, 8, 2, rope=RoPE(queue, 8, 4))
    # a dropout of 1 was taken, then the first training forward raised flash_attention's 'dropout_p' error
    for make in (lambda: MultiHeadAttention(queue, 8, 2, dropout=1.0),
                 lambda: TransformerBlock(queue, 8, 2, 16, attn_dropout=1)):
        with pytest.raises(ValueError, match=r"MultiHeadAttention: dropout must be in \[0, 1\), got 1.0"):
            make()
    attn = MultiHeadAttention(queue, 8, 2)
    with pytest.raises(ShapeError, match=r"\(batch, positions, 8\)"):
        attn(ag.tensor(Tensor.zeros(queue, (2, 3, 6))))
    with pytest.raises(ShapeError, match="position="):
        attn(ag.tensor(Tensor.zeros(queue, (1, 3, 8))), cache=KVCache(queue, 1, 2, 8, 4))
    with pytest.raises(ShapeError, match="KVCache of shape"):
        attn(ag.tensor(Tensor.zeros(queue, (1, 3, 8))), cache=KVCache(queue, 2, 2, 8, 4),
             position=Tensor.zeros(queue, (1,), np.int32))
    with pytest.raises(ShapeError, match="qkv= is a cached decode step's product"):
        attn(ag.tensor(Tensor.zeros(queue, (1, 1, 8))), qkv=Tensor.zeros(queue, (1, 24)))
    with pytest.raises(ValueError, match="norm"):
        TransformerBlock(queue, 8, 2, 16, norm="batch")
    with pytest.raises(ValueError, match="mlp"):
        TransformerBlock(queue, 8, 2, 16, mlp="moe")
    with pytest.raises(ValueError, match="activation"):
        GELUMLP(queue, 4, 8, activation="tanh")
