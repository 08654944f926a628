"""BPE tokenizer: regex pre-splitting, rank-based merging, special tokens, train/save/load; byte-level, or
SentencePiece-style (byte fallback, ``▁`` for spaces) as loaded from Llama 2 / TinyLlama files.

Token ids are ranks (tiktoken's convention): the id of a multi-byte token is also its merge priority.
"""

from __future__ import annotations

import itertools
import operator
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import regex

from . import formats
from .errors import SpecialTokenError, TokenIdTypeError, UnknownTokenError
from .merge import byte_pair_split
from .patterns import named_or_regex, pre_splitter, tokenizer_pattern
from .training import learn_merges

AllowedSpecial = Literal["none_raise", "none", "all"] | Iterable[str]

#: Default bound on the chunk -> ids cache (entries). When full the cache is emptied and refilled.
DEFAULT_CACHE_SIZE = 200_000


def _is_int(value: object) -> bool:
    """A Python int that is not a bool (True == 1 would pass for an id or a size otherwise)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _special_regex(tokens: Iterable[str]) -> regex.Pattern:
    # Longest first so that a token that is a prefix of another never wins the alternation.
    ordered = sorted(tokens, key=lambda t: (-len(t), t))
    return regex.compile("|".join(regex.escape(t) for t in ordered))


class BPETokenizer:
    """Byte-level BPE: text -> pre-split chunks (regex) -> UTF-8 bytes -> merges by rank -> ids.

    With ``byte_fallback`` and ``metaspace`` the same engine is a SentencePiece-style BPE (see those
    arguments; `from_hf` and `from_sentencepiece` set them).

    Args:
        ranks: token bytes -> id. Must contain all 256 single bytes. Ids of merged tokens are their merge
            priority: inside a chunk the adjacent pair whose concatenation has the lowest id merges first
            (leftmost on ties), exactly tiktoken's ``byte_pair_merge``.
        pattern: pre-split regex source, a name from ``NAMED_PATTERNS`` ('gpt2', 'cl100k', 'o200k'), or
            None for no pre-splitting (the whole text between special tokens is one chunk). Text that no
            match covers becomes a chunk of its own, so no character is ever dropped.
        special_tokens: control-token string -> id; ids must not collide with ``ranks``.
        name: free-form label.
        merges: optional ``[((left_id, right_id), new_id), ...]`` kept for inspection (set by `train`).
        merge_priority: optional bytes -> priority used for merging when it differs from the id
            (Hugging Face files whose ids do not follow merge order). Defaults to ``ranks``.
        cache_size: bound on the chunk -> ids cache.
        byte_fallback: SentencePiece-style BPE: byte value (0..255) -> id of its ``<0xAB>`` token, for all
            256 bytes. Then ``ranks`` need not hold the single bytes; merging works on characters (each
            single-character token is whole before any merge, as Hugging Face's BPE starts from characters)
            and a character outside the vocabulary becomes its UTF-8 bytes' fallback ids.
        metaspace: SentencePiece's spaces, for tokenizers whose vocab writes a space as ``▁`` (stored here as
            a space): a ``▁`` in the text is a space, and each text segment (the text between special tokens)
            gets a space in front: ``"prepend"`` always (a Prepend normalizer), ``"always"`` unless it starts
            with one (Metaspace pre-tokenizer), ``"first"`` likewise but only for the segment that starts the
            text, ``"never"``. `decode` drops one leading space unless ``"never"``. None: no such handling.
        bos_token: the special token a Hugging Face post-processor puts before the text (``<s>``); `encode`
            adds it with ``add_bos=True``.
    """

    def __init__(
        self,
        ranks: Mapping[bytes, int],
        pattern: str | None,
        special_tokens: Mapping[str, int] | None = None,
        *,
        name: str = "",
        merges: Sequence[tuple[tuple[int, int], int]] | None = None,
        merge_priority: Mapping[bytes, int] | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
        byte_fallback: Mapping[int, int] | None = None,
        metaspace: str | None = None,
        bos_token: str | None = None,
    ) -> None:
        if not isinstance(ranks, Mapping):
            raise TypeError(f"ranks must be a mapping bytes -> int, got {type(ranks).__name__}")
        self._encoder: dict[bytes, int] = {}
        self._decoder: dict[int, bytes] = {}
        for token, rank in ranks.items():
            if not isinstance(token, bytes) or not _is_int(rank) or rank < 0:
                raise TypeError(f"ranks must map bytes to non-negative int, got {token!r} -> {rank!r}")
            if not token:
                raise ValueError(
                    f"ranks maps the empty byte string to id {rank}; a token needs at least one byte"
                )
            if rank in self._decoder:
                raise ValueError(
                    f"ranks has duplicate ids: {self._decoder[rank]!r} and {token!r} both have id {rank}; "
                    "every token needs its own id"
                )
            self._encoder[token] = rank
            self._decoder[rank] = token
        self._byte_fallback = _check_byte_fallback(byte_fallback, self._decoder)
        missing = [b for b in range(256) if bytes([b]) not in self._encoder and self._byte_fallback is None]
        if missing:
            raise ValueError(
                f"byte-level BPE needs all 256 single bytes in ranks; {len(missing)} missing "
                f"(first: {missing[0]:#04x})"
            )
        if special_tokens is None:
            special_tokens = {}
        if not isinstance(special_tokens, Mapping):
            raise TypeError(
                f"special_tokens must be a mapping str -> int id, got {type(special_tokens).__name__}"
            )
        self._special: dict[str, int] = {}
        special_by_id: dict[int, str] = {}
        for token, tid in special_tokens.items():
            if not isinstance(token, str) or not token:
                raise TypeError(f"special tokens must be non-empty str, got {token!r}")
            if not _is_int(tid) or tid < 0:
                raise TypeError(f"special token {token!r} needs a non-negative int id, got {tid!r}")
            if tid in special_by_id:
                raise ValueError(
                    f"two special tokens share an id: {special_by_id[tid]!r} and {token!r} -> {tid}"
                )
            if tid in self._decoder:
                raise ValueError(
                    f"special token {token!r} id {tid} collides with an ordinary token id "
                    f"(token {self._decoder[tid]!r})"
                )
            special_by_id[tid] = token
            self._special[token] = tid
        for tid, token in special_by_id.items():
            self._decoder[tid] = token.encode("utf-8")
        self._priority = self._encoder if merge_priority is None else _check_priority(merge_priority, ranks)
        if self._byte_fallback is not None:
            for byte, tid in self._byte_fallback.items():
                if tid in special_by_id:
                    raise ValueError(
                        f"byte_fallback id {tid} (byte {byte:#04x}) is also the special token "
                        f"{special_by_id[tid]!r}"
                    )
                self._decoder[tid] = bytes([byte])
            self._priority = _with_whole_characters(self._priority, self._encoder)
        if metaspace is not None and metaspace not in formats.METASPACE_SCHEMES:
            raise ValueError(
                f"metaspace must be None or one of {formats.METASPACE_SCHEMES}, got {metaspace!r}"
            )
        self.metaspace = metaspace
        if bos_token is not None and bos_token not in self._special:
            raise ValueError(f"bos_token {bos_token!r} is not one of the special tokens")
        self.bos_token = bos_token
        self.pattern = tokenizer_pattern(pattern)
        self._split = pre_splitter(self.pattern)
        if not isinstance(name, str):
            raise TypeError(f"name must be str, got {type(name).__name__}")
        self.name = name
        self.merges = _check_merges(merges, self._encoder) if merges is not None else None
        if not _is_int(cache_size):
            raise TypeError(f"cache_size must be an int number of entries, got {cache_size!r}")
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self._cache: dict[str, tuple[int, ...]] = {}
        self._cache_size = cache_size
        self._special_regexes: dict[frozenset[str], regex.Pattern] = {}

    # ------------------------------------------------------------------ vocabulary

    @property
    def n_vocab(self) -> int:
        """One past the largest id (ordinary or special): the embedding table size a model needs."""
        return max(self._decoder) + 1

    @property
    def special_tokens(self) -> dict[str, int]:
        """A copy of the special-token string -> id map."""
        return dict(self._special)

    @property
    def ranks(self) -> dict[bytes, int]:
        """A copy of the ordinary token bytes -> id map."""
        return dict(self._encoder)

    def token_bytes(self, token_id: int) -> bytes:
        """Bytes of one token (a special token's UTF-8 string)."""
        return self.decode_bytes([token_id])

    def special_id(self, token: str) -> int:
        """Id of a special token, with an error listing the known ones if it is absent."""
        try:
            return self._special[token]
        except KeyError:
            known = ", ".join(sorted(self._special)) or "none"
            raise KeyError(f"special token {token!r} is not in this tokenizer (has: {known})") from None

    def __repr__(self) -> str:
        return (
            f"BPETokenizer(name={self.name!r}, n_vocab={self.n_vocab}, "
            f"specials={len(self._special)}, pattern={'None' if self.pattern is None else 'set'})"
        )

    # ------------------------------------------------------------------ encoding

    def _encode_chunk(self, chunk: str) -> tuple[int, ...]:
        data = chunk.encode("utf-8")
        tid = self._encoder.get(data)
        fallback = self._byte_fallback
        if tid is not None and (fallback is None or len(chunk) == 1 or data in self._priority):
            # (with byte fallback, a whole chunk is a token only where merging can make it, as in
            # Hugging Face's BPE without ignore_merges)
            ids: tuple[int, ...] = (tid,)
        elif fallback is None:
            starts = byte_pair_split(data, self._priority)
            encoder = self._encoder
            ids = tuple([encoder[data[s:e]] for s, e in itertools.pairwise(starts)])
        else:
            parts = [data[s:e] for s, e in itertools.pairwise(byte_pair_split(data, self._priority))]
            get = self._encoder.get
            out: list[int] = []
            for part in parts:
                tid = get(part)
                if tid is None:  # a character outside the vocabulary (or a piece of one): its bytes
                    out.extend([fallback[b] for b in part])
                else:
                    out.append(tid)
            ids = tuple(out)
        cache = self._cache
        if len(cache) >= self._cache_size:
            cache.clear()
        cache[chunk] = ids
        return ids

    def clear_cache(self) -> None:
        """Forget the chunk -> ids cache (results never depend on it; benchmarks use this for cold runs)."""
        self._cache.clear()

    def encode_ordinary(self, text: str, *, at_start: bool = True) -> list[int]:
        """Encode ``text`` with every special-token string treated as plain text.

        Lone surrogates (not encodable as UTF-8) are replaced by U+FFFD first, as tiktoken does.
        ``at_start``: the text starts the input (metaspace "first" puts a space before it only then).
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        return self._encode_segment(text, at_start)

    def _encode_segment(self, text: str, first: bool) -> list[int]:
        """`encode_ordinary` of one segment; ``first``: it starts the text (for metaspace "first")."""
        try:
            return self._encode_ordinary(text, first)
        except UnicodeEncodeError:
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            return self._encode_ordinary(text, first)

    def _encode_ordinary(self, text: str, first: bool = True) -> list[int]:
        if not text:
            return []
        scheme = self.metaspace
        if scheme is not None:
            text = text.replace(formats.METASPACE, " ")
            if scheme == "prepend" or (
                (scheme == "always" or (scheme == "first" and first)) and not text.startswith(" ")
            ):
                text = " " + text
        chunks = self._split(text)
        out: list[int] = []
        extend = out.extend
        get = self._cache.get
        encode_chunk = self._encode_chunk
        for chunk in chunks:
            ids = get(chunk)
            if ids is None:
                ids = encode_chunk(chunk)
            extend(ids)
        return out

    def _special_sets(self, allowed_special: AllowedSpecial) -> tuple[frozenset[str], frozenset[str]]:
        """(tokens to emit as control tokens, tokens whose presence is an error)."""
        everything = frozenset(self._special)
        if isinstance(allowed_special, str):
            if allowed_special == "none_raise":
                return frozenset(), everything
            if allowed_special == "none":
                return frozenset(), frozenset()
            if allowed_special == "all":
                return everything, frozenset()
            hint = (
                f"; to allow that one token pass {{{allowed_special!r}}}"
                if allowed_special in self._special
                else ""
            )
            raise ValueError(
                f"allowed_special must be 'none_raise', 'none', 'all' or a set of special-token strings, "
                f"got {allowed_special!r}{hint}"
            )
        try:
            allowed = frozenset(allowed_special)
        except TypeError:
            raise TypeError(
                f"allowed_special must be 'none_raise', 'none', 'all' or a set of str, "
                f"got {type(allowed_special).__name__}"
            ) from None
        for token in allowed:
            if not isinstance(token, str):
                raise TypeError(
                    f"allowed_special holds {token!r}, a {type(token).__name__}; special tokens are str"
                )
        unknown = allowed - everything
        if unknown:
            known = ", ".join(sorted(everything)) or "none"
            raise ValueError(
                f"allowed_special names tokens this tokenizer lacks: {sorted(unknown)} (it has: {known})"
            )
        return allowed, everything - allowed

    def _regex_for(self, tokens: frozenset[str]) -> regex.Pattern:
        pat = self._special_regexes.get(tokens)
        if pat is None:
            pat = self._special_regexes[tokens] = _special_regex(tokens)
        return pat

    def encode(
        self, text: str, *, allowed_special: AllowedSpecial = "none_raise", add_bos: bool = False
    ) -> list[int]:
        """Encode ``text`` to ids; ``add_bos`` puts `bos_token` first (as Hugging Face's post-processor).

        ``allowed_special`` says what a special-token string inside ``text`` becomes:

        - ``"none_raise"`` (default): raise `SpecialTokenError` if any special-token string occurs
          (tiktoken's ``disallowed_special="all"``), so untrusted text can't smuggle in control tokens;
        - ``"none"``: encode every occurrence as plain text (same as `encode_ordinary`);
        - ``"all"``: every special-token string becomes its control id;
        - a set of strings: those become control ids, any other special-token string raises.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        if add_bos:
            if self.bos_token is None:
                raise ValueError(
                    f"add_bos=True but tokenizer {self.name!r} has no bos_token (its file's post-processor "
                    "adds none)"
                )
            return [self._special[self.bos_token], *self.encode(text, allowed_special=allowed_special)]
        allowed, disallowed = self._special_sets(allowed_special)
        if disallowed:
            found = self._regex_for(disallowed).search(text)
            if found:
                raise SpecialTokenError(found.group(), found.start())
        if not allowed:
            return self.encode_ordinary(text)
        out: list[int] = []
        start = 0
        for match in self._regex_for(allowed).finditer(text):
            out.extend(self._encode_segment(text[start : match.start()], start == 0))
            out.append(self._special[match.group()])
            start = match.end()
        out.extend(self._encode_segment(text[start:], start == 0))
        return out

    def encode_batch(
        self, texts: Sequence[str], *, allowed_special: AllowedSpecial = "none_raise"
    ) -> list[list[int]]:
        """Encode each text, in order, in this thread.

        No thread pool: the merge loop is Python holding the GIL, so threads would add overhead without
        parallelism. For many cores, split the batch across processes.
        """
        if isinstance(texts, str):
            raise TypeError("encode_batch takes a sequence of str; use encode() for a single str")
        try:
            texts = list(texts)
        except TypeError:
            raise TypeError(f"encode_batch takes a sequence of str, got {type(texts).__name__}") from None
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] must be str, got {type(text).__name__}")
        return [self.encode(text, allowed_special=allowed_special) for text in texts]

    # ------------------------------------------------------------------ decoding

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Exact bytes of ``ids`` concatenated (special tokens as their UTF-8 strings).

        ``ids``: Python ints, NumPy integer scalars, or a 1-D integer array. A float, a bool or any other
        non-integer raises `TokenIdTypeError` (a TypeError), an id outside the vocabulary
        `UnknownTokenError`.
        """
        ids = _token_ids(ids)
        decoder = self._decoder
        try:
            return b"".join([decoder[i] for i in ids])
        except KeyError:
            for pos, tid in enumerate(ids):
                if tid not in decoder:
                    raise UnknownTokenError(
                        f"token id {tid!r} at position {pos} is not in the vocabulary "
                        f"(ids are in 0..{self.n_vocab - 1}, {len(decoder)} of them assigned)"
                    ) from None
            raise

    def decode(self, ids: Iterable[int]) -> str:
        """Decode to str; byte sequences that are not valid UTF-8 become U+FFFD (errors='replace').

        With `metaspace` (other than "never") one leading space, the one encoding puts before the text, is
        dropped (Hugging Face's Strip / Metaspace decoder).
        """
        text = self.decode_bytes(ids).decode("utf-8", errors="replace")
        if self.metaspace not in (None, "never") and text.startswith(" "):
            return text[1:]
        return text

    # ------------------------------------------------------------------ training

    @classmethod
    def train(
        cls,
        text_or_files: str | os.PathLike | Iterable[str | os.PathLike],
        vocab_size: int,
        *,
        pattern: str | None = "cl100k",
        special_tokens: Iterable[str] = (),
        verbose: bool = False,
        progress: bool = False,
        name: str = "",
    ) -> BPETokenizer:
        """Learn a byte-level BPE vocabulary of ``vocab_size`` ids (256 bytes + merges + specials).

        ``text_or_files``: a str is the training text itself (one that names an existing file is refused:
        pass a path); a path (``os.PathLike``) or an iterable of paths names UTF-8 files. The text is
        pre-split with ``pattern``; identical chunks are counted once with their frequency. Special-token
        strings are cut out of the text so they are never learned.
        Ids: 0..255 are the bytes, then merges in order, then the special tokens in the order given
        (right after the last learned token if training ran out of pairs early). Tie rule: see
        `learn_merges` (highest count, then smallest (left id, right id)).
        """
        if isinstance(special_tokens, (str, bytes)):
            raise TypeError(
                f"special_tokens must be an iterable of str, got the single {type(special_tokens).__name__} "
                f"{special_tokens!r}; wrap it in a list"
            )
        try:
            specials = list(special_tokens)
        except TypeError:
            raise TypeError(
                f"special_tokens must be an iterable of non-empty str, got {type(special_tokens).__name__}"
            ) from None
        for token in specials:
            if not isinstance(token, str) or not token:
                raise TypeError(f"special_tokens must be non-empty str, got {token!r}")
        if len(set(specials)) != len(specials):
            raise ValueError(f"special_tokens has duplicates: {specials}")
        if not _is_int(vocab_size):
            raise TypeError(
                f"vocab_size must be int, got {type(vocab_size).__name__} {vocab_size!r} "
                "(sizes are never rounded)"
            )
        if vocab_size < 256 + len(specials):
            raise ValueError(
                f"vocab_size {vocab_size} is smaller than 256 byte tokens + {len(specials)} special tokens "
                f"= {256 + len(specials)}"
            )
        if not isinstance(name, str):
            raise TypeError(f"name must be str, got {type(name).__name__}")
        pattern = named_or_regex(pattern)
        split = pre_splitter(pattern)
        cutter = _special_regex(specials) if specials else None
        counts: Counter[str] = Counter()
        for text in _iter_texts(text_or_files):
            for part in cutter.split(text) if cutter is not None else (text,):
                counts.update(split(part))
        chunk_counts: Counter[bytes] = Counter()
        for chunk, count in counts.items():
            chunk_counts[chunk.encode("utf-8", "replace")] += count
        vocab = [bytes([b]) for b in range(256)]
        merges = learn_merges(
            chunk_counts, vocab, vocab_size - 256 - len(specials), progress=progress, verbose=verbose
        )
        ranks = {token: i for i, token in enumerate(vocab)}
        special_ids = {token: len(vocab) + i for i, token in enumerate(specials)}
        return cls(ranks, pattern, special_ids, name=name, merges=merges)

    # ------------------------------------------------------------------ files

    def _check_byte_level(self, method: str) -> None:
        if self._byte_fallback is not None or self.metaspace is not None:
            raise ValueError(
                f"{method}() writes byte-level BPE; tokenizer {self.name!r} is SentencePiece-style (byte "
                "fallback, ▁ for spaces), which these formats cannot hold: keep the tokenizer.json it came "
                "from"
            )

    def save(self, path: str | os.PathLike) -> None:
        """Write netcl's JSON format (see `formats.write_netcl`)."""
        self._check_byte_level("save")
        formats.write_netcl(path, self._encoder, self.pattern, self._special, self.name, self.merges)

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a file written by `save`."""
        data = formats.read_netcl(path)
        return cls(data.ranks, data.pattern, data.special_tokens, name=data.name, merges=data.merges)

    def save_tiktoken(self, path: str | os.PathLike) -> None:
        """Write the ordinary ranks as a ``.tiktoken`` file (pattern and specials are not part of it)."""
        self._check_byte_level("save_tiktoken")
        formats.write_tiktoken(path, self._encoder)

    @classmethod
    def from_tiktoken(
        cls,
        path: str | os.PathLike,
        *,
        pattern: str | None,
        special_tokens: Mapping[str, int] | None = None,
        name: str = "",
    ) -> BPETokenizer:
        """Load a ``.tiktoken`` rank file; the pattern and special tokens must be given (the file lacks
        them)."""
        pattern = named_or_regex(pattern)
        return cls(formats.read_tiktoken(path), pattern, special_tokens, name=name or Path(path).stem)

    def save_hf(self, path: str | os.PathLike) -> None:
        """Write a Hugging Face ``tokenizer.json`` (byte-level BPE, merges derived from the ranks)."""
        self._check_byte_level("save_hf")
        formats.write_hf(path, self._encoder, self.pattern, self._special)

    @classmethod
    def from_sentencepiece(cls, path: str | os.PathLike, *, name: str = "") -> BPETokenizer:
        """Load a SentencePiece ``tokenizer.model`` (BPE with byte fallback, as Llama 2's; see
        `formats.read_sentencepiece`)."""
        return cls._from_data(formats.read_sentencepiece(path), name)

    @classmethod
    def from_hf(cls, path: str | os.PathLike, *, name: str = "") -> BPETokenizer:
        """Load a Hugging Face byte-level BPE ``tokenizer.json``; added tokens become special tokens."""
        return cls._from_data(formats.read_hf(path), name)

    @classmethod
    def _from_data(cls, data: formats.TokenizerData, name: str) -> BPETokenizer:
        """The tokenizer a file reader of `formats` described (ranks, pattern, special tokens and options)."""
        return cls(
            data.ranks,
            data.pattern,
            data.special_tokens,
            name=name or data.name,
            merge_priority=data.merge_priority,
            byte_fallback=data.byte_fallback,
            metaspace=data.metaspace,
            bos_token=data.bos_token,
        )


def _token_ids(ids: Iterable[int]) -> list[int]:
    """``ids`` as a list of Python ints; anything that is not an integer raises, naming it and where it is."""
    if isinstance(ids, (str, bytes, bytearray)):
        raise TypeError(
            f"decode takes a sequence of int token ids, got {type(ids).__name__}; "
            "to turn text into ids use encode()"
        )
    dtype = getattr(ids, "dtype", None)
    kind = getattr(dtype, "kind", None)
    if kind is not None and hasattr(ids, "tolist"):  # a NumPy array (or alike): check the dtype once
        if kind not in ("i", "u"):
            raise TokenIdTypeError(f"token ids must be integers; got an array of dtype {dtype}")
        if getattr(ids, "ndim", 1) != 1:
            raise TypeError(f"token ids must be a 1-D array, got shape {getattr(ids, 'shape', '?')}")
        return ids.tolist()
    try:
        ids = list(ids)
    except TypeError:
        raise TypeError(f"decode takes an iterable of int token ids, got {type(ids).__name__}") from None
    if set(map(type, ids)) <= {int}:
        return ids
    checked = []
    for pos, tid in enumerate(ids):
        if not isinstance(tid, bool):
            try:
                checked.append(operator.index(tid))  # int subclasses, NumPy integer scalars
                continue
            except TypeError:
                pass
        raise TokenIdTypeError(
            f"token id {tid!r} at position {pos} is a {type(tid).__name__}, not an integer; "
            "decode takes int ids (Python int, NumPy integer scalars or an integer array)"
        )
    return checked


def _check_priority(priority: Mapping[bytes, int], ranks: Mapping[bytes, int]) -> dict[bytes, int]:
    if not isinstance(priority, Mapping):
        raise TypeError(f"merge_priority must be a mapping bytes -> int, got {type(priority).__name__}")
    checked: dict[bytes, int] = {}
    for token, value in priority.items():
        if not isinstance(token, bytes) or not _is_int(value):
            raise TypeError(f"merge_priority must map bytes to int, got {token!r} -> {value!r}")
        if token not in ranks:
            raise ValueError(
                f"merge_priority has {token!r}, which is not in ranks: merging may only make tokens "
                "the vocabulary has"
            )
        checked[token] = value
    return checked


def _check_byte_fallback(
    fallback: Mapping[int, int] | None, decoder: Mapping[int, bytes]
) -> dict[int, int] | None:
    if fallback is None:
        return None
    if not isinstance(fallback, Mapping):
        raise TypeError(f"byte_fallback must be a mapping byte -> id, got {type(fallback).__name__}")
    checked: dict[int, int] = {}
    for byte, tid in fallback.items():
        if not (_is_int(byte) and 0 <= byte < 256 and _is_int(tid) and tid >= 0):
            raise TypeError(
                f"byte_fallback must map bytes 0..255 to non-negative int ids, got {byte!r} -> {tid!r}"
            )
        if tid in decoder:
            raise ValueError(
                f"byte_fallback id {tid} (byte {byte:#04x}) is also the id of the token {decoder[tid]!r}"
            )
        checked[byte] = tid
    if len(checked) != 256 or len(set(checked.values())) != 256:
        raise ValueError(
            f"byte_fallback needs 256 distinct ids, one per byte; got {len(checked)} bytes, "
            f"{len(set(checked.values()))} distinct ids"
        )
    return checked


def _with_whole_characters(priority: Mapping[bytes, int], encoder: Mapping[bytes, int]) -> dict[bytes, int]:
    """``priority`` plus, for each single-character token of several UTF-8 bytes, its byte prefixes and
    itself, ranked below every merge: the byte merging engine then first joins the bytes of each known
    character, so merging proceeds on characters (an unknown character stays in pieces, and no key joins a
    piece of a character to anything else)."""
    out = dict(priority)
    below = min(out.values(), default=0) - 1
    for token in encoder:
        if 1 < len(token) <= 4 and len(token.decode("utf-8", "replace")) == 1:
            for end in range(2, len(token) + 1):
                out[token[:end]] = below - end
    return out


def _check_merges(
    merges: Iterable[tuple[tuple[int, int], int]], encoder: Mapping[bytes, int]
) -> list[tuple[tuple[int, int], int]]:
    if isinstance(merges, (str, bytes)) or not isinstance(merges, Iterable):
        raise TypeError(
            f"merges must be a list of ((left_id, right_id), new_id), got {type(merges).__name__}"
        )
    ordinary = set(encoder.values())
    checked = []
    for i, entry in enumerate(merges):
        try:
            (left, right), new = entry
        except (TypeError, ValueError):
            raise TypeError(f"merges[{i}] = {entry!r} is not ((left_id, right_id), new_id)") from None
        for tid in (left, right, new):
            if not _is_int(tid):
                raise TypeError(f"merges[{i}] = {entry!r} holds {tid!r}, which is not an int id")
            if tid not in ordinary:
                raise ValueError(
                    f"merges[{i}] = {entry!r} names id {tid}, which is not an ordinary token's id"
                )
        checked.append(((left, right), new))
    return checked


def _iter_texts(source: str | os.PathLike | Iterable[str | os.PathLike]) -> Iterable[str]:
    if isinstance(source, str):
        if len(source) < 4096 and "\n" not in source and os.path.isfile(source):
            raise ValueError(
                f"text_or_files is the str {source!r}, which names a file: a str is the training text "
                f"itself (this one would train on the file's name); pass Path({source!r}) or [{source!r}] "
                "to train on the file's contents"
            )
        yield source
        return
    if isinstance(source, (bytes, bytearray)):
        raise TypeError(
            f"text_or_files must be a str (the text), a path, or an iterable of paths; got "
            f"{type(source).__name__}: decode bytes to str first"
        )
    paths = [source] if isinstance(source, os.PathLike) else source
    try:
        paths = list(paths)
    except TypeError:
        raise TypeError(
            f"text_or_files must be a str (the text), a path, or an iterable of paths; got "
            f"{type(source).__name__}"
        ) from None
    for path in paths:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"training file list holds a {type(path).__name__}, expected str or path")
        try:
            yield Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"training file {path} is not valid UTF-8: {err}") from err
