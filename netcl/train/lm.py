"""`netcl lm-train`: train a small GPT on the Python standard library's source (netcl.train.corpus), with
progress bars, periodic validation loss, a loss-curve PNG, checkpoints, --resume and samples at the end;
`netcl generate` and `netcl chat`: stream text from a trained run's directory.

A run directory (runs/lm, runs/lm-2, ...) is also a model directory: config.json and model.safetensors in
Hugging Face's naming (GPT.save_pretrained), tokenizer.json (Hugging Face's format), plus the training
state (checkpoint.safetensors), metrics.json, curves.png and samples.txt.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from tqdm import tqdm

import netcl.autograd as ag
from netcl import distributed as dist
from netcl import optim
from netcl.core.tensor import Tensor
from netcl.distributed import launch
from netcl.errors import NetclError
from netcl.graph import Graph
from netcl.io import load_checkpoint, save_checkpoint
from netcl.io.checkpoint import read_checkpoint
from netcl.io.huggingface import WEIGHTS
from netcl.models import GPT, GPTConfig
from netcl.ops import random
from netcl.text import BPETokenizer, ChatFormat
from netcl.train import corpus as corpus_mod
from netcl.train import runs
from netcl.train.corpus import END_OF_TEXT, TokenWindows, build_corpus, validation_windows
from netcl.train.loop import MixedPrecision, add_amp_argument
from netcl.train.runs import open_device

DEFAULT_OUT = Path("runs/lm")
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINT_FILE = runs.CHECKPOINT_FILE

# Model and run sizes. 'small' trains on a 2-core CPU through PoCL in minutes; '25m' is the ~25M-parameter,
# context-512 model bench/lm.py measures on the GPU. Explicit flags override a preset's values.
PRESETS: dict[str, dict[str, Any]] = {
    "small": {"layers": 4, "heads": 4, "dim": 128, "context": 128, "batch_size": 16,
              "steps": 1500, "lr": 3e-3, "warmup": 100, "eval_every": 250},
    "25m": {"layers": 8, "heads": 8, "dim": 512, "context": 512, "batch_size": 32,
            "steps": 5000, "lr": 6e-4, "warmup": 200, "eval_every": 500},
}
# What a checkpoint records of its run and a resumed run keeps (flag name -> settings key).
RUN_SETTINGS = {
    "--preset": "preset",
    "--arch": "arch",
    "--layers": "layers",
    "--heads": "heads",
    "--kv-heads": "kv_heads",
    "--dim": "dim",
    "--context": "context",
    "--corpus": "corpus",
    "--vocab-size": "vocab_size",
    "--val-fraction": "val_fraction",
    "--batch-size": "batch_size",
    "--lr": "lr",
    "--min-lr": "min_lr",
    "--warmup": "warmup",
    "--weight-decay": "weight_decay",
    "--clip": "clip",
    "--seed": "seed",
    "--eval-windows": "eval_windows",
    "--nproc": "nproc",
}
DEFAULTS: dict[str, Any] = {
    "preset": "small",
    "arch": "llama",
    "corpus": None,
    "vocab_size": corpus_mod.DEFAULT_VOCAB,
    "val_fraction": corpus_mod.DEFAULT_VAL_FRACTION,
    "weight_decay": 0.1,
    "clip": 1.0,
    "seed": 0,
    "eval_windows": 64,
    "min_lr": None,
    "nproc": 1,
}
SAMPLE_PROMPTS = ("import", "def", "class", "    for")  # no trailing space: BPE words carry their leading one


# ---------------------------------------------------------------------------------------------- flags
def _int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be an integer <= {high}, got {value}")
        return value

    return parse


def _number(low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        below = value < low or (low_open and value == low)
        above = value > high or (high_open and value == high)
        if not math.isfinite(value) or below or above:
            lo = f"{'(' if low_open else '['}{low:g}"
            hi = f"{high:g}{')' if high_open else ']'}" if math.isfinite(high) else "inf)"
            raise argparse.ArgumentTypeError(f"must be a finite number in {lo}, {hi}, got {text}")
        return value

    return parse


_positive = _int_at_least(1)
_count = _int_at_least(0)


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", default="auto", help="auto, gpu, cpu, a name fragment or P:D (see netcl devices)"
    )


def _add_sampling(p: argparse.ArgumentParser, max_new: int) -> None:
    p.add_argument("--max-new-tokens", type=_positive, default=max_new,
                   help=f"tokens to generate at most (default {max_new}; never past the context window)")
    p.add_argument("--temperature", type=_number(0.0), default=0.8,
                   help="sampling temperature (default 0.8; 0 = greedy)")
    p.add_argument("--top-k", type=_positive, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=_number(0.0, 1.0, low_open=True), default=None,
                   help="sample among the most likely tokens whose probabilities sum to p (0 < p <= 1)")
    p.add_argument("--seed", type=_count, default=0, help="sampling seed (default 0)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("lm-train", help="train a small GPT on the Python standard library's source",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("model (a preset's values unless given)")
    g.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="small (default): 4 layers, dim 128, context 128, for a CPU; 25m: 8 layers, dim 512, "
                   "context 512 (~27M parameters), for a GPU")
    g.add_argument("--arch", choices=("llama", "gpt2"), default=None,
                   help="llama (default): RMSNorm, RoPE, SwiGLU; gpt2: LayerNorm, learned positions, GELU")
    g.add_argument("--layers", type=_positive, default=None, help="transformer blocks")
    g.add_argument("--heads", type=_positive, default=None, help="attention heads")
    g.add_argument("--kv-heads", type=_positive, default=None,
                   help="key/value heads (grouped-query attention; divides --heads; default --heads)")
    g.add_argument("--dim", type=_positive, default=None, help="model width (a multiple of --heads)")
    g.add_argument("--context", type=_int_at_least(2), default=None, help="context window in tokens")
    d = p.add_argument_group("data")
    d.add_argument("--corpus", default=None, type=runs.path_arg,
                   help="directory of .py files (default: this Python's standard library)")
    d.add_argument(
        "--vocab-size",
        type=_int_at_least(256 + len(corpus_mod.SPECIAL_TOKENS), 65535),
        default=None,
        help=f"BPE vocabulary trained on the corpus (default {corpus_mod.DEFAULT_VOCAB}; "
        "at most 65535: ids are cached as uint16)",
    )
    d.add_argument("--val-fraction", type=_number(0.0, 1.0, low_open=True, high_open=True), default=None,
                   help=f"share of files held out for validation (default {corpus_mod.DEFAULT_VAL_FRACTION})")
    d.add_argument(
        "--cache-dir", default=None, type=runs.path_arg,
        help="where token ids are cached (default NETCL_CACHE_DIR/corpus)"
    )
    t = p.add_argument_group("training")
    t.add_argument(
        "--steps",
        type=_positive,
        default=None,
        help="optimizer steps in all (with --resume: the checkpoint's; more stretches the schedule)",
    )
    t.add_argument("--batch-size", type=_positive, default=None, help="windows per step")
    t.add_argument("--lr", type=_number(0.0, low_open=True), default=None, help="peak learning rate")
    t.add_argument(
        "--min-lr", type=_number(0.0), default=None, help="learning rate at the end (default lr / 10)"
    )
    t.add_argument("--warmup", type=_count, default=None, help="linear warm-up steps (< --steps)")
    t.add_argument("--weight-decay", type=_number(0.0), default=None,
                   help="AdamW weight decay of the matrices (default 0.1; norms and biases get none)")
    t.add_argument("--clip", type=_number(0.0), default=None, help="gradient-norm clip (default 1; 0 = off)")
    t.add_argument("--seed", type=_count, default=None, help="initialisation and data seed (default 0)")
    t.add_argument("--eval-every", type=_positive, default=None,
                   help="steps between validation losses and checkpoints")
    t.add_argument("--eval-windows", type=_positive, default=None,
                   help="validation windows of --context tokens, spread over the held-out files (default 64)")
    t.add_argument("--samples", type=_count, default=len(SAMPLE_PROMPTS),
                   help=f"samples printed at the end (default {len(SAMPLE_PROMPTS)})")
    t.add_argument("--sample-tokens", type=_positive, default=100, help="tokens per sample (default 100)")
    _add_device(p)
    p.add_argument("--out", default=None, type=runs.path_arg,
                   help="run directory (default runs/lm, or runs/lm-2, -3, ... when it holds an earlier run)")
    p.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=None,
        metavar="CHECKPOINT",
        help="continue a run: from CHECKPOINT, from OUT/checkpoint.safetensors, or from the latest run "
        "under runs/; --steps may raise the total (the cosine schedule is stretched to it)",
    )
    p.add_argument(
        "--overwrite", action="store_true",
        help="replace an earlier run in OUT (without --out: in the default directory) instead of refusing"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars (plain lines)")
    add_amp_argument(p)
    p.add_argument("--nproc", type=_positive, default=None,
                   help="train with N processes, one device each (netcl.distributed; default 1): each takes "
                   "--batch-size windows of every step and gradients are averaged, the same as one process "
                   "with N x --batch-size; steps run eagerly; rank 0 logs and writes; a resumed run keeps it")
    p.add_argument("--eager", action="store_true",
                   help="run every step op by op (default: record the step once and replay it, netcl.graph)")
    p.set_defaults(func=run_train)

    gen = subparsers.add_parser(
        "generate", help="stream text from a trained GPT (netcl lm-train's run directory)"
    )
    gen.add_argument("--checkpoint", required=True, metavar="PATH",
                     help="a run or model directory, or its checkpoint.safetensors")
    gen.add_argument("--prompt", default="", help="text to continue (default: the start of a new file); "
                     "special-token text in it, such as <|endoftext|>, is that control token")
    _add_sampling(gen, 200)
    _add_device(gen)
    gen.set_defaults(func=run_generate)

    chat = subparsers.add_parser("chat", help="multi-turn terminal chat with a GPT through a chat template")
    chat.add_argument("--checkpoint", required=True, metavar="PATH",
                      help="a run or model directory, or its checkpoint.safetensors")
    chat.add_argument("--system", default=None, help="a system message that starts the dialog")
    chat.add_argument("--template", choices=("chatml", "llama3", "plain"), default="chatml",
                      help="chat template (default chatml; the tokenizer must have its special tokens)")
    _add_sampling(chat, 128)
    _add_device(chat)
    chat.set_defaults(func=run_chat)


# ---------------------------------------------------------------------------------------------- runs
def _plan_output(
    args: argparse.Namespace, log: Callable[[str], None]
) -> tuple[Path, Path | None, dict[str, Any]]:
    """(run directory, checkpoint to resume from or None, the settings that checkpoint recorded)."""
    runs.check_overwrite(args.resume, args.overwrite)
    if args.resume is None:
        if args.out is None and not args.overwrite:
            out = runs.fresh_default_out(DEFAULT_OUT)
            if out != DEFAULT_OUT:
                log(
                    f"{DEFAULT_OUT} holds an earlier run: this one "
                    f"goes to {out} (--resume continues the latest "
                    "run, --out picks a directory)"
                )
            return out, None, {}
        out = Path(args.out) if args.out is not None else DEFAULT_OUT  # --overwrite alone: the default's
        if runs.holds_run(out) and not args.overwrite:
            raise NetclError(f"--out {out} already holds a run; pass --resume to continue it, --overwrite to "
                             "replace it, or another --out")
        return out, None, {}
    if isinstance(args.resume, str):
        ckpt = Path(args.resume)
        if ckpt.is_dir():
            ckpt = ckpt / CHECKPOINT_FILE
    elif args.out is not None:
        ckpt = Path(args.out) / CHECKPOINT_FILE
    else:
        earlier = [r for r in runs.default_runs(DEFAULT_OUT) if (r / CHECKPOINT_FILE).exists()]
        if not earlier:
            raise NetclError(f"--resume: no earlier run under {DEFAULT_OUT.parent}/ to continue; run without "
                             "--resume first, or give the checkpoint's path")
        ckpt = earlier[-1] / CHECKPOINT_FILE
    if not ckpt.is_file():
        raise NetclError(f"--resume: no checkpoint at {ckpt}; run without --resume first")
    _, meta = read_checkpoint(ckpt)
    saved = dict(meta.get("extra", {}).get("args", {}))
    extra = meta.get("extra", {})
    if extra.get("kind") != "lm":
        by_train = extra.get("kind") == "train" or "dataset" in extra  # runs of netcl train before "kind"
        raise NetclError(f"--resume: {ckpt} was not written by netcl lm-train" + (
            " but by netcl train (an image classifier); continue it with "
            f"`netcl train --resume {ckpt.parent}`" if by_train else ""))
    saved["steps_done"] = int(meta.get("step", 0))
    return (Path(args.out) if args.out is not None else ckpt.parent), ckpt, saved


def _check_out(out: Path) -> None:
    """Refuse an --out that cannot become a directory before anything is built or written."""
    if out.exists() and not out.is_dir():
        raise NetclError(f"--out {out} is a file, not a directory; pick another --out")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NetclError(f"--out {out}: {parent} is a file, not a directory; pick another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise NetclError(f"--out {out}: no permission to write in {parent}; pick another --out")


def _settings(args: argparse.Namespace, saved: dict[str, Any]) -> dict[str, Any]:
    """The run's settings: given flags, else the resumed checkpoint's, else the preset's and the defaults.
    A resumed run keeps its settings: a flag that differs is an error naming it."""
    out: dict[str, Any] = {}
    for flag, key in RUN_SETTINGS.items():
        value = getattr(args, key)
        if key == "corpus" and value is not None:
            value = str(Path(value).resolve())
        if key in saved and value is not None and value != saved[key]:
            raise NetclError(
                f"{flag} {value} differs from the resumed run's {saved[key]}; a resumed run keeps "
                f"its settings (leave {flag} out, or start a new run)"
            )
        out[key] = value if value is not None else saved.get(key)
    preset = PRESETS[out["preset"] or DEFAULTS["preset"]]
    out["steps"] = args.steps or saved.get("steps") or preset["steps"]
    out["eval_every"] = args.eval_every or saved.get("eval_every") or min(preset["eval_every"], out["steps"])
    if out["warmup"] is None:  # the preset's warm-up, or a tenth of a shorter run
        out["warmup"] = min(preset["warmup"], out["steps"] // 10)
    for key in RUN_SETTINGS.values():
        if out[key] is None:
            out[key] = preset.get(key, DEFAULTS.get(key))
    out["preset"] = out["preset"] or DEFAULTS["preset"]
    if out["kv_heads"] is None:
        out["kv_heads"] = out["heads"]
    if out["min_lr"] is None:
        out["min_lr"] = out["lr"] / 10
    _check_settings(out)
    return out


def _check_settings(s: dict[str, Any]) -> None:
    if s["dim"] % s["heads"]:
        raise NetclError(f"--dim {s['dim']} is not a multiple of --heads {s['heads']}")
    if s["heads"] % s["kv_heads"]:
        raise NetclError(f"--kv-heads {s['kv_heads']} does not divide --heads {s['heads']}")
    if (
        s["arch"] == "gpt2" and s["kv_heads"] != s["heads"]
    ):  # its Hugging Face format has no grouped-query attention
        raise NetclError(
            f"--kv-heads {s['kv_heads']} with --arch gpt2: GPT-2 has one key/value head per query head; "
            "leave --kv-heads out or use --arch llama"
        )
    if s["arch"] == "llama" and (s["dim"] // s["heads"]) % 2:
        raise NetclError(
            f"head dimension {s['dim']} / {s['heads']} = {s['dim'] // s['heads']} is odd; rotary "
            "embeddings rotate pairs: pick --dim and --heads with an even quotient"
        )
    if s["warmup"] >= s["steps"]:
        raise NetclError(f"--warmup {s['warmup']} must be smaller than --steps {s['steps']}")
    if s["min_lr"] > s["lr"]:
        raise NetclError(f"--min-lr {s['min_lr']} is larger than --lr {s['lr']}")


def _model_config(s: dict[str, Any], vocab_size: int) -> GPTConfig:
    return GPTConfig(vocab_size=vocab_size, dim=s["dim"], n_layers=s["layers"], n_heads=s["heads"],
                     n_kv_heads=s["kv_heads"], max_seq_len=s["context"], arch=s["arch"])


# ---------------------------------------------------------------------------------------------- training
def make_optimizer(model: GPT, s: dict[str, Any]) -> optim.AdamW:
    """AdamW with weight decay on the matrices only (norm gains and biases are not decayed)."""
    decay = [p for p in model.parameters() if len(p.shape) >= 2]
    other = [p for p in model.parameters() if len(p.shape) < 2]
    groups = [{"params": decay, "weight_decay": s["weight_decay"]}]
    if other:
        groups.append({"params": other, "weight_decay": 0.0})
    return optim.AdamW(groups, lr=s["lr"], betas=(0.9, 0.95), eps=1e-8)


def lm_step(model: GPT, opt: optim.Optimizer, ids: Tensor, targets: Tensor, clip: float,
            mixed: MixedPrecision | None = None, ddp: dist.DistributedDataParallel | None = None) -> Tensor:
    """Forward, loss, backward, gradient clipping, AdamW; the loss Tensor (1,) without waiting for it.
    `mixed` (--amp): the forward under autocast; with float16 the loss is scaled, the gradients unscaled
    before clipping and a step with inf/NaN gradients skipped on the device (GradScaler). `ddp` (--nproc): the
    forward through it, so backward averages the gradients across the ranks (GPT.loss is forward + this)."""
    with mixed.autocast() if mixed is not None else contextlib.nullcontext(), ag.Tape() as tape:
        loss = model.loss(ids, targets) if ddp is None else ag.cross_entropy(ddp(ids), ag.tensor(targets))
    scaler = mixed.scaler if mixed is not None else None
    tape.backward(scaler.scale(loss) if scaler is not None else loss)
    if scaler is not None:
        scaler.unscale_(opt)  # clip the true gradients
    if clip > 0:
        optim.clip_grad_norm_(model.parameters(), clip)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad()
    return loss.value


class LMStep:
    """lm_step on a host batch (B, context + 1) of token ids: recorded (netcl.graph) on the first call and
    replayed on later ones with the new batch copied into the captured inputs, or op by op when eager.
    The scheduler is stepped by the caller, on the host (replays read the new learning rate)."""

    def __init__(self, model: GPT, opt: optim.Optimizer, clip: float, eager: bool = False,
                 mixed: MixedPrecision | None = None, ddp: dist.DistributedDataParallel | None = None):
        self.model, self.opt, self.clip, self.mixed, self.ddp = model, opt, clip, mixed, ddp
        self.eager = eager or ddp is not None  # DDP's all-reduce goes through the host: no recorded step
        self.graph: Graph | None = None
        self.ids: Tensor | None = None
        self.targets: Tensor | None = None
        self.loss: Tensor | None = None

    def __call__(self, batch: np.ndarray) -> Tensor:
        q = self.model.queue
        ids, targets = np.ascontiguousarray(batch[:, :-1]), np.ascontiguousarray(batch[:, 1:])
        if self.eager:
            return lm_step(
                self.model,
                self.opt,
                Tensor.from_host(q, ids),
                Tensor.from_host(q, targets),
                self.clip,
                self.mixed,
                self.ddp,
            )
        if self.graph is None:
            self.ids, self.targets = Tensor.from_host(q, ids), Tensor.from_host(q, targets)
            self.graph = Graph()
            with self.graph.capture():
                self.loss = lm_step(self.model, self.opt, self.ids, self.targets, self.clip, self.mixed)
        else:
            self.ids.copy_from_host(ids)
            self.targets.copy_from_host(targets)
            self.graph.replay()
        return self.loss.clone()  # the captured loss is overwritten by the next replay


@ag.no_grad()
def validation_loss(model: GPT, windows: np.ndarray, batch_size: int) -> float:
    """Mean next-token loss (nats) over every target of the fixed validation windows."""
    model.eval()
    q = model.queue
    total, count = 0.0, 0
    for start in range(0, len(windows), batch_size):
        chunk = windows[start:start + batch_size]
        ids = Tensor.from_host(q, np.ascontiguousarray(chunk[:, :-1]))
        targets = Tensor.from_host(q, np.ascontiguousarray(chunk[:, 1:]))
        loss = model.loss(ids, targets)
        total += float(loss.value.to_host()[0]) * targets.size
        count += targets.size
    model.train()
    return total / count


def plot_curves(history: dict[str, Any], info: dict[str, Any], path: Path, title: str) -> None:
    # matplotlib takes ~0.5 s to import: deferred to the end of a run (and the non-interactive backend set
    # before pyplot loads)
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(8, 4.5))
    losses = np.asarray(history["loss"])
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, lw=0.5, alpha=0.4, label="training (per step)")
    if len(losses) >= 20:
        k = max(len(losses) // 50, 5)
        ax.plot(steps[k - 1:], np.convolve(losses, np.ones(k) / k, mode="valid"), lw=1.5,
                label=f"training (mean of {k})")
    if history["val_loss"]:
        vs, vl = zip(*history["val_loss"])
        ax.plot(vs, vl, marker="o", lw=1.5, label="validation")
    ax.axhline(info["unigram_val_loss_nats"], ls="--", color="gray",
               label=f"unigram model on validation ({info['unigram_val_loss_nats']:.2f})")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # a short run's steps: 2, 4, 6, not 2.5
    ax.set_ylabel("loss (nats per token)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_train(args: argparse.Namespace) -> int:
    nproc = args.nproc or 1
    argv = list(getattr(args, "argv", None) or [])
    if nproc > 1 and args.out is None and args.resume is None:  # one fresh directory for all ranks
        argv += ["--out", str(DEFAULT_OUT if args.overwrite else runs.fresh_default_out(DEFAULT_OUT))]
    if nproc > 1:
        open_device(args.device)  # a bad --device: one error here, not one per rank
    code = launch.spawn_ranks(argv, nproc)  # --nproc N: this process starts N ranks of itself
    if code is not None:
        return code
    rank0 = launch.join(nproc)  # in a rank: join the job; rank 0 logs and writes
    rank = dist.rank() if nproc > 1 else 0
    args.no_progress = args.no_progress or not rank0

    def log(msg: str) -> None:
        if rank0:
            tqdm.write(msg) if not args.no_progress else print(msg, flush=True)

    out, resume_from, saved = _plan_output(args, log)
    if args.nproc is None and saved.get("nproc", 1) != 1:
        raise NetclError(
            f"the resumed run trained with --nproc {saved['nproc']}: pass --nproc {saved['nproc']} "
            "(a resumed run keeps its settings)"
        )
    s = _settings(args, saved)
    done = saved.get("steps_done", 0)
    if resume_from is not None and args.steps is not None and args.steps < done:
        raise NetclError(f"--steps {args.steps} is fewer than the {done} steps {resume_from} has already "
                         f"trained; a resumed run can only go further: pass --steps N (N > {done})")
    if resume_from is not None and done >= s["steps"]:
        log(f"{resume_from} has already trained {done} of {s['steps']} steps: nothing to do; pass --steps N "
            f"(N > {done}) to train further. Nothing was written.")
        return 0
    _check_out(out)
    dev = open_device(args.device)
    cache_dir = args.cache_dir or saved.get("cache_dir")  # where the run found its tokens (not a setting)
    corpus = build_corpus(s["corpus"], vocab_size=s["vocab_size"], val_fraction=s["val_fraction"],
                          cache_dir=cache_dir, log=log)
    log(corpus.summary())
    # one stream of global batches (nproc x batch_size windows); rank r takes rows [r B, (r + 1) B) of each
    windows = TokenWindows(corpus.train, s["batch_size"] * nproc, s["context"], seed=s["seed"])
    rows = slice(rank * s["batch_size"], (rank + 1) * s["batch_size"])
    val = validation_windows(corpus.val, s["context"], s["eval_windows"])
    q = dev.queue
    try:
        out.mkdir(parents=True, exist_ok=True) if rank0 else None
    except OSError as exc:
        raise NetclError(f"cannot create the output directory {out}: {exc.strerror or exc}") from None

    random.manual_seed(s["seed"])
    model = GPT(q, _model_config(s, corpus.tokenizer.n_vocab))
    opt = make_optimizer(model, s)
    sched = optim.WarmupCosine(opt, warmup_steps=s["warmup"], total_steps=s["steps"], eta_min=s["min_lr"])
    history: dict[str, Any] = {"loss": [], "val_loss": [], "tokens_per_second": []}
    start = 0
    if resume_from is not None:
        meta = load_checkpoint(resume_from, model, opt, sched, windows)
        start = int(meta["step"])
        history = meta["extra"].get("history", history)
        if sched.total_steps != s["steps"]:
            longer = "longer" if s["steps"] > sched.total_steps else "shorter"
            log(
                f"the schedule now spans {s['steps']} steps (it "
                f"spanned {sched.total_steps}): the learning rate "
                f"continues along the {longer} cosine"
            )
            sched.total_steps = s["steps"]
            sched.refresh()
        log(f"resumed from {resume_from} at step {start}, lr {opt.param_groups[0]['lr']:.3g}")
    tokens_per_step = s["batch_size"] * nproc * s["context"]
    ddp = dist.DistributedDataParallel(model) if nproc > 1 else None  # after a resume's load
    log(
        f"netcl lm-train: {s['arch']} GPT, {s['layers']} "
        f"layers, {s['heads']} heads ({s['kv_heads']} kv), dim "
        f"{s['dim']}, context {s['context']}: {model.num_parameters():,} parameters, on {dev.device_name} "
        f"({dev.backend}); batch {s['batch_size']}{f' x {nproc} processes' if nproc > 1 else ''} x "
        f"{s['context']} "
        f"tokens, {s['steps']} steps, AdamW lr {s['lr']:g} -> {s['min_lr']:g} (warm-up {s['warmup']}, "
        f"cosine), clip "
        f"{s['clip']:g}"
        + (", eager steps" if args.eager or ddp else ", step recorded once and replayed (--eager: op by op)")
        + "; "
        f"writing to {out}"
    )
    mixed = MixedPrecision.make(args.amp) if args.amp else None
    if mixed is not None:
        log(f"mixed precision: autocast {args.amp}{', dynamic loss scaling' if mixed.scaler else ''}")
        if mixed.scaler is not None and resume_from is not None and meta["extra"].get("grad_scaler"):
            mixed.scaler.load_state_dict(meta["extra"]["grad_scaler"])  # the loss scale it had reached
    step_fn = LMStep(model, opt, s["clip"], eager=args.eager, mixed=mixed, ddp=ddp)
    tokenizer = corpus.tokenizer
    run_args = {key: s[key] for key in RUN_SETTINGS.values()}
    run_args.update(steps=s["steps"], eval_every=s["eval_every"], cache_dir=cache_dir)
    written: list[Path] = []

    def checkpoint(step: int) -> None:
        if not rank0:
            return
        save_checkpoint(
            out / CHECKPOINT_FILE,
            model,
            opt,
            sched,
            step=step,
            loader=windows,
            extra={
                "kind": "lm",
                "history": history,
                "args": run_args,
                "corpus": corpus.info,
                **({"grad_scaler": mixed.scaler.state_dict()} if mixed and mixed.scaler else {}),
            },
        )
        model_files = model.save_pretrained(out)  # model.safetensors and config.json
        tokenizer.save_hf(out / TOKENIZER_FILE)
        for p in (out / CHECKPOINT_FILE, *model_files, out / TOKENIZER_FILE):
            if p not in written:
                written.append(p)

    bar = tqdm(total=s["steps"], initial=start, desc="lm-train", unit="step", disable=args.no_progress,
               file=sys.stderr, dynamic_ncols=True)
    pending: list[Tensor] = []
    t0, last_t, last_step = time.perf_counter(), time.perf_counter(), start
    report_every = 10
    try:
        for step in range(start, s["steps"]):
            pending.append(step_fn(windows.next_batch()[rows]))
            sched.step()
            n = step + 1
            if n % report_every == 0 or n % s["eval_every"] == 0 or n == s["steps"]:
                values = [float(t.to_host()[0]) for t in pending]
                pending.clear()
                if nproc > 1:  # the loss of the global batch: the mean of the ranks' (equal batch sizes)
                    merged = np.asarray(values, np.float64)
                    dist.all_reduce(merged, op="mean")
                    values = merged.tolist()
                if not all(math.isfinite(v) for v in values):
                    raise NetclError(f"the training loss became {values[-1]} at step {n}; try a lower --lr")
                history["loss"].extend(values)
                now = time.perf_counter()
                rate = (n - last_step) * tokens_per_step / max(now - last_t, 1e-9)
                last_t, last_step = now, n
                history["tokens_per_second"].append(rate)
                bar.update(len(values))
                bar.set_postfix(
                    loss=f"{values[-1]:.3f}", tok_s=f"{rate:,.0f}", lr=f"{opt.param_groups[0]['lr']:.2g}"
                )
                if args.no_progress and n % (report_every * 10) == 0:
                    log(f"step {n}/{s['steps']}: loss {values[-1]:.4f}, {rate:,.0f} tokens/s")
            if n % s["eval_every"] == 0 or n == s["steps"]:
                vloss = validation_loss(model, val, s["batch_size"])
                history["val_loss"].append((n, vloss))
                log(f"step {n}: validation loss {vloss:.4f} nats ({vloss / math.log(2):.3f} bits) per token; "
                    f"a unigram model's: {corpus.info['unigram_val_loss_nats']:.4f}")
                checkpoint(n)
    except KeyboardInterrupt:  # Ctrl-C: the last checkpoint stays; say how to go on
        bar.close()
        last = history["val_loss"][-1][0] if history["val_loss"] else None
        log(
            "interrupted; "
            + (
                f"{out / CHECKPOINT_FILE} holds step {last}: `netcl lm-train --resume {out}` "
                "continues from there"
                if last is not None
                else "no checkpoint was written yet"
            )
        )
        return 130
    bar.close()
    seconds = time.perf_counter() - t0
    if not rank0:
        return 0
    plot = out / "curves.png"
    plot_curves(history, corpus.info, plot, f"netcl {s['arch']} GPT ({model.num_parameters() / 1e6:.1f}M) on "
                f"{Path(corpus.info['source']).name}")
    written.append(plot)
    samples = []
    for i, prompt in enumerate((SAMPLE_PROMPTS * (1 + args.samples // len(SAMPLE_PROMPTS)))[:args.samples]):
        ids = tokenizer.encode(prompt)
        budget = min(
            args.sample_tokens, s["context"] - len(ids)
        )  # the prompt and the sample share the context
        if budget < 1:
            log(f"--- sample {i + 1}: the prompt {prompt!r} ({len(ids)} tokens) fills the context of "
                f"{s['context']}; skipped ---")
            continue
        text = prompt + "".join(
            stream_tokens(
                model,
                tokenizer,
                ids,
                budget,
                temperature=0.8,
                top_k=40,
                top_p=None,
                seed=s["seed"] + i,
                stop=[tokenizer.special_id(END_OF_TEXT)],
            )
        )
        samples.append(text)
        log(f"--- sample {i + 1} (prompt {prompt!r}, temperature 0.8, top-k 40) ---\n{text}")
    if samples:
        (out / "samples.txt").write_text(
            "".join(f"--- sample {i + 1} ---\n{t}\n" for i, t in enumerate(samples))
        )
        written.append(out / "samples.txt")
    final_val = history["val_loss"][-1][1]
    metrics = {
        "settings": run_args,
        "parameters": model.num_parameters(),
        "amp": args.amp,
        "processes": nproc,
        "device": dev.device_name,
        "corpus": {k: v for k, v in corpus.info.items() if k != "val_file_names"},
        "final_val_loss_nats": final_val,
        "val_loss": history["val_loss"],
        "unigram_val_loss_nats": corpus.info["unigram_val_loss_nats"],
        "unigram_entropy_nats": corpus.info["unigram_entropy_nats"],
        "seconds_this_session": seconds,
        "tokens_per_second_median": float(np.median(history["tokens_per_second"])),
        "samples": samples,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    written.append(out / "metrics.json")
    log(
        f"validation loss {final_val:.4f} nats per token against "
        f"{corpus.info['unigram_val_loss_nats']:.4f} for a "
        f"unigram model (entropy of the training tokens {corpus.info['unigram_entropy_nats']:.4f})"
    )
    log("\n".join(f"wrote {p}" for p in written))
    return 0


# ---------------------------------------------------------------------------------------------- generation
def stream_tokens(model: GPT, tokenizer: BPETokenizer, ids: list[int], max_new_tokens: int, *,
                  temperature: float, top_k: int | None, top_p: float | None, seed: int,
                  stop: Iterable[int] = ()) -> Iterable[str]:
    """Text pieces as the model generates tokens after `ids`, decoded incrementally (a character split
    across tokens comes out whole, with the token that completes it); stop tokens end it unprinted."""
    stop = set(stop)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for token in model.generate(list(ids), max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                seed=seed, stop_tokens=tuple(stop)):
        token = int(token)
        if token in stop:
            break
        piece = decoder.decode(tokenizer.decode_bytes([token]))
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def load_model_dir(directory: str, device: str, flag: str = "--checkpoint") -> tuple[GPT, BPETokenizer]:
    """The GPT and tokenizer of a run or model directory (config.json, model.safetensors, tokenizer.json), or
    of a .safetensors file in one: its weights (model.safetensors, a shard) or lm-train's
    checkpoint.safetensors, whose own weights are then loaded. Errors name the command-line `flag`."""
    path = Path(directory)
    checkpoint = None
    if path.is_file():
        if path.suffix != ".safetensors":
            raise NetclError(f"{flag} {path} is neither a directory nor a .safetensors file: give a run or "
                             "model directory, or its checkpoint.safetensors")
        if not (path.name == WEIGHTS or path.name.startswith("model-")):
            checkpoint = path  # a training checkpoint: the model comes from the directory around it
        path = path.parent
    elif not path.is_dir():
        raise NetclError(f"{flag} {path}: no such directory or file")
    missing = [n for n in ("config.json", TOKENIZER_FILE) if not (path / n).is_file()]
    if missing:
        raise NetclError(f"{flag} {path} has no {' or '.join(missing)}: a model directory holds "
                         "config.json, the weights and tokenizer.json (netcl lm-train writes them)")
    if checkpoint is not None and read_checkpoint(checkpoint)[1].get("extra", {}).get("kind") != "lm":
        raise NetclError(f"{flag} {checkpoint} is not a checkpoint of netcl lm-train; give the directory "
                         f"{path} for its model.safetensors")
    tokenizer = BPETokenizer.from_hf(path / TOKENIZER_FILE)
    model = GPT.from_pretrained(path, open_device(device).queue)
    if checkpoint is not None:
        load_checkpoint(checkpoint, model, restore_rng=False)
    model.eval()
    return model, tokenizer


def _context(model: GPT) -> int:
    return int(model.config.max_seq_len)


def run_generate(args: argparse.Namespace) -> int:
    model, tokenizer = load_model_dir(args.checkpoint, args.device)
    eot = tokenizer.special_tokens.get(END_OF_TEXT)
    # the prompt is the model's raw input: special-token text in it (<|endoftext|>, a hand-written
    # <|im_start|>) is the control token, as the model saw it in training, not an error
    ids = tokenizer.encode(args.prompt, allowed_special="all") if args.prompt else ([eot] if eot is not None
                                                                                   else [])
    if not ids:
        raise NetclError(
            "--prompt is empty and the tokenizer has no <|endoftext|> token to start from; give a prompt"
        )
    context = _context(model)
    if len(ids) >= context:
        raise NetclError(
            f"--prompt is {len(ids)} tokens; the model's context window is {context}: shorten it"
        )
    budget = min(args.max_new_tokens, context - len(ids))
    if budget < args.max_new_tokens:
        print(
            f"netcl: generating {budget} tokens, not "
            f"{args.max_new_tokens}: the prompt ({len(ids)} tokens) and "
            f"the reply share the context window of {context}",
            file=sys.stderr,
        )
    out: TextIO = sys.stdout
    out.write(args.prompt)
    out.flush()
    try:
        for piece in stream_tokens(
            model,
            tokenizer,
            ids,
            budget,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop=[eot] if eot is not None else [],
        ):
            out.write(piece)
            out.flush()
    except KeyboardInterrupt:  # Ctrl-C ends the text where it is
        out.write("\n")
        return 130
    out.write("\n")
    return 0


def fit_dialog(chat: ChatFormat, messages: list[dict[str, str]], budget: int) -> tuple[list[int], int]:
    """The prompt ids of `messages` plus the assistant header, made to fit `budget` tokens by dropping the
    oldest turns (a system message stays); returns (ids, number of messages dropped). When the last user
    message alone is too long, its beginning is cut (the ids keep their last `budget` tokens)."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system):]
    dropped = 0
    while True:
        ids, _ = chat.encode_dialog(system + turns, add_generation_prompt=True)
        if len(ids) <= budget or len(turns) <= 1:
            break
        turns = turns[1:]
        dropped += 1
        while turns and turns[0]["role"] != "user":  # a dialog restarts with the user
            turns = turns[1:]
            dropped += 1
    messages[:] = system + turns
    return (ids if len(ids) <= budget else ids[-budget:]), dropped


