"""A training run of `netcl train` or `netcl lm-train` (`Run`): its directory (runs/NAME, runs/NAME-2, ...),
what it resumes and the settings it keeps, its checkpoints (the last, and the best by validation metric),
early stopping, TensorBoard scalars and the files it says it wrote.

A directory holds a run when it has a checkpoint or metrics; a new run without --out takes the first free
name after the default's."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from netcl import config
from netcl import distributed as dist
from netcl.core.device import manager
from netcl.core.files import atomic_write
from netcl.distributed import launch
from netcl.errors import NetclError
from netcl.io import load_checkpoint, save_checkpoint
from netcl.io.checkpoint import read_checkpoint
from netcl.ops.gemm import variants as gemm_variants
from netcl.train import tensorboard
from netcl.train.flags import path_arg

CHECKPOINT_FILE = "checkpoint.safetensors"
BEST_FILE = "best.safetensors"  # the checkpoint of the best evaluation so far, beside the last one

__all__ = ["BEST_FILE", "CHECKPOINT_FILE", "Metric", "Run", "check_out", "check_overwrite", "default_runs",
           "fresh_default_out", "holds_run", "open_device", "path_arg", "plan_output", "start_ranks"]


def open_device(spec: str, probe: bool = True) -> Any:
    """The device of a --device flag; a bad one is an error naming the flag and listing the devices. A
    command with --nproc N calls it before it starts the ranks, so a bad device is one error, not N. A device
    the user named wins over NETCL_DEVICE (a flag over the environment), except in a rank of `netcl run`,
    whose launcher sets each rank's NETCL_DEVICE; "auto" takes NETCL_DEVICE where it is set. `probe`: begin
    the CPU GEMM's probe in the background (a first run's; gemm.variants.start_probes), for a process that
    computes on the device (not a launcher that only checks the flag)."""
    try:
        # a named device is checked wherever it runs, NETCL_DEVICE set or not
        device = manager.get(spec) if spec != "auto" else None
        if device is None or config.dist_launch() is not None:
            device = manager.default(spec)
    except NetclError as exc:
        raise NetclError(f"--device {spec}: {exc}") from None
    if probe:
        gemm_variants.start_probes(device)  # a first run's probe of the CPU GEMM runs beside the data loading
    return device


def start_ranks(args: argparse.Namespace, nproc: int, default_out: Path) -> tuple[int | None, bool]:
    """Check --device (a bad one is one error, before anything else and not one per rank); with --nproc N,
    start N ranks of this command line, all with the same --out (a fresh default one when none was given),
    and return (their exit status, False) in the process the user started. In a rank, or with N = 1:
    (None, whether this process is rank 0, the one that logs and writes)."""
    open_device(args.device, probe=False)
    if args.devices is not None and nproc <= 1:
        raise NetclError(f"--devices {args.devices} names one device per rank of --nproc N (N > 1); for one "
                         "process give --device")
    if args.balance is not None and nproc <= 1:
        raise NetclError(f"--balance {args.balance} splits the batch between the ranks of --nproc N (N > 1)")
    argv = list(getattr(args, "argv", None) or [])
    if nproc > 1 and args.out is None and args.resume is None:
        argv += ["--out", str(default_out if args.overwrite else fresh_default_out(default_out))]
    code = launch.spawn_ranks(argv, nproc, args.devices, args.balance)
    if code is not None:
        return code, False
    return None, launch.join(nproc)


def check_overwrite(resume: object, overwrite: bool) -> None:
    """--resume continues a run where it is and --overwrite replaces it: together one would be ignored."""
    if overwrite and resume is not None:
        raise NetclError("--resume continues a run and --overwrite replaces it; give one of them")


def holds_run(directory: Path) -> bool:
    return (directory / CHECKPOINT_FILE).exists() or (directory / "metrics.json").exists()


def default_runs(default_out: Path) -> list[Path]:
    """default_out, default_out-2, ... that hold a run, in the order they were numbered."""
    found = [default_out] if holds_run(default_out) else []
    numbered = []
    for p in default_out.parent.glob(default_out.name + "-*"):
        suffix = p.name[len(default_out.name) + 1 :]
        if suffix.isdigit() and holds_run(p):
            numbered.append((int(suffix), p))
    return found + [p for _, p in sorted(numbered)]


def fresh_default_out(default_out: Path) -> Path:
    """default_out when it holds no run, else the first default_out-N that does not exist."""
    if not holds_run(default_out):
        return default_out
    n = 2
    while (default_out.parent / f"{default_out.name}-{n}").exists():
        n += 1
    return default_out.parent / f"{default_out.name}-{n}"


def check_out(out: Path) -> None:
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


def _refuse_other_kind(ckpt: Path, kind: str, extra: dict[str, Any]) -> None:
    """Each command resumes only its own runs (the other's model keys would all be "missing")."""
    if kind == "train" and extra.get("kind") == "lm":
        raise NetclError(f"--resume: {ckpt} was written by netcl lm-train (a language model, not an image "
                         f"classifier); continue it with `netcl lm-train --resume {ckpt.parent}`")
    if kind == "lm" and extra.get("kind") != "lm":
        by_train = extra.get("kind") == "train" or "dataset" in extra  # runs of netcl train before "kind"
        raise NetclError(f"--resume: {ckpt} was not written by netcl lm-train" + (
            " but by netcl train (an image classifier); continue it with "
            f"`netcl train --resume {ckpt.parent}`" if by_train else ""))


def plan_output(
    args: argparse.Namespace, default_out: Path, kind: str, log: Any
) -> tuple[Path, Path | None, dict[str, Any]]:
    """(output directory, checkpoint to resume from or None, the settings that checkpoint recorded, with
    'steps_done' and 'epochs_done'), from --out, --resume and --overwrite. `kind` is the command's
    checkpoint kind ("train", "lm")."""
    check_overwrite(args.resume, args.overwrite)
    if args.resume is None:
        if args.out is None and not args.overwrite:
            out = fresh_default_out(default_out)
            if out != default_out:
                log(f"{default_out} holds an earlier run: this one goes to {out} (--resume continues the "
                    "latest run, --out picks a directory)")
            return out, None, {}
        out = Path(args.out) if args.out is not None else default_out  # --overwrite alone: the default's
        if holds_run(out) and not args.overwrite:
            raise NetclError(f"--out {out} already holds a run; pass --resume to continue it, --overwrite to "
                             "replace it, or another --out")
        return out, None, {}
    if isinstance(args.resume, str):
        ckpt = Path(args.resume)
        if ckpt.is_dir():  # a run directory
            ckpt = ckpt / CHECKPOINT_FILE
    elif args.out is not None:
        ckpt = Path(args.out) / CHECKPOINT_FILE
    else:
        earlier = [r for r in default_runs(default_out) if (r / CHECKPOINT_FILE).exists()]
        if not earlier:
            raise NetclError(f"--resume: no earlier run under {default_out.parent}/ to continue; run without "
                             "--resume first, or give the checkpoint's path")
        ckpt = earlier[-1] / CHECKPOINT_FILE
    if not ckpt.is_file():
        raise NetclError(f"--resume: no checkpoint at {ckpt}; run without --resume first")
    _, meta = read_checkpoint(ckpt)
    extra = meta.get("extra", {})
    _refuse_other_kind(ckpt, kind, extra)
    saved = dict(extra.get("args", {}))
    saved["steps_done"] = int(meta.get("step", 0))
    saved["epochs_done"] = int(meta.get("epoch", 0))
    return (Path(args.out) if args.out is not None else ckpt.parent), ckpt, saved


def continue_schedule(sched: Any, attr: str, total: int, span: str, log: Any) -> None:
    """A resumed run asked for another length: its cosine schedule (`attr`, the total it spans) now spans
    `total`, and the learning rate continues from where it was along the longer or shorter curve; `span`
    says the new length in the trainer's words ("12 epochs (600 steps)", "400 steps"), in one log line."""
    was = getattr(sched, attr)
    if was == total:
        return
    log(f"the cosine schedule now spans {span} (it spanned {was} steps): the learning rate continues along "
        f"the {'longer' if total > was else 'shorter'} schedule")
    setattr(sched, attr, total)
    sched.refresh()


def merge_settings(given: dict[str, tuple[str, Any]], saved: dict[str, Any]) -> dict[str, Any]:
    """key -> the given flag's value, else the resumed run's (None when neither). `given` maps each key to
    (flag, value or None). A resumed run keeps its settings: a flag that differs is an error naming it."""
    out: dict[str, Any] = {}
    for key, (flag, value) in given.items():
        if key in saved and value is not None and value != saved[key]:
            raise NetclError(
                f"{flag} {value} differs from the resumed run's {saved[key]}; a resumed run keeps "
                f"its settings (leave {flag} out, or start a new run)"
            )
        out[key] = value if value is not None else saved.get(key)
    return out


@dataclass(frozen=True)
class Metric:
    """What a run's evaluations measure: its name in messages, and which way is better."""

    name: str  # "validation loss", "test accuracy"
    higher_is_better: bool

    def best(self, values: list[float]) -> int:
        """Index of the first best value (a tie is no improvement)."""
        return int(np.argmax(values) if self.higher_is_better else np.argmin(values))


class Run:
    """One session of a training command: plans the directory from --out/--resume/--overwrite, logs (rank 0
    only), keeps the last checkpoint and the best one, stops early with --patience, writes TensorBoard
    scalars and metrics.json, and lists what it wrote.

        run = Run(args, "lm", Path("runs/lm"), Metric("validation loss", False), rank0)
        run.start()                       # the output directory; TensorBoard
        meta = run.restore(model, opt, sched, loader, scaler)    # with --resume
        run.save(model, opt, sched, step=..., loader=..., extra={...})
        if run.evaluated([("step 250", 3.1), ...]): break        # --patience ran out
        run.finish(metrics)               # metrics.json and the "wrote" lines
    """

    def __init__(self, args: argparse.Namespace, kind: str, default_out: Path, metric: Metric,
                 rank0: bool = True):
        self.args, self.kind, self.metric, self.rank0 = args, kind, metric, rank0
        self.default_out = default_out
        self.written: list[Path] = []
        self.tb: Any = tensorboard.open_writer(None)
        self.best: tuple[str, float] | None = None  # (where, value) of the best evaluation so far
        self.stopped_early: str | None = None  # where --patience stopped the run
        self.out, self.resume_from, self.saved = plan_output(args, default_out, kind, self.log)

    def log(self, msg: str) -> None:
        if self.rank0:
            tqdm.write(msg) if not self.args.no_progress else print(msg, flush=True)

    def nothing_to_do(self, total: int, given: int | None, flag: str, unit: str) -> bool:
        """With --resume: an error when `given` (the flag's value) is below the steps/epochs done; True (and
        says so) when the run has already done `total`."""
        if self.resume_from is None:
            return False
        done = self.saved[f"{unit}_done"]
        if given is not None and given < done:
            raise NetclError(f"{flag} {given} is fewer than the {done} {unit} {self.resume_from} has already "
                             f"trained; a resumed run can only go further: pass {flag} N (N > {done})")
        if done >= total:
            self.log(f"{self.resume_from} has already trained {done} of {total} {unit}: nothing to do; pass "
                     f"{flag} N (N > {done}) to train further. Nothing was written.")
            return True
        return False

    def start(self) -> None:
        """Make the output directory (rank 0 writes the run's files) and open TensorBoard's writer. A new run
        removes a best checkpoint an earlier run left there (--overwrite): it is not this run's."""
        try:
            self.out.mkdir(parents=True, exist_ok=True) if self.rank0 else None
        except OSError as exc:
            raise NetclError(
                f"cannot create the output directory {self.out}: {exc.strerror or exc}"
            ) from None
        if self.rank0 and self.resume_from is None:
            (self.out / BEST_FILE).unlink(missing_ok=True)
        self.tb = tensorboard.open_writer(self.args.tensorboard if self.rank0 else None)

    def restore(self, model: Any, opt: Any, sched: Any, loader: Any, scaler: Any = None) -> dict[str, Any]:
        """Load the resumed checkpoint into the run's objects and the loss scale it reached; its meta."""
        meta = load_checkpoint(self.resume_from, model, opt, sched, loader)
        if scaler is not None and meta["extra"].get("grad_scaler"):
            scaler.load_state_dict(meta["extra"]["grad_scaler"])
        return meta

    def save(self, model: Any, opt: Any, sched: Any, *, step: int, loader: Any, extra: dict[str, Any],
             epoch: int | None = None, scaler: Any = None) -> None:
        """The last checkpoint (rank 0): the run's kind, `extra` and the loss scale beside the state."""
        if not self.rank0:
            return
        path = self.out / CHECKPOINT_FILE
        extra = {"kind": self.kind, **extra}  # each command refuses the other's runs by their kind
        if scaler is not None:
            extra["grad_scaler"] = scaler.state_dict()
        epochs = {} if epoch is None else {"epoch": epoch}
        save_checkpoint(path, model, opt, sched, step=step, loader=loader, extra=extra, **epochs)
        self.claim(path)

    def claim(self, path: Path) -> None:
        """Name `path` among the files the run wrote (once)."""
        if path not in self.written:
            self.written.append(path)

    def agree(self, value: float | None) -> float:
        """An evaluation all ranks share (the mean of the ranks that evaluated: equal on equal devices; None
        from a rank that did not, e.g. one left out of the steps by the Balancer), so --patience stops them
        together."""
        if dist.is_initialized() and dist.world_size() > 1:
            merged = np.asarray([0.0, 0.0] if value is None else [value, 1.0], np.float64)
            dist.all_reduce(merged, op="sum")
            if merged[1] == 0:
                raise NetclError("no rank evaluated the model (every rank passed None to Run.agree)")
            return float(merged[0] / merged[1])
        if value is None:
            raise NetclError("Run.agree: this process did not evaluate the model (None); no other rank did")
        return value

    def evaluated(self, evaluations: list[tuple[str, float]]) -> bool:
        """After the last checkpoint of an evaluation: `evaluations` are the run's (where, value) so far, the
        newest last. The newest, when it is the best, is kept as best.safetensors. True when --patience
        evaluations in a row have not improved on the best: the run stops (and says so)."""
        values = [v for _, v in evaluations]
        i = self.metric.best(values)
        self.best = evaluations[i]
        if i == len(values) - 1 and self.rank0:
            _keep_copy(self.out / CHECKPOINT_FILE, self.out / BEST_FILE)
            self.claim(self.out / BEST_FILE)
        since = len(values) - 1 - i
        patience = getattr(self.args, "patience", None)
        if patience is None or since < patience:
            return False
        where, best = self.best
        self.stopped_early = evaluations[-1][0]
        self.log(f"stopping early at {self.stopped_early}: the {self.metric.name} has not improved for "
                 f"{since} evaluations (--patience {patience}); the best, {best:.4f} at {where}, is in "
                 f"{self.out / BEST_FILE}")
        return True

    def finish(self, metrics: dict[str, Any]) -> None:
        """metrics.json (with the best evaluation and an early stop) and the "wrote" lines (rank 0)."""
        if self.best is not None:
            metrics["best"] = {"at": self.best[0], self.metric.name.replace(" ", "_"): self.best[1],
                               "checkpoint": BEST_FILE}
        if self.stopped_early is not None:
            metrics["stopped_early_at"] = self.stopped_early
        if self.args.tensorboard:
            self.claim(Path(self.args.tensorboard))
        path = self.out / "metrics.json"
        path.write_text(json.dumps(metrics, indent=2))
        self.claim(path)
        if self.best is not None and (self.out / BEST_FILE) in self.written:
            self.log(f"{BEST_FILE}: the checkpoint of the best {self.metric.name}, {self.best[1]:.4f} at "
                     f"{self.best[0]}")
        self.log("\n".join(f"wrote {p}" for p in self.written))


def _keep_copy(source: Path, target: Path) -> None:
    """Replace `target` by the contents of `source`: a hard link where the filesystem has them (the next
    checkpoint replaces `source` by rename, so the link keeps these bytes), else a copy; atomic either way."""
    tmp = target.with_name(f".{target.name}.link")
    try:
        tmp.unlink(missing_ok=True)
        os.link(source, tmp)
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)
        atomic_write(target, source.read_bytes())
