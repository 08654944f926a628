"""Chat fine-tuning in miniature: a GPT learns to answer in ChatML turns, trained on the assistant's tokens
only (ChatFormat's loss mask: system and user turns, headers and padding carry no loss and no gradient).

The dialogs are synthetic and built here (greetings, sums, word lengths, reversed words), so the example
runs offline in a minute or two on a CPU. Start from scratch (a small BPE trained on the dialogs) or from
a `netcl lm-train` run (its tokenizer reserves the ChatML tokens); the result is a model directory that
`netcl chat --checkpoint DIR` talks to:

    python examples/chat_finetune.py --out runs/chat-demo            # from scratch
    python examples/chat_finetune.py --init runs/lm --out runs/chat  # from a pretrained run
    netcl chat --checkpoint runs/chat-demo --temperature 0
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import netcl.autograd as ag  # noqa: E402
from netcl import optim  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.errors import NetclError  # noqa: E402
from netcl.models import GPT, GPTConfig  # noqa: E402
from netcl.ops import random  # noqa: E402
from netcl.text import BPETokenizer, ChatFormat  # noqa: E402
from netcl.train.lm import load_model_dir, open_device, stream_tokens  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ["apple", "river", "stone", "netcl", "kernel", "window", "orange", "tensor", "cloud", "garden",
         "python", "matrix", "signal", "planet", "bridge", "yellow"]
SYSTEM = "You are a concise assistant."
IGNORE = -100


def make_dialog(rng: np.random.Generator) -> list[dict[str, str]]:
    """One synthetic dialog: an optional system message, one to two user/assistant exchanges."""
    messages: list[dict[str, str]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": SYSTEM})
    for _ in range(int(rng.integers(1, 3))):
        kind = int(rng.integers(0, 4))
        if kind == 0:
            user, reply = (
                str(rng.choice(["hi", "hello", "hey there"])),
                "Hello! Ask me a sum or a word question.",
            )
        elif kind == 1:
            a, b = (int(v) for v in rng.integers(0, 10, size=2))
            user, reply = f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
        elif kind == 2:
            w = str(rng.choice(WORDS))
            user, reply = f"How many letters are in {w}?", f"{w} has {len(w)} letters."
        else:
            w = str(rng.choice(WORDS))
            user, reply = f"Reverse the word {w}.", f"{w} reversed is {w[::-1]}."
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return messages


def make_dialogs(count: int, seed: int = 0) -> list[list[dict[str, str]]]:
    rng = np.random.default_rng(seed)
    return [make_dialog(rng) for _ in range(count)]


def encode_examples(chat: ChatFormat, dialogs: list[list[dict[str, str]]], context: int,
                    pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids (N, context), targets (N, context)) int32: each dialog on its own row, padded with `pad_id`;
    a target is the next token where ChatFormat's mask trains it (assistant content and its end-of-turn
    token) and IGNORE everywhere else, so only assistant tokens contribute to the loss and its gradient."""
    ids_rows, target_rows = [], []
    for dialog in dialogs:
        ids, mask = chat.encode_dialog(dialog)
        if len(ids) > context + 1:
            raise ValueError(f"a dialog of {len(ids)} tokens does not fit the context of {context}")
        pad = context + 1 - len(ids)
        ids = np.asarray(ids + [pad_id] * pad, dtype=np.int32)
        mask = np.asarray(mask + [0] * pad, dtype=bool)
        ids_rows.append(ids[:-1])
        target_rows.append(np.where(mask[1:], ids[1:], IGNORE).astype(np.int32))
    return np.stack(ids_rows), np.stack(target_rows)


def assistant_loss(model: GPT, ids: Tensor, targets: Tensor) -> ag.Node:
    """Mean cross-entropy over the trained (non-IGNORE) targets."""
    return ag.cross_entropy(model(ids), ag.tensor(targets), ignore_index=IGNORE)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--init", default=None, help="a netcl lm-train run directory to start from (default: scratch)"
    )
    p.add_argument(
        "--out", default="runs/chat-demo", help="model directory to write (default runs/chat-demo)"
    )
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=None, help="default 3e-3 from scratch, 5e-4 from --init")
    p.add_argument("--dialogs", type=int, default=2000, help="synthetic training dialogs (default 2000)")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "dialogs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        p.error(f"--lr must be a finite number > 0, got {args.lr}")
    if args.seed < 0:
        p.error(f"--seed must be >= 0, got {args.seed}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        p.error(f"--out {out} is a file, not a directory")
    random.manual_seed(args.seed)
    dialogs = make_dialogs(args.dialogs, args.seed)
    try:
        if args.init is not None:
            model, tokenizer = load_model_dir(args.init, args.device, flag="--init")
            model.train()
        else:
            text = "\n".join(m["content"] for d in dialogs for m in d) + "\nuser\nassistant\nsystem\n"
            tokenizer = BPETokenizer.train(text, 512, special_tokens=SPECIALS, name="chat-demo")
            q = open_device(args.device).queue
            model = GPT(
                q, GPTConfig(vocab_size=tokenizer.n_vocab, dim=128, n_layers=2, n_heads=4, max_seq_len=96)
            )
        chat = ChatFormat(tokenizer, "chatml")
        context = int(model.config.max_seq_len)
        ids, targets = encode_examples(chat, dialogs, context, tokenizer.special_id("<|endoftext|>"))
    except (NetclError, ValueError) as exc:  # a bad --init or --device, a model whose context is too short
        p.error(str(exc))
    try:  # before training, not after
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        p.error(f"--out {out}: {exc.strerror or exc}")
    trained = int((targets != IGNORE).sum())
    print(f"{len(dialogs)} dialogs, {ids.size:,} token positions, {trained:,} of them assistant targets "
          f"(the loss and the gradient come from these only); model {model.num_parameters():,} parameters")
    opt = optim.AdamW(model.parameters(), lr=args.lr or (5e-4 if args.init else 3e-3), weight_decay=0.01)
    sched = optim.WarmupCosine(opt, warmup_steps=min(20, args.steps - 1), total_steps=args.steps)
    q = model.queue
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    for step in range(args.steps):
        rows = rng.integers(0, len(ids), size=args.batch_size)
        with ag.Tape() as tape:
            loss = assistant_loss(model, Tensor.from_host(q, ids[rows]), Tensor.from_host(q, targets[rows]))
        tape.backward(loss)
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        if (step + 1) % 50 == 0 or step + 1 == args.steps:
            print(f"step {step + 1}/{args.steps}: assistant loss {loss.value.to_host()[0]:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    model.save_pretrained(out)
    tokenizer.save_hf(out / "tokenizer.json")
    model.eval()
    stop = [tokenizer.special_id("<|im_end|>"), tokenizer.special_id("<|endoftext|>")]
    for question in ("What is 4 plus 3?", "How many letters are in garden?", "hello"):
        prompt, _ = chat.encode_dialog([{"role": "user", "content": question}], add_generation_prompt=True)
        reply = "".join(stream_tokens(model, tokenizer, prompt, 24, temperature=0.0, top_k=None, top_p=None,
                                      seed=0, stop=stop))
        print(f"user: {question}\nassistant: {reply}")
    print(f"wrote {out} (talk to it: netcl chat --checkpoint {out} --temperature 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
