"""`netcl train`: train a small CNN (or the seed's MLP) on Fashion-MNIST, or on scikit-learn's digits
when Fashion-MNIST cannot be had; progress bars, per-epoch test accuracy, checkpoints, --resume,
and a PNG of the loss and accuracy curves."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from netcl.errors import NetclError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train", help="train a small CNN on Fashion-MNIST (digits if unavailable)", description=__doc__
    )
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument(
        "--dataset",
        choices=("auto", "fashion-mnist", "mnist", "digits"),
        default="auto",
        help="auto: Fashion-MNIST if its files can be found or downloaded, else digits",
    )
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument(
        "--train-limit",
        type=int,
        default=20000,
        help="train on the first N training images (default 20000 keeps the default run to a few "
        "minutes on a 2-core CPU; 0 = all)",
    )
    p.add_argument(
        "--device", default="auto", help="auto, gpu, cpu, a name fragment or P:D (see netcl devices)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="directory with the IDX files (gz or raw)")
    p.add_argument("--out", default="runs/train", help="directory for checkpoint.safetensors, metrics, plot")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.safetensors")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (plain lines)")
    p.add_argument("--eager", action="store_true",
                   help="run every step op by op (default: record the step once and replay it, netcl.graph)")
    p.set_defaults(func=run)


def load_data(dataset: str, data_dir: str | None, log: Any) -> Any:
    from netcl.data import DatasetUnavailable, load_digits, load_idx_dataset

    if dataset == "digits":
        return load_digits()
    names = ["fashion-mnist"] if dataset == "auto" else [dataset]
    try:
        return load_idx_dataset(names[0], data_dir)
    except DatasetUnavailable as exc:
        if dataset != "auto":
            raise
        log(f"Fashion-MNIST is not available: {exc}\n-> training on scikit-learn's bundled digits instead.")
        return load_digits()


def plot_curves(history: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    steps = np.arange(1, len(history["loss"]) + 1)
    ax1.plot(steps, history["loss"], lw=0.6, alpha=0.5, label="step")
    if len(history["loss"]) >= 20:
        k = max(len(history["loss"]) // 50, 5)
        smooth = np.convolve(history["loss"], np.ones(k) / k, mode="valid")
        ax1.plot(steps[k - 1 :], smooth, lw=1.5, label=f"mean of {k}")
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss")
    ax1.set_yscale("log")
    ax1.legend()
    epochs = np.arange(1, len(history["test_accuracy"]) + 1)
    ax2.plot(epochs, np.array(history["test_accuracy"]) * 100, marker="o")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("test accuracy (%)")
    ax2.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from netcl import optim
    from netcl.core import random
    from netcl.core.device import manager
    from netcl.data import DataLoader
    from netcl.io import load_checkpoint, save_checkpoint
    from netcl.train.loop import GraphedStep, build_model, evaluate, train_epoch

    def log(msg: str) -> None:
        tqdm.write(msg) if not args.no_progress else print(msg, flush=True)

    dev = manager.default(args.device)
    q = dev.queue
    data = load_data(args.dataset, args.data_dir, log)
    x_train, y_train = data.x_train, data.y_train
    if args.train_limit:
        x_train, y_train = x_train[: args.train_limit], y_train[: args.train_limit]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint.safetensors"
    log(
        f"netcl train: {args.model} on {data.name} ({len(y_train)} train / {len(data.y_test)} test images "
        f"{'x'.join(map(str, data.image_shape))}) on {dev.device_name} ({dev.backend})"
    )

    random.manual_seed(args.seed)
    model = build_model(args.model, q, data.image_shape, data.classes)
    loader = DataLoader((x_train, y_train), args.batch_size, q, shuffle=True, seed=args.seed, drop_last=True)
    opt = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = optim.CosineAnnealing(opt, T_max=max(args.epochs * len(loader), 1))
    history: dict[str, Any] = {"loss": [], "test_accuracy": [], "epoch_seconds": [], "samples_per_second": []}
    start_epoch = 0
    if args.resume:
        if not ckpt.exists():
            raise NetclError(f"--resume: no checkpoint at {ckpt}; run without --resume first")
        meta = load_checkpoint(ckpt, model, opt, sched, loader)
        start_epoch = int(meta["epoch"])
        history = meta["extra"].get("history", history)
        log(f"resumed from {ckpt} at epoch {start_epoch} (step {meta['step']})")
    log(
        f"model: {model.num_parameters():,} parameters; optimizer AdamW lr={args.lr}, cosine schedule, "
        f"batch {args.batch_size}, {len(loader)} steps per epoch"
        f"{', eager steps' if args.eager else ', step recorded once and replayed (--eager: op by op)'}"
    )
    graphed = None if args.eager else GraphedStep(model, opt, sched)

    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)
        bar = tqdm(
            total=len(loader),
            desc=f"epoch {epoch + 1}/{args.epochs}",
            unit="step",
            disable=args.no_progress,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        t0 = time.perf_counter()

        def progress(n: int, loss: float | None) -> None:
            bar.update(n)
            rate = bar.n * args.batch_size / max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{rate:,.0f}")

        losses = train_epoch(model, opt, loader, sched, progress, step=graphed)
        q.finish()
        seconds = time.perf_counter() - t0
        bar.close()
        acc = evaluate(model, data.x_test, data.y_test, q)
        history["loss"].extend(losses)
        history["test_accuracy"].append(acc)
        history["epoch_seconds"].append(seconds)
        history["samples_per_second"].append(len(loader) * args.batch_size / seconds)
        log(
            f"epoch {epoch + 1}: mean loss {np.mean(losses):.4f}, test accuracy {acc * 100:.2f}%, "
            f"{seconds:.1f} s ({history['samples_per_second'][-1]:,.0f} images/s)"
        )
        save_checkpoint(
            ckpt,
            model,
            opt,
            sched,
            step=(epoch + 1) * len(loader),
            epoch=epoch + 1,
            loader=loader,
            extra={"history": history, "model": args.model, "dataset": data.name},
        )
    plot = out / "curves.png"
    if history["test_accuracy"]:
        plot_curves(history, plot, f"netcl {args.model} on {data.name}")
    metrics = {
        "model": args.model,
        "dataset": data.name,
        "device": dev.device_name,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "final_test_accuracy": history["test_accuracy"][-1] if history["test_accuracy"] else None,
        "test_accuracy": history["test_accuracy"],
        "epoch_seconds": history["epoch_seconds"],
        "samples_per_second": history["samples_per_second"],
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    log(f"checkpoint {ckpt}\nplot {plot}\nmetrics {out / 'metrics.json'}")
    return 0
