"""The language-model corpus, offline: the Python standard library's own source files, split into
training and validation by file, tokenized with a BPE that netcl.text trains on the training files,
token ids cached on disk; and the loader of random (batch, context + 1) windows `netcl lm-train` uses.

    corpus = build_corpus()                       # the stdlib, vocabulary 4096, cached
    windows = TokenWindows(corpus.train, batch_size=16, context=128, seed=0)
    ids = windows.next_batch()                    # int32 (16, 129): inputs ids[:, :-1], targets ids[:, 1:]
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from netcl import config
from netcl.errors import NetclError
from netcl.text import BPETokenizer

#: The document separator (between files) and the ChatML tokens `netcl chat` needs, reserved in every
#: corpus tokenizer so a model trained on the corpus can be fine-tuned for chat without a new vocabulary.
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = (END_OF_TEXT, "<|im_start|>", "<|im_end|>")
#: Directories of the stdlib tree that are not the library itself: installed third-party packages and
#: the standard library's own test suites (data files and deliberately broken code, mostly).
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
DEFAULT_VOCAB = 4096
DEFAULT_VAL_FRACTION = 0.05
# Bump when the cached layout or anything that changes the ids (pattern, specials, split rule) changes.
CACHE_FORMAT = 1
PATTERN = "cl100k"


class CorpusError(NetclError):
    """The corpus cannot be built: no source files, a split with nothing in it, bad settings."""


def stdlib_root() -> Path:
    """The directory of this interpreter's standard library (`sysconfig`'s 'stdlib' path)."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: str | os.PathLike) -> list[Path]:
    """Every *.py file under `root` outside SKIPPED_DIRS, ordered by relative POSIX path (the same order
    on every machine and file system)."""
    root = Path(root)
    if not root.is_dir():
        raise CorpusError(f"corpus directory {root} does not exist or is not a directory")
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if SKIPPED_DIRS.intersection(rel.parts[:-1]) or not path.is_file():
            continue
        found.append((rel.as_posix(), path))
    return [path for _, path in sorted(found)]


