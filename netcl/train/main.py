"""`netcl train`: train a small CNN (or the seed's MLP, or ResNet-18) on Fashion-MNIST, or on scikit-learn's
digits when Fashion-MNIST cannot be had; progress bars, per-epoch test accuracy, checkpoints (the last and
the best by test accuracy), --resume, early stopping (--patience), a PNG of the loss and accuracy curves, and
TensorBoard scalars with --tensorboard DIR. The run itself (directory, resume, checkpoints) is runs.Run."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from netcl import distributed as dist
from netcl import optim
from netcl.data import DataLoader, DatasetUnavailable, load_digits, load_idx_dataset
from netcl.distributed import launch
from netcl.errors import NetclError
from netcl.ops import random
from netcl.train import flags, runs
from netcl.train.curves import classifier_figure as curves_figure  # noqa: F401  (importable as before)
from netcl.train.curves import plot_classifier as plot_curves
from netcl.train.loop import (
    MODELS,
    GraphedStep,
    MixedPrecision,
    build_model,
    evaluate,
    prepare_images,
    train_epoch,
)
from netcl.train.runs import open_device

# Defaults per dataset, so the job ends on a result worth showing whichever one it found (2-core PoCL
# CPU device: Fashion-MNIST CNN 2 x 20000 images ~87% in a few minutes; the 1437 digits at batch 32
# for 15 epochs ~97% in seconds, where batch 128 for 2 epochs stopped at 63% after 22 steps).
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "fashion-mnist": {"epochs": 2, "batch_size": 128, "lr": 2e-3, "train_limit": 20000},
    "mnist": {"epochs": 2, "batch_size": 128, "lr": 2e-3, "train_limit": 20000},
    "digits": {"epochs": 15, "batch_size": 32, "lr": 3e-3, "train_limit": 0},
}
# What a checkpoint records of its run, and what a resumed run must keep.
RUN_SETTINGS = ("model", "dataset", "batch_size", "lr", "weight_decay", "train_limit", "seed")
DEFAULT_OUT = Path("runs/train")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train", help="train a small CNN on Fashion-MNIST (digits if unavailable)", description=__doc__
    )
    p.add_argument(
        "--model",
        choices=MODELS,
        default=None,
        help="cnn (default), mlp, or resnet (ResNet-18, images zero-padded to a multiple of 8: 28 -> 32)",
    )
    p.add_argument(
        "--dataset",
        choices=("auto", "fashion-mnist", "mnist", "digits"),
        default=None,
        help="auto (default): Fashion-MNIST if its files can be found or downloaded, else digits",
    )
    p.add_argument(
        "--epochs",
        type=launch.positive_int,
        default=None,
        help="epochs in all (default per dataset: Fashion-MNIST/MNIST 2, digits 15; with --resume: "
        "the checkpoint's)",
    )
    p.add_argument("--batch-size", type=launch.positive_int, default=None,
                   help="default per dataset: 128, digits 32")
    p.add_argument("--lr", type=flags.float_at_least(0.0, strict=True), default=None,
                   help="peak learning rate of the cosine schedule (default 2e-3, digits 3e-3)")
    p.add_argument("--weight-decay", type=flags.float_at_least(0.0, strict=False), default=None,
                   help="AdamW weight decay (default 1e-4)")
    p.add_argument(
        "--train-limit",
        type=flags.count,
        default=None,
        help="train on the first N training images (default 20000 for Fashion-MNIST/MNIST, which keeps the "
        "default run to a few minutes on a 2-core CPU; 0 = all)",
    )
    p.add_argument("--seed", type=flags.seed, default=None, help="random seed (default 0)")
    p.add_argument("--data-dir", default=None, type=flags.path_arg,
                   help="directory with the IDX files (gz or raw); only this directory is searched")
    flags.add_run_arguments(
        p,
        out_help="directory for checkpoint.safetensors, best.safetensors, metrics.json and curves.png "
        "(default runs/train, or runs/train-2, -3, ... when it holds an earlier run)",
        resume_help="continue a run: from CHECKPOINT (a file or a run directory), from "
        "OUT/checkpoint.safetensors, or from the latest run under runs/; --epochs may raise the total (the "
        "cosine schedule is stretched to it)",
        evaluation="test accuracy",
    )
    p.add_argument(
        "--nproc",
        type=launch.positive_int,
        default=1,
        help="data parallelism: N processes, one per device (--devices; else one GPU each when there are N, "
        "else all on --device); every step takes N x --batch-size images, split between the ranks by "
        "--balance; gradients weighted by share (netcl.distributed)",
    )
    launch.add_device_arguments(p)
    p.set_defaults(func=run)


def load_data(dataset: str, data_dir: str | None, log: Any) -> Any:
    if dataset == "digits":
        return load_digits()
    if data_dir is not None and not Path(data_dir).is_dir():
        raise NetclError(f"--data-dir {data_dir}: no such directory")
    name = "fashion-mnist" if dataset == "auto" else dataset
    try:
        return load_idx_dataset(name, data_dir)
    except DatasetUnavailable as exc:
        if dataset != "auto" or data_dir is not None:
            raise  # the user asked for this data (or this directory): no silent substitute
        log(f"Fashion-MNIST is not available: {exc}\n-> training on scikit-learn's bundled digits instead.")
        return load_digits()


def _plan_output(args: argparse.Namespace, log: Any) -> tuple[Path, Path | None, dict[str, Any]]:
    """(output directory, checkpoint to resume from or None, the settings that checkpoint recorded)."""
    return runs.plan_output(args, DEFAULT_OUT, "train", log)


def _settings(args: argparse.Namespace, saved: dict[str, Any], dataset_name: str) -> dict[str, Any]:
    """The run's settings: given ones, else the resumed checkpoint's, else the dataset's defaults."""
    given = {"model": ("--model", args.model), "batch_size": ("--batch-size", args.batch_size),
             "lr": ("--lr", args.lr), "weight_decay": ("--weight-decay", args.weight_decay),
             "train_limit": ("--train-limit", args.train_limit), "seed": ("--seed", args.seed)}
    out = runs.merge_settings(given, saved)
    defaults = {"model": "cnn", "weight_decay": 1e-4, "seed": 0, **DATASET_DEFAULTS[dataset_name]}
    for key, value in out.items():
        if value is None:
            out[key] = defaults[key]
    out["epochs"] = args.epochs or saved.get("epochs") or defaults["epochs"]
    return out


