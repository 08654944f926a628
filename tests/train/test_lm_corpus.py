"""The LM corpus (netcl/train/corpus.py): file order and split, the cached token ids, the window loader."""

from __future__ import annotations

import math

import numpy as np
import pytest

from netcl.train import corpus as corpus_mod
from netcl.train.corpus import (
    END_OF_TEXT,
    CorpusError,
    TokenWindows,
    build_corpus,
    source_files,
    split_files,
    unigram_entropy,
    validation_windows,
)

FILES = {
    "zeta.py": "def zeta(s):\n    return sum(1 / n ** s for n in range(1, 100))\n",
    "alpha.py": "import os\n\nclass Alpha:\n    def path(self):\n        return os.getcwd()\n",
    "pkg/__init__.py": '"""A package."""\nfrom .core import run\n',
    "pkg/core.py": "def run(x):\n    for i in range(x):\n        print(i, 'ü')\n    return x\n",
    "pkg/util.py": "def helper(a, b):\n    return a + b  # plain\n",
    "crlf.py": "x = 1\r\ny = 2\r\n",
    "site-packages/third.py": "print('not the stdlib')\n",
    "test/test_alpha.py": "assert True\n",
    "pkg/tests/test_core.py": "assert 1\n",
    "notes.txt": "not python\n",
}


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "lib"
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    return root


def test_source_files_are_sorted_by_relative_path_and_skip_tests_and_packages(tree):
    rels = [p.relative_to(tree).as_posix() for p in source_files(tree)]
    assert rels == ["alpha.py", "crlf.py", "pkg/__init__.py", "pkg/core.py", "pkg/util.py", "zeta.py"]


def test_split_is_by_file_deterministic_and_never_empty(tree):
    files = source_files(tree)
    train, val = split_files(tree, files, 0.3)
    assert sorted(train + val) == sorted(files) and not set(train) & set(val)
    assert train and val
    assert (train, val) == split_files(tree, list(files), 0.3)
    # the hash rule: a file's side depends on its own path only, not on the other files
    lone = [f for f in files if f.name != "zeta.py"]
    train2, val2 = split_files(tree, lone, 0.3)
    moved = {f for f in val if f in lone} ^ set(val2)
    assert len(moved) <= 1  # at most the fallback file that keeps a side non-empty
    with pytest.raises(CorpusError, match="at least 2"):
        split_files(tree, files[:1], 0.3)


def test_stdlib_is_the_default_root_and_large():
    files = source_files(corpus_mod.stdlib_root())
    names = {f.relative_to(corpus_mod.stdlib_root()).as_posix() for f in files}
    assert {"os.py", "json/__init__.py", "collections/__init__.py"} <= names
    assert not any("site-packages" in n or n.startswith("test/") for n in names)
    assert len(files) > 300


def test_build_tokenizes_each_file_then_end_of_text_and_caches(tree, tmp_path):
    cache = tmp_path / "cache"
    messages = []
    c = build_corpus(tree, vocab_size=300, val_fraction=0.3, cache_dir=cache, log=messages.append)
    assert len(messages) == 1 and "building" in messages[0]
    eot = c.tokenizer.special_id(END_OF_TEXT)
    train_files, val_files = split_files(tree, source_files(tree), 0.3)
    # decoding the ids gives back each file's text (CRLF normalised), files separated by <|endoftext|>
    expected = "".join(f.read_text(encoding="utf-8").replace("\r\n", "\n") + END_OF_TEXT for f in val_files)
    assert c.tokenizer.decode(c.val.tolist()) == expected
    expected = "".join(f.read_text(encoding="utf-8").replace("\r\n", "\n") + END_OF_TEXT for f in train_files)
    assert c.tokenizer.decode(c.train.tolist()) == expected
    assert int((c.train == eot).sum()) == len(train_files) and c.val[-1] == eot
    assert c.train.dtype == np.uint16 and c.info["train_tokens"] == c.train.size
    assert c.info["train_files"] == len(train_files) and c.info["val_files"] == len(val_files)
    for name in ("<|im_start|>", "<|im_end|>"):
        c.tokenizer.special_id(name)  # reserved for chat fine-tuning
    # the entropies: recomputed from the ids
    counts = np.bincount(c.train, minlength=c.tokenizer.n_vocab)
    p = counts[counts > 0] / counts.sum()
    assert c.info["unigram_entropy_nats"] == pytest.approx(-(p * np.log(p)).sum(), rel=1e-12)
    smoothed = (counts + 1) / (counts.sum() + counts.size)
    assert c.info["unigram_val_loss_nats"] == pytest.approx(-np.log(smoothed[c.val]).mean(), rel=1e-9)
    assert "nats" in c.summary() and "bits" in c.summary()
    # a second build loads the cache (no message), the same ids
    again = build_corpus(tree, vocab_size=300, val_fraction=0.3, cache_dir=cache, log=messages.append)
    assert len(messages) == 1
    assert np.array_equal(again.train, c.train) and np.array_equal(again.val, c.val)
    # changing a file's content is a new corpus
    (tree / "alpha.py").write_text("import sys\n")
    build_corpus(tree, vocab_size=300, val_fraction=0.3, cache_dir=cache, log=messages.append)
    assert len(messages) == 2


