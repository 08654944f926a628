"""The path of a batch and of the learning rate through one eager training step (issue 27's yardstick):
the calls into netcl's own files, the moves between them (a call whose code lies in another netcl file than
its caller's) and the files entered, counted by sys.setprofile over one warm step of bench/train_step.py's
seed MLP and CNN (AdamW), and over the optimizer's step alone (where `lr` goes). Only the public API is used,
so the same file runs in an older checkout for the before (`git worktree add /tmp/old REV`, then
`python /path/to/bench/step_path.py` from /tmp/old: the netcl imported is the one of the working
directory).

    python bench/step_path.py [--gpu] [--models mlp,cnn] [--out JSON]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

sys.path.insert(0, os.getcwd())

import numpy as np  # noqa: E402


def count(fn: Callable[[], Any], root: str) -> dict[str, int]:
    """Calls of code under `root` while fn() runs, the moves between files among them, the files entered."""
    calls = moves = 0
    files: set[str] = set()

    def hook(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls, moves
        if event != "call":
            return
        name = frame.f_code.co_filename
        if not name.startswith(root):
            return
        calls += 1
        files.add(name)
        if frame.f_back is not None and frame.f_back.f_code.co_filename != name:
            moves += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return {"calls": calls, "moves": moves, "files": len(files)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true", help="the step on the OpenCL GPU (default: the CPU)")
    ap.add_argument("--models", default="mlp,cnn", help="comma list of mlp, cnn")
    ap.add_argument("--out", default=None, help="also write the counts as JSON here")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    if not models or any(m not in ("mlp", "cnn") for m in models):
        ap.error(f"--models takes a comma list of mlp, cnn; got {args.models!r}")

    import netcl
    from netcl import optim
    from netcl.core.device import manager
    from netcl.core.tensor import Tensor
    from netcl.train.loop import build_model, train_step

    q = manager.default("gpu" if args.gpu else "cpu").queue
    root = os.path.dirname(os.path.abspath(netcl.__file__))
    print(f"netcl from {root} on {q.device.describe()}")
    found: dict[str, Any] = {}
    for kind in models:
        rng = np.random.default_rng(0)
        shape = (256, 1, 28, 28) if kind == "mlp" else (128, 1, 28, 28)
        model = build_model(kind, q, (1, 28, 28), 10)
        opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
        x = Tensor.from_host(q, rng.standard_normal(shape).astype(np.float32))
        y = Tensor.from_host(q, rng.integers(0, 10, shape[0]).astype(np.int32))
        for _ in range(5):
            train_step(model, opt, x, y)
        q.finish()
        step = count(lambda: train_step(model, opt, x, y), root)
        lr = count(opt.step, root)   # the gradients of the step before are still there
        q.finish()
        found[kind] = {"step": step, "optimizer_step": lr}
        print(f"{kind}: one eager step {step['calls']} calls into netcl, {step['moves']} moves between its "
              f"files, {step['files']} files; the optimizer's step (lr's path) {lr['calls']} calls, "
              f"{lr['moves']} moves, {lr['files']} files")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(found, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
