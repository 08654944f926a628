"""Byte-pair merging: long single pieces and tie-breaking, against tiktoken's own merge loop."""

from __future__ import annotations

import random
import time

import pytest

from netcl.text import BPETokenizer
from netcl.text.merge import SCAN_MAX_BYTES, byte_pair_split, queue_split, scan_split

tiktoken = pytest.importorskip("tiktoken")

#: Matches the whole text: every case below is one piece on both sides.
WHOLE = r"(?s:.+)"


def _random_text(rng: random.Random, alphabet: str, size: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(size))


def _long_pieces() -> dict[str, str]:
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéßøжщ漢字かな"
    return {
        "repeated-word": "abcdefgh" * 2500,
        "random-letters": _random_text(rng, letters, 12_000),
        "dna": _random_text(rng, "ACGT", 20_000),
        "one-char": "a" * 20_000,
        "punctuation": _random_text(rng, "!\"#$%&'()*+,-./:;<=>?@[]^_`{|}~", 8_000),
        "spaces": " " * 5_000,
    }


@pytest.mark.parametrize("name", list(_long_pieces()))
def test_long_single_piece_matches_tiktoken(cl100k, tiktoken_cl100k, name):
    text = _long_pieces()[name]
    assert len(cl100k._split(text)) == 1, "the case must be one pre-split piece"
    cl100k.clear_cache()
    assert cl100k.encode_ordinary(text) == tiktoken_cl100k.encode_ordinary(text)


def test_long_random_code_points_match_tiktoken(tiktoken_cl100k):
    # Any code point (control, combining, emoji, CJK...) as one piece: arbitrary UTF-8 byte sequences.
    rng = random.Random(3)
    ranks = tiktoken_cl100k._mergeable_ranks
    theirs = tiktoken.Encoding("whole", pat_str=WHOLE, mergeable_ranks=ranks, special_tokens={})
    ours = BPETokenizer(ranks, WHOLE)
    for size in (40, 300, 6_000):
        text = "".join(chr(rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0xA0, 0x3000),
                                       rng.randrange(0x1F300, 0x1F700)])) for _ in range(size))  # fmt: skip
        assert ours.encode_ordinary(text) == theirs.encode_ordinary(text)


def test_80kb_piece_is_not_quadratic(cl100k, tiktoken_cl100k):
    # The linear scan took ~41 s here; the queue takes ~0.1 s. The bound only catches a return to O(n^2).
    text = "abcdefgh" * 10_000
    cl100k.clear_cache()
    t0 = time.perf_counter()
    ids = cl100k.encode_ordinary(text)
    assert time.perf_counter() - t0 < 5.0
    assert ids == tiktoken_cl100k.encode_ordinary(text)


#: Toy vocabularies whose merges overlap ("aa" in "aaa") and where a merge can make a pair that ranks
#: below the merge that made it ("ab"+"c" = "abc" ranks below "bc"), which the queue treats specially.
TOY_EXTRAS = [
    {b"aa": 256},
    {b"ab": 300, b"bc": 301, b"abc": 299, b"cab": 298, b"ca": 302, b"bca": 297, b"aa": 303, b"aaa": 296},
    {b"ab": 256, b"ba": 257, b"aa": 258, b"abab": 259, b"aab": 260, b"bb": 261, b"abba": 262},
]


@pytest.mark.parametrize("extra", TOY_EXTRAS, ids=["aa", "lower-rank-child", "overlaps"])
def test_ties_and_merge_order_match_tiktoken(extra):
    ranks = {bytes([b]): b for b in range(256)} | extra
    theirs = tiktoken.Encoding("toy", pat_str=WHOLE, mergeable_ranks=ranks, special_tokens={})
    ours = BPETokenizer(ranks, WHOLE)
    rng = random.Random(11)
    for size in (3, 5, 17, SCAN_MAX_BYTES - 1, SCAN_MAX_BYTES, 40, 130, 1000):
        for _ in range(40):
            text = _random_text(rng, "abc", size)
            assert ours.encode_ordinary(text) == theirs.encode_ordinary(text), text


def test_leftmost_wins_among_equal_ranks():
    # "aa" occurs at 0 and 1 in "aaa": tiktoken merges the leftmost, so "aa"+"a", never "a"+"aa".
    ranks = {bytes([b]): b for b in range(256)} | {b"aa": 256}
    assert byte_pair_split(b"aaa", ranks) == [0, 2, 3]
    assert queue_split(b"aaa", ranks) == [0, 2, 3]
    assert queue_split(b"a" * 7, ranks) == [0, 2, 4, 6, 7]
    theirs = tiktoken.Encoding("toy", pat_str=WHOLE, mergeable_ranks=ranks, special_tokens={})
    assert theirs.encode_ordinary("aaa") == [256, ord("a")]


def test_scan_and_queue_agree_with_shared_ranks():
    # Two byte strings with one rank (allowed in merge priorities): order is (rank, position) in both.
    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 300, b"bc": 300, b"abc": 299, b"ca": 299}
    rng = random.Random(5)
    for _ in range(500):
        piece = _random_text(rng, "abc", rng.randrange(0, 80)).encode()
        assert queue_split(piece, ranks) == scan_split(piece, ranks), piece