def test_unigram_entropy_of_a_known_distribution():
    assert unigram_entropy(np.array([1.0, 1.0, 0.0, 2.0])) == pytest.approx(1.5 * math.log(2))


@pytest.mark.parametrize("kwargs,error,words", [
    ({"vocab_size": 100}, CorpusError, "vocab_size must be in 259..65535"),
    ({"vocab_size": 70000}, CorpusError, "uint16"),
    ({"vocab_size": 300.0}, TypeError, "vocab_size must be an integer"),
    ({"val_fraction": 0.0}, CorpusError, "strictly between 0 and 1"),
    ({"val_fraction": 1.0}, CorpusError, "strictly between 0 and 1"),
    ({"val_fraction": "0.1"}, TypeError, "val_fraction must be a number"),
])
def test_build_refuses_bad_settings(tree, tmp_path, kwargs, error, words):
    with pytest.raises(error, match=words):
        build_corpus(tree, cache_dir=tmp_path / "cache", **kwargs)


def test_build_refuses_a_missing_or_empty_directory(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        build_corpus(tmp_path / "nowhere", cache_dir=tmp_path / "cache")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="0 .py file"):
        build_corpus(tmp_path / "empty", cache_dir=tmp_path / "cache")


def test_windows_are_consecutive_tokens_and_reproducible_after_resume():
    tokens = np.arange(1000, dtype=np.uint16)
    w = TokenWindows(tokens, batch_size=5, context=17, seed=3)
    first = [w.next_batch() for _ in range(4)]
    for b in first:
        assert b.shape == (5, 18) and b.dtype == np.int32
        assert np.array_equal(np.diff(b, axis=1), np.ones((5, 17)))  # consecutive tokens
        assert b.min() >= 0 and b.max() <= 999
    assert not np.array_equal(first[0], first[1])
    state = w.state_dict()
    later = [w.next_batch() for _ in range(2)]
    resumed = TokenWindows(tokens, batch_size=5, context=17, seed=3)
    resumed.load_state_dict(state)
    assert all(np.array_equal(a, b) for a, b in zip(later, [resumed.next_batch() for _ in range(2)]))
    assert np.array_equal(TokenWindows(tokens, 5, 17, seed=4).batch(0).shape, (5, 18))
    assert not np.array_equal(TokenWindows(tokens, 5, 17, seed=4).batch(0), first[0])
    # every start position can be drawn, including the last full window
    ends = np.concatenate([TokenWindows(np.arange(20), 50, 18, seed=0).batch(i)[:, -1] for i in range(5)])
    assert set(ends.tolist()) == {18, 19}


def test_windows_refuse_bad_input_and_foreign_states():
    with pytest.raises(CorpusError, match="cannot fill one window"):
        TokenWindows(np.arange(10), 2, 10)
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        TokenWindows(np.arange(100), 2.0, 10)
    with pytest.raises(ValueError, match="context must be an integer >= 1"):
        TokenWindows(np.arange(100), 2, 0)
    with pytest.raises(TypeError, match="1-D integer array"):
        TokenWindows(np.zeros(100), 2, 10)
    w = TokenWindows(np.arange(100), 2, 10, seed=1)
    with pytest.raises(ValueError, match="context 12, these windows 10"):
        w.load_state_dict({"step": 3, "seed": 1, "batch_size": 2, "context": 12})
    with pytest.raises(ValueError, match="expected"):
        w.load_state_dict({"step": 3})
    assert w.step == 0


def test_validation_windows_are_fixed_and_spread():
    tokens = np.arange(100)
    v = validation_windows(tokens, 9, 4)
    assert v.shape == (4, 10) and v[0, 0] == 0 and v[-1, -1] == 99
    assert np.array_equal(v, validation_windows(tokens, 9, 4))
    assert validation_windows(tokens, 9, 1000).shape == (10, 10)  # no more windows than fit without overlap
    with pytest.raises(CorpusError, match="fewer than one window"):
        validation_windows(np.arange(5), 9, 4)
