"""What weight-only int8 costs in accuracy: the validation loss (and perplexity) of a trained GPT on the
standard-library corpus (netcl.train.corpus, the split `netcl lm-train` trained on) in float32, bfloat16,
int8 on float32 activations and int8 on bfloat16 ones, the same windows for all, with each variant's
decode speed at batch 1 on the same device.

    netcl lm-train --out runs/lm                       # or any run directory of lm-train
    python bench/quantization.py --checkpoint runs/lm [--windows 256] [--out bench/results/quantization.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netcl.core.device import manager  # noqa: E402
from netcl.models import GPT  # noqa: E402
from netcl.nn.layers import Linear  # noqa: E402
from netcl.train.corpus import build_corpus, validation_windows  # noqa: E402
from netcl.train.lm import validation_loss  # noqa: E402

VARIANTS = (("float32", "float32", False), ("bfloat16", "bfloat16", False), ("int8, float32 activations",
            "float32", True), ("int8, bfloat16 activations", "bfloat16", True))


def decode_rate(model: GPT, tokens: int) -> float:
    """Greedy tokens/s at batch 1 after the first token (a warm-up run first: programs, the recorded step)."""
    prompt = list(range(1, 9))
    list(model.generate(prompt, tokens, temperature=0))
    t0 = time.perf_counter()
    it = model.generate(prompt, tokens, temperature=0)
    next(it)
    t1 = time.perf_counter()
    for _ in it:
        pass
    return (tokens - 1) / (time.perf_counter() - t1) if t1 > t0 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a run directory of netcl lm-train")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--windows", type=int, default=256, help="validation windows (default 256)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=64, help="tokens per decode-speed run (default 64)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "quantization.json"))
    args = ap.parse_args()
    run = Path(args.checkpoint)
    if not (run / "config.json").is_file() or not (run / "tokenizer.json").is_file():
        ap.error(f"--checkpoint {run}: not a run directory of netcl lm-train (config.json, tokenizer.json)")
    q = manager.default(args.device).queue
    cfg = json.loads((run / "config.json").read_text())
    corpus = build_corpus(vocab_size=cfg["vocab_size"])  # the cached corpus lm-train tokenized
    context = cfg["max_position_embeddings"]
    windows = validation_windows(corpus.val, context, args.windows)
    rows = []
    for name, dtype, int8 in VARIANTS:
        model = GPT.from_pretrained(run, q, dtype=dtype)
        if int8:
            model.quantize_int8()
        linear = sum(m.weight.value.nbytes + (0 if m.weight_scale is None else m.weight_scale.nbytes)
                     for m in model.modules() if isinstance(m, Linear))
        loss = validation_loss(model, windows, args.batch_size)
        rows.append({"variant": name, "loss": loss, "perplexity": math.exp(loss), "linear_bytes": linear,
                     "decode_tokens_per_s": decode_rate(model, args.gen_tokens)})
    base = rows[0]["loss"]
    print(f"{run}: {windows.shape[0]} validation windows of {context} tokens ({windows[:, 1:].size:,} "
          f"targets), on {q.device.device_name}")
    print(f"{'':30} {'loss (nats)':>11} {'perplexity':>10} {'vs float32':>10} {'linear MB':>9} "
          f"{'decode tok/s':>12}")
    for r in rows:
        print(f"{r['variant']:30} {r['loss']:11.4f} {r['perplexity']:10.2f} {r['loss'] - base:+10.4f} "
              f"{r['linear_bytes'] / 1e6:9.2f} {r['decode_tokens_per_s']:12,.0f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"checkpoint": str(run), "windows": int(windows.shape[0]), "context": context,
                               "device": q.device.device_name, "rows": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
