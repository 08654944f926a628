"""netcl.text is pure host code: no pyopencl, no other netcl module but the exception hierarchy (netcl.errors,
stdlib only), and netcl does not import it eagerly."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import netcl.errors
import netcl.text

PACKAGE = Path(netcl.text.__file__).parent


def _imported_roots(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[0] for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.level == 0:
        return {node.module.split(".")[0]}
    return set()


def test_netcl_errors_imports_only_stdlib():
    # netcl.text's exceptions derive from netcl.errors.NetclError; that module must stay import-free.
    tree = ast.parse((PACKAGE.parent / "errors.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        foreign = {r for r in _imported_roots(node) if r not in sys.stdlib_module_names}
        assert not foreign, f"netcl/errors.py imports {sorted(foreign)}"


def test_modules_import_only_stdlib_regex_tqdm_netcl_errors_and_each_other():
    allowed = {"regex", "tqdm"}
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{path.name} has no module docstring"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "netcl.errors":
                continue  # the exception hierarchy (checked above); relative imports stay inside netcl.text
            foreign = {
                r for r in _imported_roots(node) if r not in allowed and r not in sys.stdlib_module_names
            }
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
    for error in (
        netcl.text.SpecialTokenError,
        netcl.text.UnknownTokenError,
        netcl.text.TokenIdTypeError,
        netcl.text.TokenizerFileError,
    ):
        assert issubclass(error, netcl.errors.NetclError) and issubclass(error, ValueError), error
    assert issubclass(netcl.text.TokenIdTypeError, TypeError)


def test_importing_netcl_does_not_import_text():
    code = "import sys, netcl; print('netcl.text' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
