"""The training commands: `netcl train` (netcl.train.main) and its reusable loop (netcl.train.loop), `netcl
lm-train` (netcl.train.lm), `netcl generate` and `netcl chat` (netcl.train.generate), all standing on one
Run (netcl.train.runs: directory, resume, checkpoints, early stopping) with shared flags (train.flags) and
curves (train.curves)."""

from netcl.train.loop import GraphedStep, build_model, evaluate, train_epoch, train_step

__all__ = ["GraphedStep", "build_model", "evaluate", "train_epoch", "train_step"]
