"""Every python block of README.md runs, in order, in one namespace (the README cannot rot)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 4
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md block {i}", "exec"), namespace)
    assert namespace["launches"].count == 1
    assert sorted(namespace["model"].state_dict()) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert sum(namespace["loss_mask"]) >= 1
