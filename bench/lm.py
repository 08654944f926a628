"""GPT training and generation: netcl beside the same model in PyTorch (float32, eager), one run, one table.

Training: tokens/s of one optimizer step (forward, cross-entropy, backward, gradient clipping, AdamW) of a
Llama-style GPT: netcl's step recorded once and replayed (what `netcl lm-train` runs) and eager, PyTorch
eager. Generation: cached greedy decoding at batch 1, tokens/s after the first token (netcl's recorded
decode step, PyTorch with its own preallocated KV cache), and the time to the first token.

Both models start from the same weights: netcl's GPT is written with save_pretrained (Hugging Face's
names) and loaded into the PyTorch model below, which follows LlamaForCausalLM's computation.

    python bench/lm.py                    # CPU: the `small` preset (dim 128, 4 layers, context 128), PyTorch
    CPU
    python bench/lm.py --gpu              # GPU: the `25m` preset (dim 512, 8 layers, context 512), PyTorch
    CUDA,
                                          #      TF32 off
    python bench/lm.py --preset small --batch-size 8 --steps 5 --gen-tokens 32 --out bench/results/lm_cpu.json
    NETCL_DETERMINISTIC=0 python bench/lm.py --gpu   # the float-atomic fast paths (default: deterministic)
    python bench/lm.py --gpu --amp bfloat16 --torch-compile --skip-generation   # and PyTorch compiled
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import netcl  # noqa: E402
from netcl import profiling  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.errors import NetclError  # noqa: E402
from netcl.models import GPT, GPTConfig  # noqa: E402
from netcl.ops import random  # noqa: E402
from netcl.train.flags import int_at_least as at_least  # noqa: E402
from netcl.train.lm import PRESETS, LMStep, make_optimizer  # noqa: E402
from netcl.train.loop import MixedPrecision  # noqa: E402

VOCAB = 4096  # netcl lm-train's default corpus vocabulary
# Limits quoted against (FP32 TFLOP/s, copy TB/s): the H200 (cuBLAS FP32, the device copy bandwidth).
GPU_LIMITS = (51.0, 4.2)


# ------------------------------------------------------------------------------------------ the PyTorch peer
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin, cache=None, pos: int = 0):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:  # write at pos, attend over the pos + s keys so far
            ck, cv = cache
            ck[:, :, pos:pos + s] = k
            cv[:, :, pos:pos + s] = v
            k, v = ck[:, :, :pos + s], cv[:, :, :pos + s]
        group = self.heads // self.kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        if s == 1:
            out = F.scaled_dot_product_attention(q, k, v)
        elif cache is not None and pos > 0:
            mask = torch.ones(s, pos + s, dtype=torch.bool, device=x.device).tril(diagonal=pos)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        dim = cfg["hidden_size"]
        self.input_layernorm = RMSNorm(dim, cfg["rms_norm_eps"])
        self.self_attn = Attention(dim, cfg["num_attention_heads"], cfg["num_key_value_heads"],
                                   bool(cfg.get("attention_bias", False)))
        self.post_attention_layernorm = RMSNorm(dim, cfg["rms_norm_eps"])
        self.mlp = MLP(dim, cfg["intermediate_size"])

    def forward(self, x, cos, sin, cache=None, pos=0):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class TorchLlama(nn.Module):
    """LlamaForCausalLM's computation (RMSNorm, rotate-half RoPE, SwiGLU, GQA), SDPA attention."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        base = float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
        inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(cfg["max_position_embeddings"], dtype=torch.float64), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, ids: torch.Tensor, caches=None, pos: int = 0) -> torch.Tensor:
        s = ids.shape[1]
        cos, sin = self.cos[pos:pos + s], self.sin[pos:pos + s]
        x = self.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i], pos)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return x @ w.T

    def new_caches(self, batch: int, length: int):
        c = self.cfg
        shape = (batch, c["num_key_value_heads"], length, c["hidden_size"] // c["num_attention_heads"])
        dev = self.model.embed_tokens.weight.device
        return [(torch.zeros(shape, device=dev), torch.zeros(shape, device=dev)) for _ in self.model.layers]

    @torch.no_grad()
    def generate_greedy(self, ids: torch.Tensor, new_tokens: int, on_token=None) -> list[int]:
        """Prefill, then one token per step through the KV cache; each token read to the host (as a
        streaming generator must), on_token() called as it arrives."""
        caches = self.new_caches(ids.shape[0], ids.shape[1] + new_tokens)
        logits = self(ids, caches, 0)
        out = []
        token = logits[:, -1].argmax(-1, keepdim=True)
        pos = ids.shape[1]
        for _ in range(new_tokens):
            out.append(int(token.item()))
            if on_token is not None:
                on_token()
            if len(out) == new_tokens:
                break
            logits = self(token, caches, pos)
            pos += 1
            token = logits[:, -1].argmax(-1, keepdim=True)
        return out


def load_pretrained(directory: str | Path, device: str) -> TorchLlama:
    """The model of a Llama-style Hugging Face directory (config.json + model.safetensors), float32."""
    directory = Path(directory)
    cfg = json.loads((directory / "config.json").read_text())
    model = TorchLlama(cfg)
    state = load_file(str(directory / "model.safetensors"))
    if model.tied:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise KeyError(f"{directory}: missing {missing}, unexpected {unexpected}")
    return model.to(device).float()


def step_flops(cfg: dict, batch: int, context: int) -> float:
    """Forward + backward FLOPs of one training step: 6 per parameter per token for the matrices (the
    embedding gather excluded, the output projection included) + 12 L S d per token for attention
    (QK^T and PV, forward 4 L S d, backward twice that; causal halves what a kernel must do, not counted)."""
    d, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    kv = d // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * cfg["intermediate_size"]
    matrices = layers * per_layer + d * cfg["vocab_size"]
    tokens = batch * context
    return 6.0 * matrices * tokens + 12.0 * layers * context * d * tokens


# ------------------------------------------------------------------------------------------ measurements
def median(samples: list[float]) -> float:
    return statistics.median(samples)


def torch_train_step(model: TorchLlama, opt: torch.optim.Optimizer, batch: torch.Tensor,
                     amp: str | None = None, scaler: torch.amp.GradScaler | None = None) -> torch.Tensor:
    """One step; `amp`: the forward under torch.autocast in that dtype (float16 with `scaler`), as users
    write it."""
    device = batch.device.type
    with torch.autocast(device, dtype=getattr(torch, amp)) if amp else contextlib.nullcontext():
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
    else:
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def torch_optimizer(model: TorchLlama, weight_decay: float, lr: float) -> torch.optim.Optimizer:
    """lm-train's AdamW: decay on the matrices only, betas (0.9, 0.95)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), eps=1e-8)


def bench_training(q, net: GPT, peer: TorchLlama, tdev: str, batch: int, context: int, steps: int,
                   warmup: int, amp: str | None = None, compiled: bool = False) -> dict:
    """Median seconds per step, interleaved (netcl graph, netcl eager, PyTorch) so load shifts hit all.
    `amp`: netcl's step as `lm-train --amp` runs it, PyTorch's under torch.autocast (float16: both scale
    the loss). `compiled`: also PyTorch's step on a copy of the model made by `torch.compile(model)` (the
    usual one line; its first steps, the compilation, among the warm-up ones)."""
    sync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)
    settings = {"weight_decay": 0.1, "lr": 1e-4}
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, VOCAB, (batch, context + 1)).astype(np.int32) for _ in range(4)]
    # the first step's loss of both, from the same weights and batch: the two models compute the same thing
    mixed = MixedPrecision.make(amp) if amp else None
    eager = LMStep(net, make_optimizer(net, settings), 1.0, eager=True, mixed=mixed)
    t_opt = torch_optimizer(peer, settings["weight_decay"], settings["lr"])
    scaler = torch.amp.GradScaler(tdev) if amp == "float16" else None
    first_netcl = float(eager(batches[0]).to_host()[0])
    first_torch = float(torch_train_step(peer, t_opt, torch.from_numpy(batches[0]).long().to(tdev), amp,
                                         scaler).item())
    graphed = LMStep(net, eager.opt, 1.0, mixed=mixed)
    tbatches = [torch.from_numpy(b).long().to(tdev) for b in batches]
    times: dict[str, list[float]] = {"graph": [], "eager": [], "torch": []}
    if compiled:
        twin = copy.deepcopy(peer)
        fast = torch.compile(twin)
        fast_opt = torch_optimizer(twin, settings["weight_decay"], settings["lr"])
        fast_scaler = torch.amp.GradScaler(tdev) if amp == "float16" else None
        times["torch_compile"] = []
    for i in range(warmup + steps):
        b = batches[i % len(batches)]
        for name, run in (("graph", lambda b=b: graphed(b)), ("eager", lambda b=b: eager(b))):
            q.finish()
            t0 = time.perf_counter()
            run()
            q.finish()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
        sync()
        t0 = time.perf_counter()
        torch_train_step(peer, t_opt, tbatches[i % len(tbatches)], amp, scaler)
        sync()
        if i >= warmup:
            times["torch"].append(time.perf_counter() - t0)
        if compiled:
            t0 = time.perf_counter()
            torch_train_step(fast, fast_opt, tbatches[i % len(tbatches)], amp, fast_scaler)
            sync()
            if i >= warmup:
                times["torch_compile"].append(time.perf_counter() - t0)
    return {"first_loss_netcl": first_netcl, "first_loss_torch": first_torch,
            **{f"{k}_seconds": median(v) for k, v in times.items()}}


def profile_training(q, net: GPT, batch: int, context: int, top: int, amp: str | None = None) -> dict:
    """One eager training step under netcl.profiling.profile() (after an unprofiled one): device time by
    kernel and by op, the largest `top` of each printed; where a step's time goes."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, VOCAB, (batch, context + 1)).astype(np.int32)
    step = LMStep(net, make_optimizer(net, {"weight_decay": 0.1, "lr": 1e-4}), 1.0, eager=True,
                  mixed=MixedPrecision.make(amp) if amp else None)
    step(ids)
    q.finish()
    with profiling.profile() as prof:
        step(ids)
        q.finish()
    text = prof.report(by=("op", "kernel"), top=top, file=io.StringIO())
    return {"device_seconds": prof.device_seconds, "report": text,
            **{f"by_{by}": [r._asdict() for r in prof.rows(by)] for by in ("op", "kernel")}}


