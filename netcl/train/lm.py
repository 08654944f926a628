"""`netcl lm-train`: train a small GPT on the Python standard library's source (netcl.train.corpus), with
progress bars, periodic validation loss, a loss-curve PNG, checkpoints (the last and the best), --resume,
early stopping (--patience), dropout, TensorBoard scalars and samples at the end. `netcl generate` and
`netcl chat` (netcl.train.generate) stream text from a trained run's directory.

A run directory (runs/lm, runs/lm-2, ...) is also a model directory: config.json and model.safetensors in
Hugging Face's naming (GPT.save_pretrained), tokenizer.json (Hugging Face's format), plus the training
state (checkpoint.safetensors, and best.safetensors at the best validation loss), metrics.json, curves.png
and samples.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

import netcl.autograd as ag
from netcl import distributed as dist
from netcl import optim
from netcl.core.tensor import Tensor
from netcl.distributed import launch
from netcl.errors import NetclError
from netcl.graph import Graph
from netcl.models import GPT, GPTConfig
from netcl.ops import random
from netcl.train import corpus as corpus_mod
from netcl.train import flags, runs
from netcl.train.corpus import END_OF_TEXT, TokenWindows, build_corpus, validation_windows
from netcl.train.curves import plot_lm as plot_curves
from netcl.train.generate import (  # noqa: F401  (generate and chat lived here: their names stay importable)
    TOKENIZER_FILE,
    fit_dialog,
    load_model_dir,
    run_chat,
    run_generate,
    stream_tokens,
)
from netcl.train.loop import MixedPrecision
from netcl.train.runs import open_device

DEFAULT_OUT = Path("runs/lm")
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
    "--dropout": "dropout",
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
    "dropout": 0.0,
}
SAMPLE_PROMPTS = ("import", "def", "class", "    for")  # no trailing space: BPE words carry their leading one


# ---------------------------------------------------------------------------------------------- flags
_positive = flags.int_at_least(1)
_count = flags.int_at_least(0)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("lm-train", help="train a small GPT on the Python standard library's source",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("model (a preset's values unless given)")
    g.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="small (default): 4 layers, dim 128, context 128, for a CPU; 25m: 8 layers, dim 512, "
                   "context 512 (~29.5M parameters at the default vocabulary), for a GPU")
    g.add_argument("--arch", choices=("llama", "gpt2"), default=None,
                   help="llama (default): RMSNorm, RoPE, SwiGLU; gpt2: LayerNorm, learned positions, GELU")
    g.add_argument("--layers", type=_positive, default=None, help="transformer blocks")
    g.add_argument("--heads", type=_positive, default=None, help="attention heads")
    g.add_argument("--kv-heads", type=_positive, default=None,
                   help="key/value heads (grouped-query attention; divides --heads; default --heads)")
    g.add_argument("--dim", type=_positive, default=None, help="model width (a multiple of --heads)")
    g.add_argument("--context", type=flags.int_at_least(2), default=None, help="context window in tokens")
    g.add_argument("--dropout", type=flags.number(0.0, 1.0, high_open=True), default=None, metavar="P",
                   help="dropout probability in training, on the embeddings, the attention probabilities and "
                   "each block's residual branches (default 0; validation and generation run without it)")
    d = p.add_argument_group("data")
    d.add_argument("--corpus", default=None, type=flags.path_arg,
                   help="directory of .py files (default: this Python's standard library)")
    d.add_argument(
        "--vocab-size",
        type=flags.int_at_least(256 + len(corpus_mod.SPECIAL_TOKENS), 65535),
        default=None,
        help=f"BPE vocabulary trained on the corpus (default {corpus_mod.DEFAULT_VOCAB}; "
        "at most 65535: ids are cached as uint16)",
    )
    d.add_argument("--val-fraction", type=flags.number(0.0, 1.0, low_open=True, high_open=True), default=None,
                   help=f"share of files held out for validation (default {corpus_mod.DEFAULT_VAL_FRACTION})")
    d.add_argument(
        "--cache-dir", default=None, type=flags.path_arg,
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
    t.add_argument("--lr", type=flags.number(0.0, low_open=True), default=None, help="peak learning rate")
    t.add_argument(
        "--min-lr", type=flags.number(0.0), default=None, help="learning rate at the end (default lr / 10)"
    )
    t.add_argument("--warmup", type=_count, default=None, help="linear warm-up steps (< --steps)")
    t.add_argument("--weight-decay", type=flags.number(0.0), default=None,
                   help="AdamW weight decay of the matrices (default 0.1; norms and biases get none)")
    t.add_argument("--clip", type=flags.number(0.0), default=None,
                   help="gradient-norm clip (default 1; 0 = off)")
    t.add_argument("--seed", type=flags.seed, default=None, help="initialisation and data seed (default 0)")
    t.add_argument("--eval-every", type=_positive, default=None,
                   help="steps between validation losses and checkpoints")
    t.add_argument("--eval-windows", type=_positive, default=None,
                   help="validation windows of --context tokens, spread over the held-out files (default 64)")
    t.add_argument("--samples", type=_count, default=len(SAMPLE_PROMPTS),
                   help=f"samples printed at the end (default {len(SAMPLE_PROMPTS)})")
    t.add_argument("--sample-tokens", type=_positive, default=100, help="tokens per sample (default 100)")
    flags.add_run_arguments(
        p,
        out_help="run directory (default runs/lm, or runs/lm-2, -3, ... when it holds an earlier run)",
        resume_help="continue a run: from CHECKPOINT, from OUT/checkpoint.safetensors, or from the latest "
        "run under runs/; --steps may raise the total (the cosine schedule is stretched to it)",
        evaluation="validation loss",
    )
    p.add_argument("--nproc", type=_positive, default=None,
                   help="train with N processes, one device each (netcl.distributed; default 1): each takes "
                   "--batch-size windows of every step and gradients are averaged, the same as one process "
                   "with N x --batch-size; steps run eagerly; rank 0 logs and writes; a resumed run keeps "
                   "it; --balance splits the N x --batch-size windows by measured speed")
    launch.add_device_arguments(p)
    p.set_defaults(func=run_train)



# ---------------------------------------------------------------------------------------------- runs
def _plan_output(
    args: argparse.Namespace, log: Callable[[str], None]
) -> tuple[Path, Path | None, dict[str, Any]]:
    """(run directory, checkpoint to resume from or None, the settings that checkpoint recorded)."""
    return runs.plan_output(args, DEFAULT_OUT, "lm", log)


def _settings(args: argparse.Namespace, saved: dict[str, Any]) -> dict[str, Any]:
    """The run's settings: given flags, else the resumed checkpoint's, else the preset's and the defaults.
    A resumed run keeps its settings: a flag that differs is an error naming it."""
    given = {key: (flag, getattr(args, key)) for flag, key in RUN_SETTINGS.items()}
    if args.corpus is not None:
        given["corpus"] = ("--corpus", str(Path(args.corpus).resolve()))
    out = runs.merge_settings(given, saved)
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
                     n_kv_heads=s["kv_heads"], max_seq_len=s["context"], arch=s["arch"],
                     dropout=s["dropout"], attn_dropout=s["dropout"])


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


def run_train(args: argparse.Namespace) -> int:
    nproc = args.nproc or 1
    code, rank0 = runs.start_ranks(args, nproc, DEFAULT_OUT)  # --nproc N: this process starts N ranks
    if code is not None:
        return code
    rank = dist.rank() if nproc > 1 else 0
    args.no_progress = args.no_progress or not rank0

    run = runs.Run(args, "lm", DEFAULT_OUT, runs.Metric("validation loss", higher_is_better=False), rank0)
    log, out, resume_from, saved = run.log, run.out, run.resume_from, run.saved
    if args.nproc is None and saved.get("nproc", 1) != 1:
        raise NetclError(
            f"the resumed run trained with --nproc {saved['nproc']}: pass --nproc {saved['nproc']} "
            "(a resumed run keeps its settings)"
        )
    s = _settings(args, saved)
    if run.nothing_to_do(s["steps"], args.steps, "--steps", "steps"):
        return 0
    runs.check_out(out)
    dev = open_device(args.device)
    cache_dir = args.cache_dir or saved.get("cache_dir")  # where the run found its tokens (not a setting)
    corpus = build_corpus(s["corpus"], vocab_size=s["vocab_size"], val_fraction=s["val_fraction"],
                          cache_dir=cache_dir, log=log)
    log(corpus.summary())
    # one stream of global batches (nproc x batch_size windows); each rank takes its rows of each (Balancer)
    windows = TokenWindows(corpus.train, s["batch_size"] * nproc, s["context"], seed=s["seed"])
    val = validation_windows(corpus.val, s["context"], s["eval_windows"])
    q = dev.queue
    run.start()

    random.manual_seed(s["seed"])
    model = GPT(q, _model_config(s, corpus.tokenizer.n_vocab))
    opt = make_optimizer(model, s)
    sched = optim.WarmupCosine(opt, warmup_steps=s["warmup"], total_steps=s["steps"], eta_min=s["min_lr"])
    history: dict[str, Any] = {"loss": [], "val_loss": [], "tokens_per_second": []}
    start = 0
    mixed = MixedPrecision.make(args.amp) if args.amp else None
    if resume_from is not None:
        meta = run.restore(model, opt, sched, windows, mixed.scaler if mixed is not None else None)
        start = int(meta["step"])
        history = meta["extra"].get("history", history)
        runs.continue_schedule(sched, "total_steps", s["steps"], f"{s['steps']} steps", log)
        log(f"resumed from {resume_from} at step {start}, lr {opt.param_groups[0]['lr']:.3g}")
    tokens_per_step = s["batch_size"] * nproc * s["context"]
    ddp = dist.DistributedDataParallel(model) if nproc > 1 else None  # after a resume's load
    balancer = None if ddp is None else dist.Balancer(ddp, s["batch_size"] * nproc, args.balance, log=log,
                                                      optimizer=opt)
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
    if mixed is not None:
        log(mixed.describe())
    for line in balancer.describe() if balancer is not None else []:
        log(line)
    step_fn = LMStep(model, opt, s["clip"], eager=args.eager, mixed=mixed, ddp=ddp)
    tokenizer = corpus.tokenizer
    run_args = {key: s[key] for key in RUN_SETTINGS.values()}
    run_args.update(steps=s["steps"], eval_every=s["eval_every"], cache_dir=cache_dir)

    def checkpoint(step: int) -> None:
        run.save(model, opt, sched, step=step, loader=windows, scaler=mixed.scaler if mixed else None,
                 extra={"history": history, "args": run_args, "corpus": corpus.info})
        if rank0:
            for p in (*model.save_pretrained(out), out / TOKENIZER_FILE):  # model.safetensors, config.json
                run.claim(p)
            tokenizer.save_hf(out / TOKENIZER_FILE)

    bar = tqdm(total=s["steps"], initial=start, desc="lm-train", unit="step", disable=args.no_progress,
               file=sys.stderr, dynamic_ncols=True)
    pending: list[Tensor] = []
    t0, last_t, last_step = time.perf_counter(), time.perf_counter(), start
    # the step the checkpoint file holds (a Ctrl-C inside checkpoint() leaves the one before it)
    saved_step = start if resume_from is not None else None
    report_every = 10
    try:
        for step in range(start, s["steps"]):
            batch = windows.next_batch()
            fractions = [1.0] if balancer is None else balancer.fractions  # this step's shares
            part = batch if balancer is None else balancer.split(batch)  # None: this rank is left out
            pending.append((None if part is None else step_fn(part), fractions))
            if balancer is not None:
                balancer.step()
            sched.step()
            n = step + 1
            if n % report_every == 0 or n % s["eval_every"] == 0 or n == s["steps"]:
                if nproc > 1:  # the loss of the global batch: the ranks' losses weighted by their shares
                    merged = np.asarray([0.0 if t is None else float(t.to_host()[0]) * f[rank]
                                         for t, f in pending], np.float64)
                    dist.all_reduce(merged, op="sum")
                    values = merged.tolist()
                else:
                    values = [float(t.to_host()[0]) for t, _ in pending]
                pending.clear()
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
                for j, v in enumerate(values):
                    run.tb.log(n - len(values) + 1 + j, {"train/loss": v})
                run.tb.log(n, {"train/learning_rate": opt.param_groups[0]["lr"],
                               "train/tokens_per_second": rate})
            if n % s["eval_every"] == 0 or n == s["steps"]:
                # a rank left out of the steps (its weights behind) does not evaluate
                left_out = balancer is not None and not balancer.working
                vloss = run.agree(None if left_out else validation_loss(model, val, s["batch_size"]))
                history["val_loss"].append((n, vloss))
                log(f"step {n}: validation loss {vloss:.4f} nats ({vloss / math.log(2):.3f} bits) per token; "
                    f"a unigram model's: {corpus.info['unigram_val_loss_nats']:.4f}")
                run.tb.log(n, {"validation/loss": vloss})
                run.tb.flush()
                if balancer is not None:
                    balancer.synchronize(needed_by=[0])  # rank 0 writes the checkpoint
                checkpoint(n)
                saved_step = n
                if run.evaluated([(f"step {m}", v) for m, v in history["val_loss"]]):
                    break
    except KeyboardInterrupt:  # Ctrl-C: the last checkpoint stays; say how to go on
        bar.close()
        run.tb.close()
        log(
            "interrupted; "
            + (
                f"{out / CHECKPOINT_FILE} holds step {saved_step}: `netcl lm-train --resume {out}` "
                "continues from there"
                if saved_step is not None
                else "no checkpoint was written yet"
            )
        )
        return 130
    bar.close()
    run.tb.close()
    seconds = time.perf_counter() - t0
    if not rank0:
        return 0
    plot = out / "curves.png"
    plot_curves(history, corpus.info, plot, f"netcl {s['arch']} GPT ({model.num_parameters() / 1e6:.1f}M) on "
                f"{Path(corpus.info['source']).name}")
    run.claim(plot)
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
        run.claim(out / "samples.txt")
    final_val = history["val_loss"][-1][1]
    metrics = {
        "settings": run_args,
        "parameters": model.num_parameters(),
        "amp": args.amp,
        "processes": nproc,
        "shares": balancer.shares if balancer is not None else [s["batch_size"]],
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
    log(
        f"validation loss {final_val:.4f} nats per token against "
        f"{corpus.info['unigram_val_loss_nats']:.4f} for a "
        f"unigram model (entropy of the training tokens {corpus.info['unigram_entropy_nats']:.4f})"
    )
    run.finish(metrics)
    return 0
