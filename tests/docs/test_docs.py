"""The guide cannot go stale: every python block of docs/ runs (a page's blocks in order, in one
namespace, as a reader would paste them), and `mkdocs build --strict` builds the site with their outputs."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_spec = importlib.util.spec_from_file_location("netcl_docs_run_code", DOCS / "hooks" / "run_code.py")
run_code = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = run_code  # dataclasses look their module up
_spec.loader.exec_module(run_code)

PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
NAV_PAGES = re.findall(r"^\s*-\s.*?([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)


def test_every_page_is_in_the_nav():
    assert sorted(NAV_PAGES) == PAGES


@pytest.mark.parametrize("page", [p for p in PAGES if run_code.python_blocks((DOCS / p).read_text())])
def test_page_code_runs(page, tmp_path):
    markdown = (DOCS / page).read_text()
    blocks = run_code.python_blocks(markdown)
    for b in blocks:
        if b.skip is not None:
            assert len(b.skip) > 10, f"{page}:{b.line}: a skipped block must say why"
    results = run_code.run_page(page, markdown, workdir=tmp_path)
    assert len(results) == len(blocks)


def test_skips_are_rare():
    skipped = [(p, b.line, b.skip) for p in PAGES for b in run_code.python_blocks((DOCS / p).read_text())
               if b.skip is not None]
    total = sum(len(run_code.python_blocks((DOCS / p).read_text())) for p in PAGES)
    assert len(skipped) * 10 <= total, skipped


def test_block_parser_and_renderer():
    page = ("intro\n<!-- docs: skip needs two GPUs -->\n```python\nraise SystemExit\n```\n"
            "!!! note\n    ```python\n    print(6 * 7)\n    ```\n\n```bash\nls\n```\n")
    blocks = run_code.python_blocks(page)
    assert [b.skip for b in blocks] == ["needs two GPUs", None]
    assert blocks[1].code == "print(6 * 7)\n"
    rendered = run_code.render(page, [{"stdout": "", "figures": []}, {"stdout": "42\n", "figures": ["AAAA"]}])
    assert '    ```text title="output"\n    42\n    ```' in rendered
    assert "(data:image/png;base64,AAAA)" in rendered


def test_outputs_are_cached_by_code(tmp_path, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "cache"))
    page = "```python\nimport sys\nprint(len(sys.argv) >= 0)\n```\n"
    assert run_code.cached_outputs("c.md", page) is None
    results = run_code.run_page("c.md", page, workdir=tmp_path)
    assert results == [{"stdout": "True\n", "figures": []}]
    assert run_code.cached_outputs("c.md", page) == results
    assert run_code.cached_outputs("c.md", page.replace(">= 0", "> 0")) is None


def test_a_failing_block_names_page_and_line(tmp_path):
    page = "x\n\n```python\nprint('before')\n1 / 0\n```\n"
    with pytest.raises(
        run_code.BlockError, match=r"bad\.md, the code block at line 3 raised ZeroDivisionError"
    ):
        run_code.run_page("bad.md", page, workdir=tmp_path)


def test_a_block_writes_nothing_to_the_terminal(tmp_path, capfd):
    """`mkdocs build --strict` printed a stray "1 error generated." (clang, on file descriptor 2, for the page
    that shows a build error) and progress bars (sys.stderr): a block's stderr is kept, not printed, and a
    failing block's error shows it."""
    page = ("```python\nimport os, sys\nos.write(2, b'1 error generated.\\n')\n"
            "print('progress', file=sys.stderr)\nprint('out')\n```\n")
    assert run_code.run_page("quiet.md", page, workdir=tmp_path) == [{"stdout": "out\n", "figures": []}]
    assert capfd.readouterr().err == ""
    with pytest.raises(run_code.BlockError, match=r"--- its stderr:\n") as failed:
        run_code.run_page("loud.md", page.replace("print('out')", "1 / 0"), workdir=tmp_path)
    assert "1 error generated.\n" in str(failed.value) and "progress\n" in str(failed.value)
    assert capfd.readouterr().err == ""


def test_pages_script_reports_each_page(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    spec = importlib.util.spec_from_file_location("netcl_docs_pages", ROOT / "scripts" / "docs_pages.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["paths/autograd/tape.md"]) == 0
    out = capsys.readouterr().out
    assert (
        "===== paths/autograd/tape.md" in out and "ops recorded: 4" in out and "1 pages ran, 0 failed" in out
    )


def test_getting_started_lists_every_knob():
    knobs = set(re.findall(r"NETCL_[A-Z][A-Z_0-9]*", (ROOT / "netcl" / "config.py").read_text()))
    text = (DOCS / "getting-started.md").read_text()
    assert knobs and not {k for k in knobs if k not in text}


def test_mkdocs_build_strict(tmp_path):
    """Runs last: the page tests above leave their outputs in the cache, so the build reuses them."""
    pytest.importorskip("mkdocs", reason="mkdocs is in the [test] extra (`make test` installs it; a GPU "
                        "machine's own Python may lack it)")
    env = dict(os.environ)
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    html = (tmp_path / "site" / "getting-started" / "index.html").read_text()
    assert "Step completed. Batch loss:" in html       # the 30-second example's real output
    assert (tmp_path / "site" / "api" / "index.html").is_file()
