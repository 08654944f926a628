"""netcl.text is pure host code: no pyopencl, no other netcl module, and netcl does not import it eagerly."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import netcl.text

PACKAGE = Path(netcl.text.__file__).parent


def test_modules_import_only_stdlib_regex_tqdm_and_each_other():
    allowed = {"regex", "tqdm"}
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{path.name} has no module docstring"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level > 0:
                    continue  # relative: inside netcl.text
                roots = {node.module.split(".")[0]}
            else:
                continue
            foreign = {r for r in roots if r not in allowed and r not in sys.stdlib_module_names}
            assert not foreign, f"{path.name} imports {sorted(foreign)}"


def test_public_api_is_exported():
    for name in (
        "BPETokenizer",
        "ChatFormat",
        "SpecialTokenError",
        "GPT2_PATTERN",
        "CL100K_PATTERN",
        "O200K_PATTERN",
    ):
        assert name in netcl.text.__all__ and hasattr(netcl.text, name)
    assert issubclass(netcl.text.SpecialTokenError, ValueError)


def test_importing_netcl_does_not_import_text():
    code = "import sys, netcl; print('netcl.text' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
