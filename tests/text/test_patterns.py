"""Pre-splitting: lossless for any pattern (uncovered text becomes its own piece), findall's pieces for
the built-in patterns, whole matches when a pattern has capturing groups; round trips through BPETokenizer."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netcl.text import CL100K_PATTERN, GPT2_PATTERN, O200K_PATTERN, BPETokenizer
from netcl.text.patterns import compile_pattern, pre_splitter

tiktoken = pytest.importorskip("tiktoken")

#: Patterns that leave text uncovered, match empty strings, or have capturing groups.
PARTIAL_PATTERNS = [r"[a-z]+", r"\d+", r"(x)y", r"([a-z])([a-z]*)", r"\d*", "", r"\b", r"(?i)the|and", r"\s"]
#: Those a tokenizer refuses: they match only empty strings (tests/text/test_bpe.py).
EMPTY_ONLY = ["", r"\b"]
TEXTS = [
    "ab 12 cd",
    "",
    "   ",
    "The cat and THE dog, 1999-2024!\n\tdone",
    "xyxy xy yx 42",
    "日本語 and 中文 mixed with émoji 😀 and tabs\t\r\n",
]


@pytest.mark.parametrize("text", ["ab 12 cd", "12 ab!", "ab", " ", ""])
def test_uncovered_spans_become_pieces(text):
    pieces = pre_splitter(r"[a-z]+")(text)
    assert "".join(pieces) == text
    expected = {
        "ab 12 cd": ["ab", " 12 ", "cd"],
        "12 ab!": ["12 ", "ab", "!"],
        "ab": ["ab"],
        " ": [" "],
        "": [],
    }[text]
    assert pieces == expected


def test_capturing_groups_do_not_change_pieces():
    # findall would return the groups ("a", "bc"); the pieces are whole matches.
    assert pre_splitter(r"([a-z])([a-z]*)")("abc de") == ["abc", " ", "de"]
    assert pre_splitter(r"(x)y")("xyz") == ["xy", "z"]


@pytest.mark.parametrize("pattern", PARTIAL_PATTERNS)
@pytest.mark.parametrize("text", TEXTS)
def test_pieces_always_add_up_to_the_text(pattern, text):
    assert "".join(pre_splitter(pattern)(text)) == text


@settings(max_examples=150, deadline=None)
@given(st.text(), st.sampled_from(PARTIAL_PATTERNS))
def test_pieces_add_up_on_random_text(text, pattern):
    assert "".join(pre_splitter(pattern)(text)) == text


@pytest.mark.parametrize(
    "pattern", [GPT2_PATTERN, CL100K_PATTERN, O200K_PATTERN], ids=["gpt2", "cl100k", "o200k"]
)
def test_builtin_patterns_give_findall_pieces(pattern, corpus):
    # They cover all text, so the pieces (and the ids) are exactly those of findall, as before.
    sample = corpus[:120_000]
    assert pre_splitter(pattern)(sample) == compile_pattern(pattern).findall(sample)


@pytest.mark.parametrize(
    "pattern", [GPT2_PATTERN, CL100K_PATTERN, O200K_PATTERN], ids=["gpt2", "cl100k", "o200k"]
)
def test_builtin_patterns_cover_every_code_point(pattern):
    # The BMP and the assigned part of the supplementary planes, shuffled so that every class meets every
    # other (surrogates excluded: encode replaces them first).
    chars = [chr(c) for c in (*range(0xD800), *range(0xE000, 0x10000), *range(0x10000, 0x32000, 3))]
    random.Random(0).shuffle(chars)
    text = "".join(chars)
    assert "".join(compile_pattern(pattern).findall(text)) == text


@settings(max_examples=300, deadline=None)
@given(st.text(), st.sampled_from([GPT2_PATTERN, CL100K_PATTERN, O200K_PATTERN]))
def test_builtin_patterns_cover_random_text(text, pattern):
    # pre_splitter returns findall itself for these: that is only lossless if they never skip a character.
    assert "".join(compile_pattern(pattern).findall(text)) == text


@pytest.mark.parametrize("pattern", [p for p in PARTIAL_PATTERNS if p not in EMPTY_ONLY])
def test_round_trip_with_partial_patterns(cl100k, pattern):
    tok = BPETokenizer(cl100k.ranks, pattern)
    whole = BPETokenizer(cl100k.ranks, None)
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        # Each piece is merged on its own: the ids are the pieces' ids, concatenated.
        assert ids == [i for piece in pre_splitter(pattern)(text) for i in whole.encode(piece)]


def test_partial_pattern_matches_tiktoken_with_the_covering_pattern(tiktoken_cl100k):
    # r"[a-z]+" with its gaps isolated splits like r"[a-z]+|[^a-z]+", which covers the text in tiktoken too.
    ranks = tiktoken_cl100k._mergeable_ranks
    theirs = tiktoken.Encoding("cover", pat_str=r"[a-z]+|[^a-z]+", mergeable_ranks=ranks, special_tokens={})
    ours = BPETokenizer(ranks, r"[a-z]+")
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode_ordinary(text)


def test_training_keeps_uncovered_text():
    # Digits are not matched by the pattern; they are still training pieces and still encode.
    tok = BPETokenizer.train("abc 123 123 123 abc", 300, pattern=r"[a-z]+")
    assert any(b"123" in tok.token_bytes(new) for _, new in tok.merges)
    assert len(tok.encode(" 123 123 123 ")) == 1  # the uncovered stretch was one training piece
    assert tok.decode(tok.encode("abc 123 x")) == "abc 123 x"
