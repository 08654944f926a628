"""Token-for-token parity with tiktoken: cl100k ranks on a real multilingual corpus, and the built-in
patterns."""

from __future__ import annotations

import pytest

from netcl.text import CL100K_PATTERN, GPT2_PATTERN, O200K_PATTERN, BPETokenizer


def _first_mismatch(ours, theirs, text: str) -> str:
    for line in text.splitlines(keepends=True):
        a, b = ours(line), theirs(line)
        if a != b:
            return f"first differing line {line!r}: netcl {a} tiktoken {b}"
    return "lines agree; difference only across line boundaries"


def test_cl100k_ids_identical_on_corpus(cl100k, tiktoken_cl100k, corpus):
    assert len(corpus.encode()) > 300_000
    ours = cl100k.encode_ordinary(corpus)
    theirs = tiktoken_cl100k.encode_ordinary(corpus)
    assert ours == theirs, _first_mismatch(cl100k.encode_ordinary, tiktoken_cl100k.encode_ordinary, corpus)
    assert cl100k.decode(ours) == corpus


def test_cl100k_ids_identical_with_fresh_cache(cl100k, tiktoken_cl100k, corpus):
    # The chunk cache must not change results: encode again with a cache too small to hold anything.
    tiny = BPETokenizer(cl100k.ranks, cl100k.pattern, cl100k.special_tokens, cache_size=1)
    sample = corpus[:60_000]
    assert tiny.encode_ordinary(sample) == tiktoken_cl100k.encode_ordinary(sample)


def test_cl100k_special_tokens_match_tiktoken(cl100k, tiktoken_cl100k):
    text = "hello <|endoftext|> world<|fim_prefix|>x<|fim_suffix|><|endofprompt|>"
    assert cl100k.encode(text, allowed_special="all") == tiktoken_cl100k.encode(text, allowed_special="all")
    subset = {"<|endoftext|>"}
    plain = "a<|endoftext|>b"
    assert cl100k.encode(plain, allowed_special=subset) == tiktoken_cl100k.encode(
        plain, allowed_special=subset
    )
    assert cl100k.encode(text, allowed_special="none") == tiktoken_cl100k.encode(text, disallowed_special=())


def test_builtin_patterns_are_openais(monkeypatch):
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *args, **kwargs: {})
    assert openai_public.r50k_base()["pat_str"] == GPT2_PATTERN
    assert openai_public.cl100k_base()["pat_str"] == CL100K_PATTERN
    assert openai_public.o200k_base()["pat_str"] == O200K_PATTERN


@pytest.mark.parametrize("pattern", [GPT2_PATTERN, O200K_PATTERN], ids=["gpt2", "o200k"])
def test_pre_split_matches_tiktoken(pattern, cl100k, tiktoken_cl100k, corpus):
    # Only cl100k ranks ship offline, so pair them with the other patterns on both sides: any difference
    # is then a difference in pre-splitting.
    tiktoken = pytest.importorskip("tiktoken")
    ranks = tiktoken_cl100k._mergeable_ranks
    theirs = tiktoken.Encoding("mixed", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    ours = BPETokenizer(ranks, pattern)
    sample = corpus[:80_000] + corpus[-12_000:]
    assert ours.encode_ordinary(sample) == theirs.encode_ordinary(sample), _first_mismatch(
        ours.encode_ordinary, theirs.encode_ordinary, sample
    )