def is_validation(relative_path: str, val_fraction: float) -> bool:
    """Whether a file belongs to the validation split: a hash of its relative path, so the split does not
    move when other files come or go (a new Python version keeps most files on their side)."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") / 2.0**64 < val_fraction


def split_files(
    root: str | os.PathLike, files: list[Path], val_fraction: float
) -> tuple[list[Path], list[Path]]:
    """(training files, validation files), each in `files`' order. When the hash puts no file on one side
    (a tiny corpus), the last file of the other side moves over, so both splits always hold a file."""
    if len(files) < 2:
        raise CorpusError(f"the corpus under {root} has {len(files)} .py file(s); a train/validation split "
                          "by file needs at least 2")
    root = Path(root)
    train, val = [], []
    for f in files:
        (val if is_validation(f.relative_to(root).as_posix(), val_fraction) else train).append(f)
    if not val:
        val.append(train.pop())
    elif not train:
        train.append(val.pop())
    return train, val


def read_source(path: Path) -> str:
    """A source file as text: UTF-8 (Python's default source encoding), undecodable bytes as U+FFFD, and
    newlines normalised to \\n (a CRLF file would otherwise teach the model two kinds of line end)."""
    return path.read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n")


def unigram_entropy(counts: np.ndarray) -> float:
    """Entropy in nats of the unigram distribution `counts` (zero counts ignored)."""
    total = counts.sum()
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())


def unigram_cross_entropy(train_counts: np.ndarray, tokens: np.ndarray) -> float:
    """Mean loss in nats of the best unigram model of the training tokens (add-one smoothing, so an id
    the training split never has costs a finite amount) on `tokens`: the loss a language model that
    ignores context would reach on them."""
    probs = (train_counts + 1.0) / (train_counts.sum() + len(train_counts))
    counts = np.bincount(tokens, minlength=len(train_counts)).astype(np.float64)
    return float(-(counts * np.log(probs)).sum() / max(counts.sum(), 1))


@dataclass
class Corpus:
    """A tokenized corpus: the tokenizer, the two token arrays (memory-mapped from the cache) and what
    was measured when it was built (`info`: files, bytes, tokens, unigram entropies in nats)."""

    tokenizer: BPETokenizer
    train: np.ndarray
    val: np.ndarray
    info: dict[str, Any]
    directory: Path

    def summary(self) -> str:
        i = self.info
        return (
            f"corpus {i['source']}: {i['train_files']} + {i['val_files']} files ({i['bytes'] / 1e6:.1f} MB), "
            f"{i['train_tokens']:,} training + {i['val_tokens']:,} validation tokens, vocabulary "
            f"{i['vocab_size']}; unigram entropy {i['unigram_entropy_nats']:.3f} nats "
            f"({i['unigram_entropy_nats'] / math.log(2):.3f} bits) per token, a unigram model's validation "
            f"loss {i['unigram_val_loss_nats']:.3f} nats"
        )


def _check_settings(vocab_size: Any, val_fraction: Any) -> tuple[int, float]:
    if not isinstance(vocab_size, numbers.Integral) or isinstance(vocab_size, bool):
        raise TypeError(f"vocab_size must be an integer, got {type(vocab_size).__name__} {vocab_size!r}")
    low = 256 + len(SPECIAL_TOKENS)
    if not low <= vocab_size <= 65535:
        raise CorpusError(f"vocab_size must be in {low}..65535 (256 bytes + {len(SPECIAL_TOKENS)} special "
                          f"tokens at least; ids are stored as uint16), got {vocab_size}")
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real):
        raise TypeError(f"val_fraction must be a number, got {type(val_fraction).__name__} {val_fraction!r}")
    if not 0.0 < float(val_fraction) < 1.0:
        raise CorpusError(f"val_fraction must be strictly between 0 and 1, got {val_fraction}")
    return int(vocab_size), float(val_fraction)


def _fingerprint(root: Path, files: list[Path], vocab_size: int, val_fraction: float) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([CACHE_FORMAT, PATTERN, SPECIAL_TOKENS, vocab_size, val_fraction]).encode())
    for f in files:
        h.update(f.relative_to(root).as_posix().encode("utf-8") + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:20]


def _load_cached(directory: Path) -> Corpus:
    info = json.loads((directory / "info.json").read_text())
    dtype = np.dtype(info["dtype"])
    return Corpus(
        tokenizer=BPETokenizer.load(directory / "tokenizer.json"),
        train=np.memmap(directory / "train.bin", dtype=dtype, mode="r"),
        val=np.memmap(directory / "val.bin", dtype=dtype, mode="r"),
        info=info,
        directory=directory,
    )


def _encode_files(tokenizer: BPETokenizer, files: list[Path], eot: int, dtype: np.dtype) -> np.ndarray:
    parts = []
    for f in files:
        parts.append(np.asarray(tokenizer.encode_ordinary(read_source(f)), dtype=dtype))
        parts.append(np.asarray([eot], dtype=dtype))
    return np.concatenate(parts)


def build_corpus(
    root: str | os.PathLike | None = None,
    *,
    vocab_size: int = DEFAULT_VOCAB,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    cache_dir: str | os.PathLike | None = None,
    log: Callable[[str], None] | None = None,
) -> Corpus:
    """The tokenized corpus of the *.py files under `root` (default: the standard library), built once
    and then loaded from `cache_dir` (default NETCL_CACHE_DIR/corpus), keyed by the files' contents and
    the settings. Each file's tokens are followed by <|endoftext|>; the BPE is trained on the training
    split only, so validation text is unseen by the tokenizer too."""
    vocab_size, val_fraction = _check_settings(vocab_size, val_fraction)
    root = Path(root) if root is not None else stdlib_root()
    cache = Path(cache_dir) if cache_dir is not None else config.cache_dir() / "corpus"
    files = source_files(root)
    train_files, val_files = split_files(root, files, val_fraction)
    directory = cache / _fingerprint(root, files, vocab_size, val_fraction)
    if (directory / "info.json").is_file():
        return _load_cached(directory)
    try:  # before the minutes of BPE training, not after
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CorpusError(f"cannot create the corpus cache directory {cache}: {exc.strerror or exc}; pick "
                          "another cache directory") from None
    say = log or (lambda msg: None)
    say(f"building the corpus from {len(files)} files under {root} (once; cached in {directory})")
    # the files joined by the separator, which training cuts out: no merge spans two files
    tokenizer = BPETokenizer.train(
        END_OF_TEXT.join(read_source(f) for f in train_files), vocab_size, pattern=PATTERN,
        special_tokens=SPECIAL_TOKENS, name=f"netcl-corpus-{vocab_size}",
    )
    dtype = np.dtype(np.uint16)
    eot = tokenizer.special_id(END_OF_TEXT)
    train = _encode_files(tokenizer, train_files, eot, dtype)
    val = _encode_files(tokenizer, val_files, eot, dtype)
    counts = np.bincount(train, minlength=tokenizer.n_vocab).astype(np.float64)
    info = {
        "format": CACHE_FORMAT,
        "source": str(root),
        "python": sys.version.split()[0],
        "pattern": PATTERN,
        "vocab_size": tokenizer.n_vocab,
        "val_fraction": val_fraction,
        "train_files": len(train_files),
        "val_files": len(val_files),
        "val_file_names": [f.relative_to(root).as_posix() for f in val_files],
        "bytes": sum(f.stat().st_size for f in files),
        "train_tokens": int(train.size),
        "val_tokens": int(val.size),
        "dtype": dtype.name,
        "unigram_entropy_nats": unigram_entropy(counts),
        "unigram_val_loss_nats": unigram_cross_entropy(counts, val),
    }
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
    try:
        tokenizer.save(staging / "tokenizer.json")
        train.tofile(staging / "train.bin")
        val.tofile(staging / "val.bin")
        (staging / "info.json").write_text(json.dumps(info, indent=1))
        try:
            os.replace(staging, directory)
        except OSError:
            if not (directory / "info.json").is_file():  # not another process's identical build: a real error
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _load_cached(directory)


def _window_count(value: Any, what: str, minimum: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an integer >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class TokenWindows:
    """Random windows of `context + 1` consecutive tokens, `batch_size` per batch, as int32 (B, context+1)
    host arrays: inputs are [:, :-1], targets [:, 1:]. Batch k is a function of (seed, k) only, so a run
    resumed at step k (state_dict holds k) sees exactly the batches an uninterrupted run would."""

    def __init__(self, tokens: np.ndarray, batch_size: int, context: int, seed: int = 0):
        self.batch_size = _window_count(batch_size, "TokenWindows: batch_size", 1)
        self.context = _window_count(context, "TokenWindows: context", 1)
        self.seed = _window_count(seed, "TokenWindows: seed", 0)
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise TypeError(
                f"TokenWindows: tokens must be a 1-D integer array, got {tokens.dtype} {tokens.shape}"
            )
        if tokens.size < self.context + 1:
            raise CorpusError(f"TokenWindows: {tokens.size} tokens cannot fill one window of context "
                              f"{self.context} + 1; use a shorter context or a larger corpus")
        self.tokens = tokens
        self.step = 0

    def batch(self, index: int) -> np.ndarray:
        """Batch number `index` (does not move the loader)."""
        index = _window_count(index, "TokenWindows.batch: index", 0)
        rng = np.random.default_rng([self.seed, index])
        starts = rng.integers(0, self.tokens.size - self.context, size=self.batch_size)
        offsets = np.arange(self.context + 1)
        return self.tokens[starts[:, None] + offsets].astype(np.int32)

    def next_batch(self) -> np.ndarray:
        """The loader's next batch."""
        out = self.batch(self.step)
        self.step += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "seed": self.seed, "batch_size": self.batch_size, "context": self.context}

    def _check_state_dict(self, state: Any) -> dict[str, int]:
        """The checked state; a state of other windows (seed, batch size, context) is refused."""
        if not isinstance(state, Mapping):
            raise TypeError(f"TokenWindows.load_state_dict: state must be a dict, got {type(state).__name__}")
        keys = ("step", "seed", "batch_size", "context")
        if sorted(state) != sorted(keys):
            raise ValueError(f"TokenWindows.load_state_dict: state holds {sorted(map(str, state))}, "
                             f"expected {sorted(keys)}")
        values = {k: _window_count(state[k], f"TokenWindows.load_state_dict: {k}", 0) for k in keys}
        for k in ("seed", "batch_size", "context"):
            if values[k] != getattr(self, k):
                raise ValueError(
                    f"TokenWindows.load_state_dict: the state has {k} {values[k]}, these windows "
                    f"{getattr(self, k)}"
                )
        return values

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = self._check_state_dict(state)["step"]


def validation_windows(tokens: np.ndarray, context: int, max_windows: int) -> np.ndarray:
    """Up to `max_windows` windows of context + 1 tokens spread evenly over `tokens` (int32), the same
    every time: the validation loss of two evaluations is measured on the same text."""
    context = _window_count(context, "validation_windows: context", 1)
    max_windows = _window_count(max_windows, "validation_windows: max_windows", 1)
    tokens = np.asarray(tokens)
    if tokens.size < context + 1:
        raise CorpusError(f"the validation split has {tokens.size} tokens, fewer than one window of context "
                          f"{context} + 1; use a shorter context or a larger validation fraction")
    available = tokens.size // (context + 1)
    count = min(max_windows, available)
    starts = np.linspace(0, tokens.size - context - 1, count).astype(np.int64)
    return tokens[starts[:, None] + np.arange(context + 1)].astype(np.int32)
