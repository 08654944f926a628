"""Incremental BPE training against a from-scratch reference that recounts every pair before each merge."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from netcl.text import BPETokenizer
from netcl.text.patterns import GPT2_PATTERN, compile_pattern
from netcl.text.training import learn_merges

from .conftest import DATA


def reference_merges(chunks: Counter, n_merges: int) -> list[tuple[tuple[int, int], int]]:
    """Naive BPE: recount all pairs each step; best = highest count, then smallest (left, right)."""
    words = [(list(chunk), weight) for chunk, weight in chunks.items()]
    vocab = {bytes([b]): b for b in range(256)}
    by_id = {b: bytes([b]) for b in range(256)}
    merges = []
    grown = 0
    while grown < n_merges:
        counts: Counter = Counter()
        for ids, weight in words:
            for i in range(len(ids) - 1):
                counts[ids[i], ids[i + 1]] += weight
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merged = by_id[best[0]] + by_id[best[1]]
        if merged not in vocab:
            vocab[merged] = len(by_id)
            by_id[len(by_id)] = merged
            grown += 1
        new_id = vocab[merged]
        merges.append((best, new_id))
        for k, (ids, weight) in enumerate(words):
            out, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == best:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            words[k] = (out, weight)
    return merges


def chunk_counts(text: str, pattern: str | None) -> Counter:
    chunks = compile_pattern(pattern).findall(text) if pattern else ([text] if text else [])
    return Counter(c.encode("utf-8") for c in chunks)


def test_matches_reference_on_multilingual_text():
    text = (DATA / "multilingual.txt").read_text(encoding="utf-8")
    counts = chunk_counts(text, GPT2_PATTERN)
    vocab = [bytes([b]) for b in range(256)]
    assert learn_merges(counts, vocab, 150) == reference_merges(counts, 150)
    assert len(vocab) == 256 + 150


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet="ab c\nab", max_size=80) | st.text(max_size=40),
    st.integers(min_value=0, max_value=30),
    st.sampled_from([None, GPT2_PATTERN]),
)
def test_matches_reference_on_random_text(text, n_merges, pattern):
    # The small alphabet makes many ties, overlapping pairs (aaa) and reused ids (ab+c vs a+bc).
    counts = chunk_counts(text, pattern)
    vocab = [bytes([b]) for b in range(256)]
    assert learn_merges(counts, vocab, n_merges) == reference_merges(counts, n_merges)


def test_trained_tokenizer_compresses_and_round_trips():
    text = (DATA / "multilingual.txt").read_text(encoding="utf-8") * 3
    small = BPETokenizer.train(text, 300, pattern="cl100k")
    large = BPETokenizer.train(text, 700, pattern="cl100k")
    ids = large.encode(text)
    assert large.decode(ids) == text
    # More merges, fewer tokens on the training text; every merge saves at least one token.
    assert len(ids) < len(small.encode(text)) < len(text.encode("utf-8")) - 44