def bench_generation(net: GPT, peer: TorchLlama, tdev: str, prompt_len: int, new_tokens: int,
                     repeats: int) -> dict:
    """Greedy decoding at batch 1: (time to the first token, decode tokens/s after it) medians of both,
    and how many leading tokens the two agree on (same weights; float rounding may part them later)."""
    sync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)
    prompt = np.random.default_rng(1).integers(0, VOCAB, prompt_len).tolist()

    def netcl_run() -> tuple[float, float, list[int]]:
        t0 = time.perf_counter()
        tokens, t_first = [], 0.0
        for tok in net.generate(prompt, new_tokens, temperature=0.0):
            if not tokens:
                t_first = time.perf_counter() - t0
            tokens.append(int(tok))
        return t_first, time.perf_counter() - t0 - t_first, tokens

    def torch_run() -> tuple[float, float, list[int]]:
        ids = torch.tensor([prompt], device=tdev)
        sync()
        t0 = time.perf_counter()
        stamps: list[float] = []
        tokens = peer.generate_greedy(ids, new_tokens, on_token=lambda: stamps.append(time.perf_counter()))
        t_first = stamps[0] - t0
        return t_first, stamps[-1] - stamps[0], tokens

    # the same computation: the prompt's logits of both (greedy tokens of random weights, whose logits are
    # nearly flat, part ways at the first float rounding that reorders two of them)
    with torch.no_grad():
        ref = peer(torch.tensor([prompt], device=tdev))[0].double().cpu().numpy()
    mine = net.forward(np.asarray([prompt], np.int32)).value.to_host()[0].astype(np.float64)
    logit_error = float(np.abs(mine - ref).max() / np.abs(ref).max())
    runs: dict[str, list[tuple[float, float, list[int]]]] = {"netcl": [], "torch": []}
    netcl_run()
    torch_run()  # warm-up (netcl records its decode step here)
    for _ in range(repeats):
        runs["netcl"].append(netcl_run())
        runs["torch"].append(torch_run())
    a, b = runs["netcl"][0][2], runs["torch"][0][2]
    agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    out = {
        "agreeing_tokens": agree,
        "prompt_logits_max_relative_error": logit_error,
        "new_tokens": new_tokens,
        "prompt_tokens": prompt_len,
    }
    for name, rs in runs.items():
        out[f"{name}_first_token_seconds"] = median([r[0] for r in rs])
        out[f"{name}_decode_tokens_per_second"] = median([(new_tokens - 1) / r[1] for r in rs])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="netcl on the OpenCL GPU, PyTorch on CUDA (TF32 off)")
    ap.add_argument("--device", default=None, help="netcl device spec (default: gpu with --gpu, else auto)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="model and batch of `netcl lm-train --preset` (default: 25m with --gpu, else small)")
    ap.add_argument(
        "--batch-size", type=at_least(1), default=None, help="training batch (default: the preset's)"
    )
    ap.add_argument("--steps", type=at_least(1), default=10, help="timed training steps (default 10)")
    ap.add_argument("--warmup", type=at_least(0), default=3, help="untimed steps first (default 3)")
    ap.add_argument(
        "--prompt-tokens", type=at_least(1), default=16, help="generation prompt length (default 16)"
    )
    ap.add_argument("--gen-tokens", type=at_least(2), default=None,
                    help="tokens generated per run (default 256 on the GPU, 64 on the CPU)")
    ap.add_argument("--gen-repeats", type=at_least(1), default=3, help="generation runs (default 3)")
    ap.add_argument("--threads", type=at_least(1), default=2, help="PyTorch CPU threads (default 2)")
    ap.add_argument(
        "--profile",
        type=at_least(0),
        default=0,
        metavar="TOP",
        help="also profile one eager training step and print its TOP ops and kernels by device time",
    )
    ap.add_argument("--amp", choices=("bfloat16", "float16"), default=None,
                    help="the training rows in mixed precision: netcl as `lm-train --amp`, PyTorch under "
                    "torch.autocast (float16 with GradScaler on both)")
    ap.add_argument("--torch-compile", action="store_true",
                    help="also a training row of PyTorch's step with torch.compile(model) (the next anchor)")
    ap.add_argument("--skip-generation", action="store_true", help="the training rows only")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/lm[_gpu].json)")
    args = ap.parse_args()
    out = (
        Path(args.out)
        if args.out
        else Path(__file__).parent / "results" / f"lm{'_gpu' if args.gpu else ''}.json"
    )
    try:  # before minutes of measuring, not after
        out.parent.mkdir(parents=True, exist_ok=True)
        existed = out.exists()
        with open(out, "a"):  # writable (a directory or a read-only place fails here)
            pass
        if not existed:
            out.unlink()
    except OSError as exc:
        ap.error(f"--out {out}: {exc.strerror or exc}")
    preset = PRESETS[args.preset or ("25m" if args.gpu else "small")]
    batch = args.batch_size or preset["batch_size"]
    context = preset["context"]
    gen_tokens = args.gen_tokens or (256 if args.gpu else 64)
    if args.prompt_tokens + gen_tokens > context:
        ap.error(f"--prompt-tokens + --gen-tokens must fit the context of {context}")

    try:
        dev = manager.default(args.device or ("gpu" if args.gpu else "auto"))
    except NetclError as exc:
        ap.error(f"--device {args.device or 'gpu'}: {exc}")
    q = dev.queue
    tdev = "cuda" if args.gpu else "cpu"
    if tdev == "cuda" and not torch.cuda.is_available():
        ap.error("--gpu: PyTorch has no CUDA device here")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if tdev == "cpu":
        torch.set_num_threads(args.threads)
    random.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, dim=preset["dim"], n_layers=preset["layers"], n_heads=preset["heads"],
                    max_seq_len=context)
    net = GPT(q, cfg)
    with tempfile.TemporaryDirectory() as tmp:
        net.save_pretrained(tmp)
        hf_cfg = json.loads((Path(tmp) / "config.json").read_text())
        peer = load_pretrained(tmp, tdev)
    params = net.num_parameters()
    print(f"netcl on {dev.device_name} ({dev.backend}, deterministic {netcl.get_deterministic()}); PyTorch "
          f"{torch.__version__} on "
          f"{torch.cuda.get_device_name() if tdev == 'cuda' else f'CPU, {torch.get_num_threads()} threads'}")
    print(
        f"model: Llama-style GPT, {cfg.n_layers} layers, dim {cfg.dim}, {cfg.n_heads} heads, feed-forward "
        f"{cfg.hidden_dim}, vocabulary {VOCAB}, context {context}: "
        f"{params / 1e6:.2f}M parameters; training batch "
        f"{batch} x {context} tokens"
    )

    # generation first: training steps both models, netcl twice per round (recorded and eager), so their
    # weights differ afterwards
    gen = (None if args.skip_generation
           else bench_generation(net, peer, tdev, args.prompt_tokens, gen_tokens, args.gen_repeats))
    train = bench_training(q, net, peer, tdev, batch, context, args.steps, args.warmup, args.amp,
                           args.torch_compile)
    prof = profile_training(q, net, batch, context, args.profile, args.amp) if args.profile else None

    tokens = batch * context
    flops = step_flops(hf_cfg, batch, context)
    weight_bytes = 4.0 * params
    rows = []
    amp_name = f" ({args.amp} autocast)" if args.amp else ""
    for name, key in (("netcl, recorded step (lm-train)", "graph"), ("netcl, eager", "eager"),
                      ("PyTorch eager", "torch"), ("PyTorch torch.compile", "torch_compile")):
        if f"{key}_seconds" not in train:
            continue
        name += amp_name
        sec = train[f"{key}_seconds"]
        rate = f"{flops / sec / 1e12:7.2f} TFLOP/s" if args.gpu else f"{flops / sec / 1e9:7.2f} GFLOP/s"
        rows.append((f"train: {name}", f"{sec * 1e3:10.1f} ms", f"{tokens / sec:12,.0f} tok/s", rate,
                     f"{train['torch_seconds'] / sec:6.2f}x"))
    for name, key in (("netcl, recorded decode step", "netcl"), ("PyTorch eager, KV cache", "torch")):
        if gen is None:
            break
        rate = gen[f"{key}_decode_tokens_per_second"]
        rows.append((f"generate: {name}", f"{gen[f'{key}_first_token_seconds'] * 1e3:10.1f} ms",
                     f"{rate:12,.0f} tok/s", f"{rate * weight_bytes / 1e9:7.1f} GB/s",
                     f"{rate / gen['torch_decode_tokens_per_second']:6.2f}x"))
    print(f"\n{'':62} {'time':>13} {'throughput':>18} {'rate':>15} {'vs PyTorch':>10}")
    for r in rows:
        print(f"{r[0]:62} {r[1]:>13} {r[2]:>18} {r[3]:>15} {r[4]:>10}")
    print(
        f"(training time = one step; generation time = to the first token, prompt {args.prompt_tokens}, then "
        f"{gen_tokens - 1} decode steps; ratios: throughput over PyTorch's, above 1 = netcl faster)"
    )
    print(
        f"same model: first-step loss netcl {train['first_loss_netcl']:.6f}, PyTorch "
        f"{train['first_loss_torch']:.6f}"
        + ("" if gen is None else
           f"; prompt logits within {gen['prompt_logits_max_relative_error']:.1e} (relative to the largest); "
           f"greedy tokens agree for the first {gen['agreeing_tokens']} of {gen_tokens}")
    )
    print(
        f"limits: a training step is {flops / 1e12:.3f} TFLOP (6 per parameter per token + attention)"
        + (
            f", {flops / GPU_LIMITS[0] / 1e12 * 1e3:.1f} ms at {GPU_LIMITS[0]:.0f} TFLOP/s FP32"
            if args.gpu
            else ""
        )
        + f"; a decode step reads the {weight_bytes / 1e6:.0f} MB of weights"
        + (
            f", {weight_bytes / GPU_LIMITS[1] / 1e12 * 1e6:.0f} us at {GPU_LIMITS[1]} TB/s "
            f"({GPU_LIMITS[1] * 1e12 / weight_bytes:,.0f} tok/s)"
            if args.gpu
            else ""
        )
    )
    result = {
        "device": dev.device_name,
        "torch_device": tdev,
        "torch": torch.__version__,
        "host": platform.node(),
        "config": cfg.to_dict(),
        "parameters": params,
        "batch": batch,
        "context": context,
        "step_flops": flops,
        "torch_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "amp": args.amp,
        "deterministic": netcl.get_deterministic(),   # NETCL_DETERMINISTIC=0: the float-atomic paths
        "training": train,
        "generation": gen,
        "ratios": {
            "train_graph_vs_torch": train["torch_seconds"] / train["graph_seconds"],
            "train_eager_vs_torch": train["torch_seconds"] / train["eager_seconds"],
            **({} if "torch_compile_seconds" not in train else
               {"train_graph_vs_torch_compile": train["torch_compile_seconds"] / train["graph_seconds"]}),
            **({} if gen is None else {"decode_vs_torch": gen["netcl_decode_tokens_per_second"]
                                       / gen["torch_decode_tokens_per_second"]}),
        },
    }
    if prof is not None:
        result["profile"] = prof
        print(
            f"\none eager training step under netcl.profiling.profile(): {prof['device_seconds'] * 1e3:.1f} "
            f"ms of "
            f"device time\n{prof['report']}"
        )
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