def run(args: argparse.Namespace) -> int:
    code, rank0 = runs.start_ranks(args, args.nproc, DEFAULT_OUT)  # --nproc N: this process starts N ranks
    if code is not None:
        return code
    args.no_progress = args.no_progress or not rank0
    args.eager = args.eager or args.nproc > 1  # DDP's all-reduce goes through the host: no recorded step

    run = runs.Run(args, "train", DEFAULT_OUT, runs.Metric("test accuracy", higher_is_better=True), rank0)
    log, out, resume_from, saved = run.log, run.out, run.resume_from, run.saved
    dataset = args.dataset or "auto"
    if saved.get("dataset"):  # a resumed run keeps the data it was trained on
        if dataset not in ("auto", saved["dataset"]):
            raise NetclError(f"--dataset {dataset} differs from the resumed run's {saved['dataset']}")
        dataset = saved["dataset"]
    dev = open_device(args.device)  # in a rank, NETCL_DEVICE (set by the launcher) may pick another
    q = dev.queue
    data = load_data(dataset, args.data_dir, log)
    s = _settings(args, saved, data.name)
    if run.nothing_to_do(s["epochs"], args.epochs, "--epochs", "epochs"):
        return 0
    x_train, y_train = data.x_train, data.y_train
    if s["train_limit"]:
        x_train, y_train = x_train[: s["train_limit"]], y_train[: s["train_limit"]]
    x_train, x_test = prepare_images(s["model"], x_train), prepare_images(s["model"], data.x_test)
    run.start()
    log(
        f"netcl train: {s['model']} on {data.name} ({len(y_train)} train / {len(data.y_test)} test images "
        f"{'x'.join(map(str, x_train.shape[1:]))}) on {dev.device_name} ({dev.backend}); writing to {out}"
    )

    random.manual_seed(s["seed"])
    model = build_model(s["model"], q, x_train.shape[1:], data.classes)
    # every rank reads the same global batches (one process's order with N x --batch-size); a Balancer gives
    # each rank its rows of them
    loader = DataLoader((x_train, y_train), s["batch_size"] * args.nproc, q, shuffle=True, seed=s["seed"],
                        drop_last=True)
    if len(loader) == 0:
        raise NetclError(f"--batch-size {s['batch_size']} is larger than the {len(y_train)} training images")
    opt = optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=s["weight_decay"])
    total_steps = s["epochs"] * len(loader)
    sched = optim.CosineAnnealing(opt, T_max=total_steps)
    history: dict[str, Any] = {"loss": [], "test_accuracy": [], "epoch_seconds": [], "samples_per_second": []}
    start_epoch = 0
    mixed = MixedPrecision.make(args.amp) if args.amp else None
    if resume_from is not None:
        meta = run.restore(model, opt, sched, loader, mixed.scaler if mixed is not None else None)
        start_epoch = int(meta["epoch"])
        history = meta["extra"].get("history", history)
        span = f"{s['epochs']} epochs ({total_steps} steps)"
        runs.continue_schedule(sched, "T_max", total_steps, span, log)
        log(f"resumed from {resume_from} at epoch {start_epoch} (step {meta['step']}), "
            f"lr {opt.param_groups[0]['lr']:.3g}")
    log(
        f"model: {model.num_parameters():,} parameters; optimizer AdamW lr={s['lr']}, cosine schedule, "
        f"batch {s['batch_size']}{f' x {args.nproc} processes' if args.nproc > 1 else ''}, "
        f"{len(loader)} steps per epoch"
        f"{', eager steps' if args.eager else ', step recorded once and replayed (--eager: op by op)'}"
    )
    if mixed is not None:
        log(mixed.describe())
    step_model = dist.DistributedDataParallel(model) if args.nproc > 1 else model  # after a resume's load
    balancer = None
    if args.nproc > 1:
        balancer = dist.Balancer(step_model, s["batch_size"] * args.nproc, mode=args.balance, log=log,
                                 optimizer=opt)
        for line in balancer.describe():
            log(line)
    graphed = None if args.eager else GraphedStep(model, opt, sched, mixed)
    run_args = {
        **{k: s[k] for k in RUN_SETTINGS if k != "dataset"},
        "dataset": data.name,
        "epochs": s["epochs"],
    }
    tb = run.tb  # flushed after each epoch, closed at the end
    for epoch in range(start_epoch, s["epochs"]):
        loader.set_epoch(epoch)
        bar = tqdm(
            total=len(loader),
            desc=f"epoch {epoch + 1}/{s['epochs']}",
            unit="step",
            disable=args.no_progress,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        t0 = time.perf_counter()

        def progress(n: int, loss: float | None, bar: Any = bar, t0: float = t0, epoch: int = epoch,
                     done: list[int] = [0]) -> None:  # noqa: B006  (steps done this epoch: a bar may be off)
            bar.update(n)
            done[0] += n
            rate = done[0] * s["batch_size"] * args.nproc / max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{rate:,.0f}")
            tb.log(
                epoch * len(loader) + done[0],
                {
                    "train/loss": loss,
                    "train/learning_rate": opt.param_groups[0]["lr"],
                    "train/images_per_second": rate,
                },
            )

        losses = train_epoch(step_model, opt, loader, sched, progress, step=graphed, mixed=mixed,
                             balancer=balancer)
        q.finish()
        seconds = time.perf_counter() - t0
        bar.close()
        left_out = balancer is not None and not balancer.working  # its weights are behind: no evaluation
        acc = run.agree(None if left_out else evaluate(model, x_test, data.y_test, q))
        if losses and not math.isfinite(losses[-1]):   # the weights are no longer finite: nothing to keep
            raise NetclError(f"the training loss became {losses[-1]} in epoch {epoch + 1}; training diverged "
                             f"(this epoch not saved): try a lower --lr (it was {s['lr']:g})")
        history["loss"].extend(losses)
        history["test_accuracy"].append(acc)
        history["epoch_seconds"].append(seconds)
        history["samples_per_second"].append(len(loader) * s["batch_size"] * args.nproc / seconds)
        mean_loss = f"{np.mean(losses):.4f}" if losses else "- (this rank was left out of every step)"
        log(
            f"epoch {epoch + 1}: mean loss {mean_loss}, test accuracy {acc * 100:.2f}%, "
            f"{seconds:.1f} s ({history['samples_per_second'][-1]:,.0f} images/s)"
        )
        tb.log(
            (epoch + 1) * len(loader),
            {
                "test/accuracy": acc,
                "train/epoch_mean_loss": float(np.mean(losses)) if losses else float("nan"),
                "train/epoch_images_per_second": history["samples_per_second"][-1],
            },
        )
        tb.flush()
        if balancer is not None:
            balancer.synchronize(needed_by=[0])  # rank 0 writes the checkpoint
        run.save(model, opt, sched, step=(epoch + 1) * len(loader), epoch=epoch + 1, loader=loader,
                 scaler=mixed.scaler if mixed is not None else None,
                 extra={"history": history, "model": s["model"], "dataset": data.name, "args": run_args})
        if run.evaluated([(f"epoch {i + 1}", a) for i, a in enumerate(history["test_accuracy"])]):
            break
    tb.close()
    if not rank0:
        return 0
    plot = out / "curves.png"
    plot_curves(history, plot, f"netcl {s['model']} on {data.name}")
    run.claim(plot)
    metrics = {
        "model": s["model"],
        "dataset": data.name,
        "device": dev.device_name,
        "epochs": s["epochs"],
        "batch_size": s["batch_size"],
        "processes": args.nproc,
        "shares": balancer.shares if balancer is not None else [s["batch_size"]],
        "lr": s["lr"],
        "seed": s["seed"],
        "final_test_accuracy": history["test_accuracy"][-1],
        "test_accuracy": history["test_accuracy"],
        "epoch_seconds": history["epoch_seconds"],
        "samples_per_second": history["samples_per_second"],
    }
    run.finish(metrics)
    return 0
