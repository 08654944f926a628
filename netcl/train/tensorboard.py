"""TensorBoard scalars for training jobs: `netcl train --tensorboard DIR` (and `netcl lm-train`, through the
same two calls) writes event files TensorBoard reads (`tensorboard --logdir DIR`).

    add_argument(parser)                       # the --tensorboard DIR flag
    with open_writer(args.tensorboard) as tb:  # None without the flag: every call is then a no-op
        tb.log(step, {"train/loss": 0.41, "train/learning_rate": 2e-3})

The event files are written by tensorboardX (the optional `tensorboard` extra: pure Python on protobuf, no
TensorFlow and no TensorBoard server needed to write them); viewing them needs TensorBoard itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from netcl.errors import NetclError


def _logdir(text: str) -> str:
    """--tensorboard's value, checked when the command line is read, before a run starts or writes."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory, got an empty string")
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    return text


def add_argument(parser: argparse.ArgumentParser) -> None:
    """Add `--tensorboard DIR` to a command's parser."""
    parser.add_argument(
        "--tensorboard",
        default=None,
        type=_logdir,
        metavar="DIR",
        help="also write TensorBoard scalars (loss, accuracy, learning rate, throughput) to DIR "
        "(needs tensorboardX: pip install 'netcl[tensorboard]'; view with tensorboard --logdir DIR)",
    )


class ScalarWriter:
    """Scalars of one run in TensorBoard's event-file format, under `logdir` (made if missing)."""

    def __init__(self, logdir: str | Path, flush_seconds: float = 10.0):
        try:
            # optional dependency, imported only when a run asks for TensorBoard output
            from tensorboardX import SummaryWriter  # noqa: PLC0415
        except ImportError:
            raise NetclError("--tensorboard needs the tensorboardX package: pip install 'netcl[tensorboard]' "
                             "(or pip install tensorboardX)") from None
        self.logdir = Path(logdir)
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise NetclError(
                f"--tensorboard {logdir}: cannot create the directory: {exc.strerror or exc}"
            ) from None
        if not self.logdir.is_dir():
            raise NetclError(f"--tensorboard {logdir}: not a directory")
        self._writer: Any = SummaryWriter(logdir=str(self.logdir), flush_secs=flush_seconds)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """One value per tag ("train/loss", "test/accuracy", ...) at `step` (a global step count, >= 0)."""
        if self._writer is None:
            raise NetclError(f"the TensorBoard writer of {self.logdir} is closed")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"TensorBoard step must be an integer >= 0, got {step!r}")
        for tag, value in scalars.items():
            if not isinstance(tag, str) or not tag:
                raise ValueError(f"TensorBoard tag must be a non-empty string, got {tag!r}")
            try:
                value = float(value)  # NaN and inf are kept: a diverging loss shows
            except (TypeError, ValueError):
                raise TypeError(f"TensorBoard scalar {tag!r} must be a number, got {value!r}") from None
            self._writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> ScalarWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _NoWriter:
    """What open_writer gives without --tensorboard: accepts the same calls, writes nothing."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NoWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def open_writer(logdir: str | Path | None) -> ScalarWriter | _NoWriter:
    """A ScalarWriter for `logdir`, or (None: no --tensorboard) a writer that writes nothing."""
    return ScalarWriter(logdir) if logdir else _NoWriter()
