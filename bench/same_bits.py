"""Issue 28's check on a device: run a training command twice from the same seed and compare the weights it
wrote, tensor by tensor (bits, not closeness), and say which tensors differ and by how much.

    python bench/same_bits.py -- netcl lm-train --preset 25m --steps 5 --seed 0 --samples 0
    python bench/same_bits.py --file checkpoint.safetensors -- netcl train --epochs 1 --seed 0

Each run writes into its own fresh directory (--out is added); exit status 0 when every tensor is identical.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", default="model.safetensors", help="the weights file written in --out")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command after --")
    args = ap.parse_args()
    command = [c for c in args.command if c != "--"]
    if not command:
        ap.error("give the training command after --")
    from safetensors.numpy import load_file  # noqa: PLC0415 (an optional dependency of the check)

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(2):
            out = Path(tmp) / f"run{n}"
            cmd = [sys.executable, "-m", "netcl.cli", *command[1:]] if command[0] == "netcl" else command
            t0 = time.perf_counter()
            done = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True)
            if done.returncode:
                print(f"run {n + 1} failed ({shlex.join(cmd)}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
                return 2
            print(f"run {n + 1}: {time.perf_counter() - t0:.1f} s")
            runs.append(load_file(str(out / args.file)))
    a, b = runs
    if a.keys() != b.keys():
        print(f"the runs wrote different tensors: {sorted(a.keys() ^ b.keys())}")
        return 1
    differ = {k: float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max())
              for k in sorted(a) if a[k].tobytes() != b[k].tobytes()}
    print(f"{shlex.join(command)}: {len(a) - len(differ)} of {len(a)} tensors identical"
          + (f"; differing: {len(differ)}, largest difference {max(differ.values()):.3g} "
             f"({max(differ, key=differ.get)})" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
