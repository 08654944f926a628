"""curves.png of a training run: the training loss per step (with its running mean) beside what the run
evaluates: `netcl train`'s test accuracy per epoch, `netcl lm-train`'s validation loss against a unigram
model's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _figure(size: tuple[float, float]) -> tuple[Any, Any]:
    """A matplotlib Figure (no pyplot state) and MaxNLocator."""
    # matplotlib takes ~0.5 s to import: deferred to the end of a run (and the non-interactive backend set
    # before anything draws)
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    return Figure(figsize=size), MaxNLocator


def _training_loss(ax: Any, losses: Any, step_label: str, mean_label: str) -> None:
    """Each step's loss, faint, and (from 20 steps) the mean of a fiftieth of them (at least 5)."""
    losses = np.asarray(losses)
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, lw=0.5, alpha=0.4, label=step_label)
    if len(losses) >= 20:
        k = max(len(losses) // 50, 5)
        ax.plot(steps[k - 1 :], np.convolve(losses, np.ones(k) / k, mode="valid"), lw=1.5,
                label=mean_label.format(k=k))


def classifier_figure(history: dict[str, Any], title: str) -> Any:
    """`netcl train`'s Figure: training loss per step (log scale) and test accuracy per epoch."""
    fig, max_n_locator = _figure((10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    _training_loss(ax1, history["loss"], "step", "mean of {k}")
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss")
    ax1.set_yscale("log")
    ax1.legend()
    epochs = np.arange(1, len(history["test_accuracy"]) + 1)
    ax2.plot(epochs, np.array(history["test_accuracy"]) * 100, marker="o")
    ax2.set_xlabel("epoch")
    ax2.xaxis.set_major_locator(max_n_locator(integer=True))  # epoch 1, 2, not 1.0, 1.2, ..., 2.0
    ax2.set_ylabel("test accuracy (%)")
    ax2.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def lm_figure(history: dict[str, Any], info: dict[str, Any], title: str) -> Any:
    """`netcl lm-train`'s Figure: training and validation loss per step, and a unigram model's."""
    fig, max_n_locator = _figure((8, 4.5))
    ax = fig.subplots()
    _training_loss(ax, history["loss"], "training (per step)", "training (mean of {k})")
    if history["val_loss"]:
        vs, vl = zip(*history["val_loss"])
        ax.plot(vs, vl, marker="o", lw=1.5, label="validation")
    ax.axhline(info["unigram_val_loss_nats"], ls="--", color="gray",
               label=f"unigram model on validation ({info['unigram_val_loss_nats']:.2f})")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(max_n_locator(integer=True))  # a short run's steps: 2, 4, 6, not 2.5
    ax.set_ylabel("loss (nats per token)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_classifier(history: dict[str, Any], path: Path, title: str) -> None:
    """curves.png of `netcl train`."""
    classifier_figure(history, title).savefig(path, dpi=110)


def plot_lm(history: dict[str, Any], info: dict[str, Any], path: Path, title: str) -> None:
    """curves.png of `netcl lm-train`."""
    lm_figure(history, info, title).savefig(path, dpi=110)