def run_chat(args: argparse.Namespace) -> int:
    model, tokenizer = load_model_dir(args.checkpoint, args.device)
    try:
        chat = ChatFormat(tokenizer, args.template)
    except ValueError as exc:
        raise NetclError(f"--template {args.template}: {exc}") from None
    end_of_turn = tokenizer.special_id(chat.template.end_of_turn)
    stop = {end_of_turn}
    if END_OF_TEXT in tokenizer.special_tokens:
        stop.add(tokenizer.special_id(END_OF_TEXT))
    context = _context(model)
    system = [{"role": "system", "content": args.system}] if args.system else []
    if system:  # the dialog keeps the system message: one that fills the window would be cut silently
        n = len(chat.encode_dialog([*system, {"role": "user", "content": ""}], add_generation_prompt=True)[0])
        room = context - min(args.max_new_tokens, context // 2)
        if n > room:
            print(f"netcl: --system is {n} tokens with the turn headers; the context window of {context} "
                  f"tokens leaves {room} for the dialog (the rest is the reply's), so every prompt loses the "
                  "start of the system message: shorten it", file=sys.stderr)
    interactive = sys.stdin.isatty()
    print(f"netcl chat: {args.checkpoint} ({model.num_parameters():,} parameters, context {context} tokens, "
          f"{chat.template.name} template). /reset clears the history, /exit (or end of input) leaves.")
    try:
        return _chat_loop(args, model, tokenizer, chat, stop, system, interactive)
    except KeyboardInterrupt:  # Ctrl-C leaves, as /exit does
        print()
        return 130


def _chat_loop(
    args: argparse.Namespace,
    model: GPT,
    tokenizer: BPETokenizer,
    chat: ChatFormat,
    stop: set[int],
    system: list[dict[str, str]],
    interactive: bool,
) -> int:
    """Read a line, answer it (streamed), until /exit or the end of input."""
    context = _context(model)
    reply_room = min(args.max_new_tokens, context // 2)
    messages = list(system)
    turn = 0
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:  # end of input
            if interactive:
                print()
            return 0
        text = line.rstrip("\n")
        if text.strip() == "/exit":
            return 0
        if text.strip() == "/reset":
            messages = list(system)
            print("(history cleared)")
            continue
        if not text.strip():
            continue
        if not interactive:
            print(f"you> {text}")
        messages.append({"role": "user", "content": text})
        ids, dropped = fit_dialog(chat, messages, context - reply_room)
        if dropped:
            print(f"(dropped the {dropped} oldest message(s) to fit the context window of {context} tokens)",
                  file=sys.stderr)
        print("assistant> ", end="", flush=True)
        reply = []
        for piece in stream_tokens(model, tokenizer, ids, min(args.max_new_tokens, context - len(ids)),
                                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                   seed=args.seed + turn, stop=stop):
            reply.append(piece)
            print(piece, end="", flush=True)
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})
        turn += 1
