"""The guide's code runner: every python block of a page runs, in order, in one namespace, and what it
prints (and any matplotlib figure it leaves open) is written into the page below it.

Used twice: by mkdocs (`hooks:` in mkdocs.yml; `on_page_markdown` inserts the outputs, so every number and
plot on the site comes from a real run) and by tests/docs/test_docs.py (runs each page's blocks). Both
keep a page's outputs under NETCL_CACHE_DIR/docs, keyed by the page's code and netcl's sources, so the
build after the test (or a second `mkdocs serve` rebuild) does not run the same code again.

A block that must not run is preceded by `<!-- docs: skip REASON -->` (the reason is required).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(
    r"(?P<marker><!--\s*docs:\s*skip(?P<reason>[^>]*)-->\s*\n)?"
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


@dataclass
class Block:
    """One fenced code block of a page: its language, code, where it ends, and a skip reason if any."""

    lang: str
    code: str
    end: int
    line: int
    skip: str | None = None
    outputs: list = field(default_factory=list)


def code_blocks(markdown: str) -> list[Block]:
    """The fenced blocks of a page, in order (indented ones too: admonitions and tabs)."""
    blocks = []
    for m in FENCE.finditer(markdown):
        indent = m.group("indent")
        body = "".join(line[len(indent):] if line.startswith(indent) else line
                       for line in m.group("body").splitlines(keepends=True))
        skip = None
        if m.group("marker") is not None:
            skip = m.group("reason").strip() or "(no reason given)"
        blocks.append(Block(m.group("lang"), body, m.end(), markdown.count("\n", 0, m.start()) + 1, skip))
    return blocks


def python_blocks(markdown: str) -> list[Block]:
    return [b for b in code_blocks(markdown) if b.lang in ("python", "py")]


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted((ROOT / "netcl").rglob("*")):
        if path.suffix in (".py", ".cl") and path.is_file():
            digest.update(path.relative_to(ROOT).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _cache_dir() -> Path:
    raw = os.environ.get("NETCL_CACHE_DIR", "").strip()
    if raw:
        base = Path(raw).expanduser()
    else:
        import platformdirs  # noqa: PLC0415  (mkdocs loads this hook before netcl; platformdirs is netcl's dependency)

        base = Path(platformdirs.user_cache_dir("netcl"))
    return base / "docs"


def _cache_key(name: str, blocks: list[Block]) -> str:
    digest = hashlib.sha256(name.encode())
    for b in blocks:
        digest.update(b"\0" + b.code.encode() + b"\0" + str(b.skip).encode())
    digest.update(_sources_digest().encode())
    return digest.hexdigest()[:32]


def _figures() -> list[str]:
    """PNG data of every open matplotlib figure, which are then closed."""
    try:
        import matplotlib  # noqa: PLC0415  (only pages that plot need it)
    except ImportError:
        return []
    if "matplotlib.pyplot" not in sys.modules:
        return []
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    images = []
    for number in plt.get_fignums():
        buf = io.BytesIO()
        plt.figure(number).savefig(buf, format="png", dpi=90, bbox_inches="tight")
        images.append(base64.b64encode(buf.getvalue()).decode())
    plt.close("all")
    return images


@contextlib.contextmanager
def _stderr_kept(err: io.StringIO):
    """Inside: what a block writes to stderr goes into `err`, not the terminal of `mkdocs build`: progress
    bars (tqdm writes to sys.stderr) and what the OpenCL compiler prints on file descriptor 2 itself (clang's
    "1 error generated." for a page that shows a build error). Kept for the error of a failing block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as raw:
        os.dup2(raw.fileno(), 2)
        try:
            with contextlib.redirect_stderr(err):
                yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            raw.seek(0)
            err.write(raw.read().decode(errors="replace"))


class BlockError(RuntimeError):
    """A guide page's code block raised: names the page and the line of the block."""


def run_page(name: str, markdown: str, workdir: Path | None = None) -> list[dict]:
    """Run the python blocks of one page in order in one namespace (cwd: workdir or a temporary
    directory); return per block {"stdout": str, "figures": [base64 PNG]}. Results are cached."""
    blocks = python_blocks(markdown)
    cache = _cache_dir() / f"{_cache_key(name, blocks)}.json"
    namespace: dict = {"__name__": "__docs__"}
    results = []
    old_cwd = os.getcwd()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="netcl-docs-")))
        os.chdir(workdir)
        try:
            for b in blocks:
                if b.skip is not None:
                    results.append({"stdout": "", "figures": []})
                    continue
                out, err = io.StringIO(), io.StringIO()
                try:
                    with contextlib.redirect_stdout(out), _stderr_kept(err):
                        exec(compile(b.code, f"{name}:{b.line}", "exec"), namespace)
                except Exception as exc:
                    raise BlockError(
                        f"{name}, the code block at line {b.line} raised "
                        f"{type(exc).__name__}: {exc}\n--- its output so far:\n{out.getvalue()}"
                        f"--- its stderr:\n{err.getvalue()}"
                    ) from exc
                results.append({"stdout": out.getvalue(), "figures": _figures()})
        finally:
            os.chdir(old_cwd)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")          # two test runs at once (scripts/test_matrix.py)
    tmp.write_text(json.dumps(results))
    tmp.replace(cache)
    return results


def cached_outputs(name: str, markdown: str) -> list[dict] | None:
    cache = _cache_dir() / f"{_cache_key(name, python_blocks(markdown))}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    return None


def render(markdown: str, results: list[dict]) -> str:
    """The page with each block's output (a text block) and figures (inline PNGs) inserted below it."""
    pieces, pos = [], 0
    for b, result in zip(python_blocks(markdown), results):
        pieces.append(markdown[pos:b.end])
        pos = b.end
        indent = markdown[markdown.rfind("\n", 0, b.end) + 1:b.end][:-3]
        if result["stdout"].strip():
            text = result["stdout"].rstrip("\n")
            fence = "````" if "```" in text else "```"
            body = "\n".join(indent + line for line in text.splitlines())
            pieces.append(f"\n\n{indent}{fence}text title=\"output\"\n{body}\n{indent}{fence}")
        for png in result["figures"]:
            pieces.append(f"\n\n{indent}![figure made by the code above](data:image/png;base64,{png})")
    pieces.append(markdown[pos:])
    return "".join(pieces)


# ---------------------------------------------------------------- mkdocs hook
def on_page_markdown(markdown, page, config, files):  # mkdocs' hook signature
    if not python_blocks(markdown):
        return markdown
    name = page.file.src_uri
    results = cached_outputs(name, markdown)
    if results is None:
        try:
            results = run_page(name, markdown)
        except BlockError as exc:
            from mkdocs.exceptions import PluginError  # noqa: PLC0415  (only inside a build)

            raise PluginError(str(exc)) from exc
    return render(markdown, results)
