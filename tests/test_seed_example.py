"""The seed's 30-second example (tests/seed_example.py, its exact text) runs as printed."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).with_name("seed_example.py")
SEED = Path("/work/shared/SEED-netcl-wiki.txt")


def test_example_text_is_the_seed_verbatim():
    if SEED.exists():  # the product description sits beside the checkout on the build machine
        assert EXAMPLE.read_text().strip() in SEED.read_text()


def test_seed_example_runs():
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300, cwd=EXAMPLE.parent.parent
    )
    assert proc.returncode == 0, proc.stderr
    assert "Active Device:" in proc.stdout
    match = re.search(r"Step completed\. Batch loss: (\S+)", proc.stdout)
    assert match, proc.stdout
    loss = float(match.group(1))
    # 10 classes, PyTorch-like init: the first loss is near ln(10)
    assert math.isfinite(loss) and abs(loss - math.log(10)) < 1.0
