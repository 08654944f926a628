"""Command-line flags of the training commands: the argparse value types (a bad value is a one-line error
naming the flag) and the flags every run takes (`add_run_arguments`: device, output directory, resume,
progress, mixed precision, recorded steps, TensorBoard, early stopping)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from netcl.train import tensorboard
from netcl.train.loop import add_amp_argument


def path_arg(text: str) -> str:
    """An argparse type for path flags: an empty string (an unset shell variable in `--out "$DIR"`) would
    silently mean the current directory, so it is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer in [low, high] ("must be an integer >= low, got ...")."""

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


# a seed: 64 bits (a larger one wrapped onto a smaller one's stream)
seed = int_at_least(0, (1 << 64) - 1)


def number(low: float, high: float = math.inf, low_open: bool = False,
           high_open: bool = False) -> Callable[[str], float]:
    """A finite number in an interval ("must be a finite number in [0, 1), got ...")."""

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


def count(text: str) -> int:
    """An integer >= 0 (`netcl train`'s wording: "must be >= 0, got ...")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def float_at_least(low: float, strict: bool) -> Callable[[str], float]:
    """A finite number >= low (> low when strict), in `netcl train`'s wording."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {'>' if strict else '>='} {low:g}, got {text}"
            )
        return value

    return parse


def add_device_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", default="auto", help="auto, gpu, cpu, a name fragment or P:D (see netcl devices)"
    )


def add_run_arguments(
    p: argparse.ArgumentParser, *, out_help: str, resume_help: str, evaluation: str
) -> None:
    """The flags of every training run: --device, --out, --resume, --overwrite, --no-progress, --amp,
    --eager, --tensorboard and --patience (`evaluation` names what is compared: "validation loss")."""
    add_device_argument(p)
    p.add_argument("--out", default=None, type=path_arg, help=out_help)
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT", help=resume_help)
    p.add_argument(
        "--overwrite", action="store_true",
        help="replace an earlier run in OUT (without --out: in the default directory) instead of refusing"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars (plain lines)")
    add_amp_argument(p)
    p.add_argument("--eager", action="store_true",
                   help="run every step op by op (default: record the step once and replay it, netcl.graph)")
    tensorboard.add_argument(p)
    p.add_argument(
        "--patience", type=int_at_least(1), default=None, metavar="N",
        help=f"stop early after N evaluations in a row without a better {evaluation} (default: never); "
        "the best checkpoint is kept as best.safetensors either way",
    )

