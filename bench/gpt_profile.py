"""Where a GPT's device time goes: one eager training step of netcl.models.GPT (forward, cross entropy,
backward, AdamW) under netcl.profiling, tables by kernel, op and module scope, beside the step's FLOP
count; then cached greedy decoding at batch 1 (tokens/s, and one run's kernels).

    python bench/gpt_profile.py                 # CPU: a small Llama-style GPT, batch 4 x 64
    python bench/gpt_profile.py --gpu           # GPU: lm-train's 25m preset (8 layers, dim 512), 32 x 512

bench/lm.py measures the same step beside PyTorch; this script says which kernels make up the difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import netcl.autograd as ag  # noqa: E402
from netcl import optim, profiling  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.models import GPT, GPTConfig  # noqa: E402
from netcl.ops.random import Generator  # noqa: E402

PRESETS = {
    # lm-train's 25m preset (bench/lm.py's GPU model)
    "gpu": dict(
        config=dict(vocab_size=4096, dim=512, n_layers=8, n_heads=8, hidden_dim=1376, max_seq_len=512),
        batch=32,
        seq=512,
    ),
    "cpu": dict(
        config=dict(vocab_size=1024, dim=128, n_layers=2, n_heads=4, max_seq_len=64), batch=4, seq=64
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--gpu", action="store_true", help="the GPU preset on the GPU (default: the CPU preset, CPU)"
    )
    ap.add_argument("--arch", choices=("llama", "gpt2"), default="llama")
    ap.add_argument("--warmup", type=int, default=2, help="steps before the profiled one")
    ap.add_argument("--top", type=int, default=25, help="rows per table")
    ap.add_argument("--gen-tokens", type=int, default=64, help="tokens per generation run")
    ap.add_argument("--out", default="bench/results/gpt_profile.json")
    args = ap.parse_args()

    device = manager.default("gpu" if args.gpu else "cpu")
    q = device.queue
    preset = PRESETS["gpu" if args.gpu else "cpu"]
    config = GPTConfig(arch=args.arch, **preset["config"])
    b, s = preset["batch"], preset["seq"]
    model = GPT(q, config, generator=Generator(0))
    opt = optim.AdamW(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    ids = Tensor.from_host(q, rng.integers(0, config.vocab_size, (b, s)).astype(np.int32))
    targets = Tensor.from_host(q, rng.integers(0, config.vocab_size, (b, s)).astype(np.int32))

    def step() -> float:
        opt.zero_grad()
        with ag.Tape() as tape:
            loss = model.loss(ids, targets)
        tape.backward(loss)
        opt.step()
        return float(loss.value.to_host()[0])

    for _ in range(args.warmup):
        step()
    q.finish()
    t0 = time.perf_counter()
    step()
    q.finish()
    wall = time.perf_counter() - t0
    with profiling.profile() as prof:
        step()
        q.finish()
    n_params = config.num_parameters()
    d, h = config.dim, config.n_heads
    flops = (
        6 * n_params * b * s + 12 * config.n_layers * b * s * s * d // 2
    )  # causal attention: half the S x S
    print(
        f"netcl on {device.device_name}: GPT {args.arch}, {n_params / 1e6:.2f}M parameters, "
        f"{config.n_layers} "
        f"layers, "
        f"dim {d}, {h} heads, batch {b} x {s}; one eager step {wall * 1e3:.1f} ms (unprofiled), "
        f"{flops / 1e12:.3f} TFLOP ({flops / wall / 1e12:.2f} TFLOP/s)"
    )
    text = prof.report(by=("kernel", "op", "scope"), top=args.top)

    # cached greedy decoding at batch 1: tokens/s after the first, and one profiled run's kernels
    prompt = rng.integers(0, config.vocab_size, 16).tolist()
    args.gen_tokens = min(args.gen_tokens, config.max_seq_len - len(prompt))
    list(model.generate(prompt, args.gen_tokens, temperature=0))  # records the decode step
    rates = []
    for _ in range(3):
        stamps = [time.perf_counter() for _ in model.generate(prompt, args.gen_tokens, temperature=0)]
        rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    rate = sorted(rates)[1]
    with profiling.profile() as gen_prof:
        list(model.generate(prompt, args.gen_tokens, temperature=0))
        q.finish()
    print(f"\ngenerate (batch 1, prompt 16, {args.gen_tokens} tokens): {rate:.0f} tokens/s after the first "
          f"(median of 3), {1e3 / rate:.2f} ms per decode step; one run's kernels:")
    gen_text = gen_prof.report(by=("kernel", "op"), top=args.top)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = {group: [list(map(_plain, r)) for r in prof.rows(group)[: args.top]] for group in ("kernel", "op")}
    out.write_text(json.dumps({"device": device.device_name, "config": config.to_dict(), "batch": b, "seq": s,
                               "step_seconds": wall, "step_flops": flops, "rows": rows, "report": text,
                               "decode_tokens_per_second": rate, "generate_report": gen_text}, indent=1))
    print(f"wrote {out}")


def _plain(v):
    return v if isinstance(v, (int, float, str)) or v is None else str(v)


if __name__ == "__main__":
    main()
