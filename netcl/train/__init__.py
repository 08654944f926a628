"""The `netcl train` job (netcl.train.main) and its reusable loop (netcl.train.loop)."""

from netcl.train.loop import build_model, evaluate, train_epoch, train_step

__all__ = ["build_model", "evaluate", "train_epoch", "train_step"]
