"""The `netcl train` job (netcl.train.main) and its reusable loop (netcl.train.loop)."""

from netcl.train.loop import GraphedStep, build_model, evaluate, train_epoch, train_step

__all__ = ["GraphedStep", "build_model", "evaluate", "train_epoch", "train_step"]
