"""Tokenizer files: netcl's own JSON, tiktoken ``.tiktoken`` rank files, Hugging Face ``tokenizer.json``.

Readers return plain data (ranks, pattern, special tokens); `BPETokenizer` builds itself from it. Readers
check every field they use and raise `TokenizerFileError` naming the file and the line or field.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import regex

from .errors import TokenizerFileError
from .patterns import GPT2_PATTERN

NETCL_FORMAT = "netcl-bpe"
NETCL_VERSION = 1


@dataclass
class TokenizerData:
    """What a tokenizer file holds, independent of its format."""

    ranks: dict[bytes, int]
    pattern: str | None
    special_tokens: dict[str, int] = field(default_factory=dict)
    name: str = ""
    merges: list[tuple[tuple[int, int], int]] | None = None
    merge_priority: dict[bytes, int] | None = None
    byte_fallback: dict[int, int] | None = None
    metaspace: str | None = None
    bos_token: str | None = None


# ---------------------------------------------------------------------- checks shared by the readers


def _json_type(value: Any) -> str:
    """How a JSON value is called in messages: object, list, string, number, true/false, null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return {dict: "object", list: "list", str: "string", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


def _is_id(value: Any) -> bool:
    """A token id: a non-negative int that is not a bool (JSON true must not pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _collect_ranks(
    path: str | os.PathLike, entries: Iterable[tuple[bytes, int, Any]], describe: Callable[[Any], str]
) -> dict[bytes, int]:
    """Build token bytes -> id from ``(bytes, id, where)``: one id per byte string, one byte string per id,
    no empty token, all 256 single bytes. ``describe(where)`` names the line or field in a message."""
    items = list(entries)
    ranks = {token: tid for token, tid, _ in items}
    if len(ranks) != len(items) or len(set(ranks.values())) != len(items) or b"" in ranks:
        _raise_first_clash(path, items, describe)
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TokenizerFileError(
            f"{path}: {len(missing)} of the 256 single-byte tokens are missing (first: "
            f"{bytes(missing[:1])!r}); "
            "byte-level BPE needs every byte as a token"
        )
    return ranks


def _raise_first_clash(
    path: str | os.PathLike, items: list[tuple[bytes, int, Any]], describe: Callable[[Any], str]
) -> None:
    seen_token: dict[bytes, tuple[int, Any]] = {}
    seen_id: dict[int, tuple[bytes, Any]] = {}
    for token, tid, where in items:
        if not token:
            raise TokenizerFileError(
                f"{path}: {describe(where)}: the empty byte string cannot be a token (id {tid})"
            )
        if token in seen_token:
            other_id, other_where = seen_token[token]
            raise TokenizerFileError(
                f"{path}: {describe(where)} gives the byte string {token!r} id {tid}, but "
                f"{describe(other_where)} "
                f"already gave it id {other_id}: one byte string may have only one id"
            )
        if tid in seen_id:
            other, other_where = seen_id[tid]
            raise TokenizerFileError(
                f"{path}: {describe(where)} gives id {tid} to {token!r}, but {describe(other_where)} already "
                f"gave it to {other!r}: one id may name only one token"
            )
        seen_token[token] = (tid, where)
        seen_id[tid] = (token, where)


def _check_pattern(path: str | os.PathLike, where: str, pattern: Any) -> str:
    if not isinstance(pattern, str):
        raise TokenizerFileError(f"{path}: {where} must be a regex string, got {_json_type(pattern)}")
    try:
        regex.compile(pattern)
    except regex.error as err:
        raise TokenizerFileError(f"{path}: {where} is not a valid regex ({err}): {pattern!r}") from None
    return pattern


def _check_specials(
    path: str | os.PathLike, specials: dict[str, int], where: dict[str, str], ranks: dict[bytes, int]
) -> None:
    """Special tokens: distinct ids that no ordinary token uses."""
    ordinary = {tid: token for token, tid in ranks.items()}
    seen: dict[int, str] = {}
    for token, tid in specials.items():
        if tid in seen:
            raise TokenizerFileError(
                f"{path}: {where[token]} gives id {tid} to the special token {token!r}, but "
                f"{where[seen[tid]]} already gave it to {seen[tid]!r}: one id may name only one token"
            )
        if tid in ordinary:
            raise TokenizerFileError(
                f"{path}: {where[token]}: special token {token!r} has id {tid}, which the ordinary token "
                f"{ordinary[tid]!r} already has"
            )
        seen[tid] = token


class _DuplicateKeys:
    """``object_pairs_hook`` for json.loads that remembers objects with a repeated key (json keeps the last
    silently; a tokenizer file that maps one token to two ids must not load)."""

    def __init__(self) -> None:
        self.found: dict[int, tuple[str, Any, Any]] = {}

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            first: dict[str, Any] = {}
            for key, value in pairs:
                if key in first:
                    self.found[id(obj)] = (key, first[key], value)
                    break
                first[key] = value
        return obj

    def raise_first(self, path: str | os.PathLike, doc: Any) -> None:
        """Raise for the first object (in document order) with a repeated key, naming its field."""
        stack: list[tuple[Any, str]] = [(doc, "")]
        while stack:
            node, where = stack.pop()
            if isinstance(node, dict):
                if id(node) in self.found:
                    key, a, b = self.found[id(node)]
                    field_name = where or "the top-level object"
                    token = _byte_level_bytes(key) if where == "model.vocab" else None
                    meaning = f": two ids for the byte string {token!r}" if token is not None else ""
                    raise TokenizerFileError(
                        f"{path}: {field_name} has the key {key!r} twice (values {a!r} and {b!r}){meaning}; "
                        "each key may appear once"
                    )
                children = [(v, f"{where}.{k}" if where else k) for k, v in node.items()]
            elif isinstance(node, list):
                children = [(v, f"{where}[{i}]") for i, v in enumerate(node)]
            else:
                continue
            stack.extend(reversed(children))


def _load_json(path: str | os.PathLike) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TokenizerFileError(f"{path}: not UTF-8 text ({err})") from err
    duplicates = _DuplicateKeys()
    try:
        doc = json.loads(text, object_pairs_hook=duplicates)
    except json.JSONDecodeError as err:
        raise TokenizerFileError(
            f"{path}: line {err.lineno} column {err.colno}: invalid JSON: {err.msg}"
        ) from err
    except RecursionError:
        raise TokenizerFileError(f"{path}: JSON nested too deeply to be a tokenizer file") from None
    if duplicates.found:
        duplicates.raise_first(path, doc)
    if not isinstance(doc, dict):
        raise TokenizerFileError(f"{path}: the top level must be a JSON object, got {_json_type(doc)}")
    return doc


# ---------------------------------------------------------------------- netcl JSON


def write_netcl(
    path: str | os.PathLike,
    ranks: dict[bytes, int],
    pattern: str | None,
    special_tokens: dict[str, int],
    name: str = "",
    merges: list[tuple[tuple[int, int], int]] | None = None,
) -> None:
    """Write netcl's format: one UTF-8 JSON object.

    ``{"format": "netcl-bpe", "version": 1, "name": str, "pattern": str | null,
    "special_tokens": {str: id}, "tokens": [[id, base64(bytes)], ...] (ascending id),
    "merges": [[left_id, right_id, new_id], ...] | null}``. Token bytes are base64 because they need not
    be valid UTF-8; the merges list is informative (encoding uses the ids as ranks).
    """
    doc = {
        "format": NETCL_FORMAT,
        "version": NETCL_VERSION,
        "name": name,
        "pattern": pattern,
        "special_tokens": dict(special_tokens),
        "tokens": [
            [rank, base64.b64encode(token).decode("ascii")]
            for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])
        ],
        "merges": None if merges is None else [[a, b, new] for (a, b), new in merges],
    }
    Path(path).write_text(json.dumps(doc, ensure_ascii=False, indent=0), encoding="utf-8")


def read_netcl(path: str | os.PathLike) -> TokenizerData:
    """Read a file written by `write_netcl`; errors name the entry that is wrong."""
    doc = _load_json(path)
    if doc.get("format") != NETCL_FORMAT:
        raise TokenizerFileError(f'{path}: not a netcl tokenizer file (expected "format": "{NETCL_FORMAT}")')
    if doc.get("version") != NETCL_VERSION:
        raise TokenizerFileError(
            f"{path}: unsupported version {doc.get('version')!r} (this netcl reads {NETCL_VERSION})"
        )
    tokens = doc.get("tokens")
    if not isinstance(tokens, list):
        raise TokenizerFileError(f'{path}: "tokens" must be a list of [id, base64], got {_json_type(tokens)}')

    def entries() -> Iterable[tuple[bytes, int, int]]:
        for i, entry in enumerate(tokens):
            try:
                rank, b64 = entry
                if not _is_id(rank) or not isinstance(b64, str):
                    raise TypeError
                yield base64.b64decode(b64, validate=True), rank, i
            except (TypeError, ValueError, binascii.Error):
                raise TokenizerFileError(
                    f"{path}: tokens[{i}] = {entry!r} is not [int id, base64 string]"
                ) from None

    ranks = _collect_ranks(path, entries(), lambda i: f"tokens[{i}]")
    pattern = doc.get("pattern")
    if pattern is not None:
        _check_pattern(path, '"pattern"', pattern)
    specials = doc.get("special_tokens", {})
    if not isinstance(specials, dict):
        raise TokenizerFileError(
            f'{path}: "special_tokens" must be an object of str -> id, got {_json_type(specials)}'
        )
    for token, tid in specials.items():
        if not token or not _is_id(tid):
            raise TokenizerFileError(
                f'{path}: "special_tokens" entry {token!r}: {tid!r} must be a non-empty token with a '
                "non-negative int id"
            )
    _check_specials(path, specials, {t: f'"special_tokens"[{t!r}]' for t in specials}, ranks)
    name = doc.get("name", "")
    if not isinstance(name, str):
        raise TokenizerFileError(f'{path}: "name" must be a string, got {_json_type(name)}')
    merges = doc.get("merges")
    if merges is not None:
        if not isinstance(merges, list):
            raise TokenizerFileError(f'{path}: "merges" must be a list of [left, right, new] ids or null')
        known = set(ranks.values())
        for i, entry in enumerate(merges):
            if not (
                isinstance(entry, list) and len(entry) == 3 and all(_is_id(t) and t in known for t in entry)
            ):
                raise TokenizerFileError(
                    f'{path}: "merges"[{i}] = {entry!r} is not [left, right, new] with ids of ordinary tokens'
                )
        merges = [((a, b), new) for a, b, new in merges]
    return TokenizerData(ranks, pattern, specials, name, merges)


# ---------------------------------------------------------------------- tiktoken


def read_tiktoken(path: str | os.PathLike) -> dict[bytes, int]:
    """Read a ``.tiktoken`` file: one ``base64(token) rank`` per line; blank lines are skipped.

    Ranks need not be contiguous (tiktoken does not require it), but each byte string may appear once and
    each rank once, and all 256 single bytes must be there.
    """

    def entries(fh: Iterable[bytes]) -> Iterable[tuple[bytes, int, int]]:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            parts = line.split()
            try:
                if len(parts) != 2:
                    raise ValueError(f"expected 2 fields, got {len(parts)}")
                if not parts[1].isdigit():
                    raise ValueError(
                        f"the rank {parts[1].decode('ascii', 'replace')!r} is not a non-negative integer"
                    )
                token = base64.b64decode(parts[0], validate=True)
            except (ValueError, binascii.Error) as err:
                raise TokenizerFileError(
                    f"{path}: line {lineno}: expected 'base64-token rank', got {line[:80]!r} ({err})"
                ) from None
            yield token, int(parts[1]), lineno

    with open(path, "rb") as fh:
        return _collect_ranks(path, entries(fh), lambda lineno: f"line {lineno}")


def write_tiktoken(path: str | os.PathLike, ranks: dict[bytes, int]) -> None:
    """Write ranks as a ``.tiktoken`` file, ascending rank."""
    lines = [
        base64.b64encode(token) + b" " + str(rank).encode() + b"\n"
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])
    ]
    Path(path).write_bytes(b"".join(lines))


# ---------------------------------------------------------------------- Hugging Face tokenizer.json


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies.

    Printable Latin-1 bytes (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) map to themselves; the other 68
    bytes map, in byte order, to U+0100, U+0101, ... so every token is a string of visible characters.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _byte_level_bytes(token: str) -> bytes | None:
    """The bytes a byte-level vocabulary string stands for; None if a character is outside the alphabet."""
    decode_char = _byte_level_decoder()
    try:
        return bytes([decode_char[ch] for ch in token])
    except KeyError:
        return None


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    return {ch: b for b, ch in bytes_to_unicode().items()}


def _check_bool(path: str | os.PathLike, node: dict, key: str, where: str, default: bool) -> bool:
    value = node.get(key, default)
    if not isinstance(value, bool):
        raise TokenizerFileError(
            f"{path}: {where}.{key} must be true or false, got {_json_type(value)} {value!r}"
        )
    return value


def _pre_tokenizer_parts(
    node: Any, path: str | os.PathLike, where: str
) -> list[tuple[str, str | None, bool]]:
    """Flatten a pre-tokenizer into ``[(where, Split regex or None for ByteLevel, ByteLevel use_regex)]``."""
    if not isinstance(node, dict):
        allowed = "an object or null" if where == "pre_tokenizer" else "an object"
        raise TokenizerFileError(f"{path}: {where} must be {allowed}, got {_json_type(node)}")
    kind = node.get("type")
    if kind == "Sequence":
        children = node.get("pretokenizers")
        if not isinstance(children, list):
            raise TokenizerFileError(
                f"{path}: {where}.pretokenizers must be a list of pre-tokenizers, got {_json_type(children)}"
            )
        parts = []
        for i, child in enumerate(children):
            parts += _pre_tokenizer_parts(child, path, f"{where}.pretokenizers[{i}]")
        return parts
    if kind == "Split":
        pattern = node.get("pattern")
        if not isinstance(pattern, dict) or len(pattern) != 1 or not ({"Regex", "String"} & set(pattern)):
            raise TokenizerFileError(
                f'{path}: {where}.pattern must be {{"Regex": str}} or {{"String": str}}, got {pattern!r}'
            )
        ((pattern_kind, source),) = pattern.items()
        if not isinstance(source, str):
            raise TokenizerFileError(
                f"{path}: {where}.pattern.{pattern_kind} must be a string, got {_json_type(source)}"
            )
        regex_source = source if pattern_kind == "Regex" else regex.escape(source)
        _check_pattern(path, f"{where}.pattern.{pattern_kind}", regex_source)
        behavior = node.get("behavior", "Isolated")
        invert = _check_bool(path, node, "invert", where, False)
        if behavior != "Isolated" or invert:
            raise TokenizerFileError(
                f"{path}: {where}: Split behavior {behavior!r} invert={invert} is not supported "
                "(only Isolated, invert=false)"
            )
        return [(where, regex_source, False)]
    if kind == "ByteLevel":
        if _check_bool(path, node, "add_prefix_space", where, False):
            raise TokenizerFileError(f"{path}: {where}: ByteLevel add_prefix_space=true is not supported")
        return [(where, None, _check_bool(path, node, "use_regex", where, True))]
    hint = (
        "; a Metaspace (SentencePiece-style) BPE needs model.byte_fallback=true, which this file lacks"
        if kind == "Metaspace"
        else ""
    )
    raise TokenizerFileError(
        f"{path}: {where}: pre-tokenizer type {kind!r} is not "
        f"supported (byte-level BPE only: Split, ByteLevel, "
        f"Sequence){hint}"
    )


def _pre_tokenizer_pattern(node: Any, path: str | os.PathLike) -> str | None:
    """The pre-split regex a ``pre_tokenizer`` amounts to: one Split's; else GPT-2's (ByteLevel with
    use_regex, or no pre-tokenizer at all); else None (ByteLevel without its regex: no pre-splitting)."""
    if node is None:
        return GPT2_PATTERN
    parts = _pre_tokenizer_parts(node, path, "pre_tokenizer")
    splits = [(i, where, source) for i, (where, source, _) in enumerate(parts) if source is not None]
    byte_regex = [(i, where) for i, (where, source, uses) in enumerate(parts) if uses]
    if len(splits) > 1:
        raise TokenizerFileError(f"{path}: {splits[1][1]}: several Split pre-tokenizers are not supported")
    if not splits:
        return GPT2_PATTERN if byte_regex else None
    index, where, source = splits[0]
    if byte_regex:
        raise TokenizerFileError(
            f"{path}: {byte_regex[0][1]}: ByteLevel with use_regex=true beside the Split at {where} splits "
            "twice; netcl supports one regex (set use_regex to false)"
        )
    if any(i < index for i, (_, s, _) in enumerate(parts) if s is None):
        raise TokenizerFileError(
            f"{path}: {where}: a Split after ByteLevel matches byte-level characters, not text; not supported"
        )
    return source


def _added_tokens(path: str | os.PathLike, added_tokens: list) -> tuple[dict[str, int], dict[str, str]]:
    """``added_tokens`` as (content -> id, content -> the field that gave it)."""
    specials: dict[str, int] = {}
    special_where: dict[str, str] = {}
    for i, added in enumerate(added_tokens):
        where = f"added_tokens[{i}]"
        if not isinstance(added, dict):
            raise TokenizerFileError(
                f'{path}: {where} must be an object with "content" and "id", got {_json_type(added)}'
            )
        content, tid = added.get("content"), added.get("id")
        if not isinstance(content, str) or not content:
            raise TokenizerFileError(f"{path}: {where}.content must be a non-empty string, got {content!r}")
        if not _is_id(tid):
            raise TokenizerFileError(f"{path}: {where}.id must be a non-negative integer, got {tid!r}")
        if content in specials:
            raise TokenizerFileError(
                f"{path}: {where} gives {content!r} id {tid}, but {special_where[content]} already gave it "
                f"id {specials[content]}: one token may have only one id"
            )
        for key in ("special", "single_word", "lstrip", "rstrip", "normalized"):
            if key in added:
                _check_bool(path, added, key, where, False)
        specials[content] = tid
        special_where[content] = where
    return specials, special_where


def read_hf(path: str | os.PathLike) -> TokenizerData:
    """Read a Hugging Face BPE ``tokenizer.json``: byte-level (GPT-2, Llama 3, Qwen2) or SentencePiece-style
    (Llama 2, TinyLlama, Mistral: ``byte_fallback`` with ``▁`` for spaces, see `_read_metaspace`).

    Byte-level: vocab strings are mapped back to bytes through `bytes_to_unicode`. Merge ``i`` (``"a b"`` or
    ``["a", "b"]``) gives the token ``a+b`` merge priority ``256 + i``; when priorities follow id order (as
    in GPT-2 or Llama-3 files) the ids themselves are used. The pre-split regex is the ``Split``
    pre-tokenizer's, else GPT-2's (for ``ByteLevel`` with ``use_regex`` or no pre-tokenizer). Normalizers,
    dropout and subword prefixes/suffixes are refused.

    Both: every entry of ``added_tokens`` becomes a special token; a ``TemplateProcessing`` post-processor
    that puts one special token before the text names it ``bos_token``.
    """
    doc = _load_json(path)
    model = doc.get("model")
    if not isinstance(model, dict):
        raise TokenizerFileError(f"{path}: model must be an object (a BPE model), got {_json_type(model)}")
    kind = model.get("type", "BPE")
    if kind != "BPE":
        raise TokenizerFileError(
            f"{path}: model.type is {kind!r}: netcl reads only BPE models (byte-level, or "
            "SentencePiece-style with byte_fallback)"
        )
    byte_fallback = _check_bool(path, model, "byte_fallback", "model", False)
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key) not in (None, ""):
            raise TokenizerFileError(
                f"{path}: model.{key} = {model[key]!r} is not supported (byte-level BPE has none)"
            )
    dropout = model.get("dropout")
    if dropout not in (None, 0, 0.0) or isinstance(dropout, bool):
        raise TokenizerFileError(
            f"{path}: model.dropout = {dropout!r}: BPE dropout (random merges) is not supported; use null"
        )
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise TokenizerFileError(
            f"{path}: model.vocab must be an object of token -> id, got {_json_type(vocab)}"
        )
    merges = model.get("merges", [])
    if not isinstance(merges, list):
        raise TokenizerFileError(
            f'{path}: model.merges must be a list of "a b" strings or ["a", "b"] pairs, got '
            f'{_json_type(merges)}'
        )
    added_tokens = doc.get("added_tokens")
    if added_tokens is None:
        added_tokens = []
    if not isinstance(added_tokens, list):
        raise TokenizerFileError(
            f"{path}: added_tokens must be a list of objects, got {_json_type(added_tokens)}"
        )
    specials, special_where = _added_tokens(path, added_tokens)
    bos = _post_processor_bos(path, doc.get("post_processor"), specials, "post_processor")
    name = Path(path).parent.name if Path(path).name == "tokenizer.json" else Path(path).stem
    if byte_fallback:
        data = _read_metaspace(path, doc, vocab, merges, specials, special_where)
        data.name, data.bos_token = name, bos
        return data
    normalizer = doc.get("normalizer")
    if normalizer is not None:
        kind = normalizer.get("type") if isinstance(normalizer, dict) else None
        raise TokenizerFileError(
            f"{path}: normalizer {kind!r} is not supported for byte-level BPE (null only; a SentencePiece-"
            "style file has model.byte_fallback=true)"
            if kind is not None
            else f"{path}: normalizer must be null (or an object), got {_json_type(normalizer)}"
        )
    content_by_id: dict[int, str] = {}
    for content, tid in specials.items():
        content_by_id.setdefault(tid, content)
    decode_char = _byte_level_decoder()

    def to_bytes(token: str, where: str) -> bytes:
        try:
            return bytes([decode_char[ch] for ch in token])
        except KeyError as err:
            hint = (
                " (a SentencePiece-style vocab: netcl reads one with model.byte_fallback=true only)"
                if err.args[0] == METASPACE
                else ""
            )
            raise TokenizerFileError(
                f"{path}: {where}: {token!r} has character {err.args[0]!r} outside the byte-level alphabet"
                f"{hint}"
            ) from None

    def vocab_field(token: str) -> str:
        return f"model.vocab[{token!r}]"

    def vocab_entries() -> Iterable[tuple[bytes, int, str]]:
        for token, tid in vocab.items():
            if not _is_id(tid):
                raise TokenizerFileError(
                    f"{path}: {vocab_field(token)} = {tid!r} is not an int id (a non-negative integer)"
                )
            if tid in content_by_id:
                # GPT-2 style files list added tokens in the vocab too, under the same id: skip those.
                content = content_by_id[tid]
                if token != content and _byte_level_bytes(token) != content.encode("utf-8"):
                    raise TokenizerFileError(
                        f"{path}: {vocab_field(token)} has id {tid}, which {special_where[content]} gives to "
                        f"{content!r}: one id may name only one token"
                    )
                continue
            try:
                yield bytes([decode_char[ch] for ch in token]), tid, token
            except KeyError:
                to_bytes(token, vocab_field(token))  # raises, naming the character

    ranks = _collect_ranks(path, vocab_entries(), vocab_field)
    _check_specials(path, specials, special_where, ranks)

    priority: dict[bytes, int] = {bytes([b]): b - 256 for b in range(256)}  # below every merge
    for i, merge in enumerate(merges):
        where = f"model.merges[{i}]"
        parts = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) and p for p in parts):
            raise TokenizerFileError(
                f'{path}: {where} = {merge!r} is not a pair ("a b" or ["a", "b"] of two vocab tokens)'
            )
        left, right = to_bytes(parts[0], where), to_bytes(parts[1], where)
        for part, token in zip(parts, (left, right), strict=True):
            if token not in ranks:
                raise TokenizerFileError(f"{path}: {where} = {merge!r}: {part!r} is not in model.vocab")
        merged = left + right
        if merged not in ranks:
            raise TokenizerFileError(f"{path}: {where} = {merge!r} makes a token missing from the vocab")
        priority.setdefault(merged, 256 + i)
    merged_tokens = sorted((p, ranks[t]) for t, p in priority.items() if len(t) > 1)
    ids_follow_merges = all(a[1] < b[1] for a, b in itertools.pairwise(merged_tokens))
    # A vocab token no merge produces can only be reached by the whole-chunk fast path; keep it out of
    # merging.
    reachable = {t: (ranks[t] if ids_follow_merges else p) for t, p in priority.items()}

    pattern = _pre_tokenizer_pattern(doc.get("pre_tokenizer"), path)
    return TokenizerData(ranks, pattern, specials, name, None, reachable, bos_token=bos)




#: SentencePiece's stand-in for a space in vocab strings.
METASPACE = "\u2581"
#: The pieces a Metaspace pre-tokenizer with split=true cuts, on netcl's spaces: each space starts a piece.
METASPACE_SPLIT_PATTERN = r" [^ ]*|[^ ]+"
#: How a SentencePiece-style tokenizer puts a space before a text segment (`BPETokenizer`'s ``metaspace``).
METASPACE_SCHEMES = ("prepend", "always", "first", "never")


def _byte_token(token: str) -> int | None:
    """The byte a SentencePiece byte-fallback token ``<0xAB>`` stands for, else None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def _metaspace_scheme(path: str | os.PathLike, doc: dict) -> tuple[str, bool]:
    """(how a space is put before each segment, whether pre-tokenizing splits before each space) from a
    normalizer (Prepend "▁", Replace " " -> "▁", a Sequence of them) or a Metaspace pre-tokenizer."""
    normalizer, pre_tokenizer = doc.get("normalizer"), doc.get("pre_tokenizer")
    supported = (
        'SentencePiece-style files need a normalizer of Prepend "\u2581" and Replace " " -> "\u2581" '
        "(a Sequence of them), or a Metaspace pre-tokenizer"
    )
    prepend = replace = False
    if normalizer is not None:
        if not isinstance(normalizer, dict):
            raise TokenizerFileError(
                f"{path}: normalizer must be an object or null, got {_json_type(normalizer)}"
            )
        nodes = [("normalizer", normalizer)]
        if normalizer.get("type") == "Sequence":
            children = normalizer.get("normalizers")
            if not isinstance(children, list):
                raise TokenizerFileError(
                    f"{path}: normalizer.normalizers must be a list, got {_json_type(children)}"
                )
            nodes = [(f"normalizer.normalizers[{i}]", child) for i, child in enumerate(children)]
        for where, node in nodes:
            kind = node.get("type") if isinstance(node, dict) else None
            if kind == "Prepend" and node.get("prepend") == METASPACE:
                prepend = True
            elif kind == "Replace" and (node.get("pattern"), node.get("content")) == (
                {"String": " "},
                METASPACE,
            ):
                replace = True
            else:
                shown = {k: v for k, v in node.items() if k != "type"} if isinstance(node, dict) else node
                raise TokenizerFileError(
                    f"{path}: {where}: normalizer {kind!r} {shown} is not supported; {supported}"
                )
        if not replace:
            raise TokenizerFileError(f'{path}: normalizer has no Replace " " -> "\u2581"; {supported}')
    if pre_tokenizer is None:
        if not replace:
            raise TokenizerFileError(
                f"{path}: byte_fallback BPE with neither normalizer nor pre_tokenizer; {supported}"
            )
        return ("prepend" if prepend else "never"), False
    kind = pre_tokenizer.get("type") if isinstance(pre_tokenizer, dict) else None
    if kind != "Metaspace":
        raise TokenizerFileError(
            f"{path}: pre_tokenizer type {kind!r} is not supported with byte_fallback BPE (Metaspace or null)"
        )
    if normalizer is not None:
        raise TokenizerFileError(f"{path}: a ▁ normalizer and a Metaspace pre-tokenizer both: not supported")
    if pre_tokenizer.get("replacement", METASPACE) != METASPACE:
        raise TokenizerFileError(
            f"{path}: pre_tokenizer.replacement is {pre_tokenizer.get('replacement')!r}; only {METASPACE!r} "
            "is supported"
        )
    scheme = pre_tokenizer.get("prepend_scheme")
    if scheme is None:
        prefix = _check_bool(path, pre_tokenizer, "add_prefix_space", "pre_tokenizer", True)
        scheme = "always" if prefix else "never"
    if scheme not in ("always", "first", "never"):
        raise TokenizerFileError(
            f"{path}: pre_tokenizer.prepend_scheme is {scheme!r}; supported: 'always', 'first', 'never'"
        )
    return scheme, _check_bool(path, pre_tokenizer, "split", "pre_tokenizer", True)


def _read_metaspace(
    path: str | os.PathLike,
    doc: dict,
    vocab: dict,
    merges: list,
    specials: dict[str, int],
    special_where: dict[str, str],
) -> TokenizerData:
    """A SentencePiece-style BPE (``byte_fallback``): vocab strings are text with ``▁`` for a space.

    netcl keeps them as UTF-8 with a plain space instead of ``▁`` (``"▁the"`` -> ``b" the"``), so decoding
    is concatenation and the text needs only ``▁`` -> space and a space before each segment (``metaspace``).
    The tokens ``<0x00>``..``<0xFF>`` are the byte fallback: a character outside the vocabulary becomes its
    UTF-8 bytes' tokens. Merge ``i`` gives ``a+b`` merge priority ``i`` (the first merge making it).
    """
    scheme, split = _metaspace_scheme(path, doc)
    content_by_id = {tid: content for content, tid in reversed(list(specials.items()))}
    fallback: dict[int, int] = {}

    def internal(token: str) -> bytes:
        return token.replace(METASPACE, " ").encode("utf-8")

    def vocab_field(token: str) -> str:
        return f"model.vocab[{token!r}]"

    def vocab_entries() -> Iterable[tuple[bytes, int, str]]:
        for token, tid in vocab.items():
            if not _is_id(tid):
                raise TokenizerFileError(
                    f"{path}: {vocab_field(token)} = {tid!r} is not an int id (a non-negative integer)"
                )
            if tid in content_by_id:
                content = content_by_id[tid]
                if token != content:
                    raise TokenizerFileError(
                        f"{path}: {vocab_field(token)} has id {tid}, which {special_where[content]} "
                        f"gives to {content!r}: one id may name only one token"
                    )
                continue
            byte = _byte_token(token)
            if byte is not None:
                fallback[byte] = tid
                continue
            if not token:
                raise TokenizerFileError(f"{path}: {vocab_field(token)}: the empty string cannot be a token")
            yield internal(token), tid, token

    items = list(vocab_entries())
    ranks = {token: tid for token, tid, _ in items}
    if len(ranks) != len(items) or len(set(ranks.values())) != len(items):
        _raise_first_clash(path, items, vocab_field)  # names the clash ("▁a" and " a" are one token)
    shared = {tid: token for token, tid, _ in items if tid in set(fallback.values())}
    if shared:
        tid, token = min(shared.items())
        raise TokenizerFileError(
            f"{path}: {vocab_field(token)} has id {tid}, which a byte token <0x..> has too: one id may name "
            "only one token"
        )
    missing = [b for b in range(256) if b not in fallback]
    if missing:
        raise TokenizerFileError(
            f"{path}: model.byte_fallback is true but model.vocab lacks {len(missing)} of the byte tokens "
            f"<0x00>..<0xFF> (first: <0x{missing[0]:02X}>)"
        )
    _check_specials(path, specials, special_where, ranks)
    priority: dict[bytes, int] = {}
    for i, merge in enumerate(merges):
        where = f"model.merges[{i}]"
        parts = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) and p for p in parts):
            raise TokenizerFileError(
                f'{path}: {where} = {merge!r} is not a pair ("a b" or ["a", "b"] of two vocab tokens)'
            )
        for part in parts:
            if part not in vocab:
                raise TokenizerFileError(f"{path}: {where} = {merge!r}: {part!r} is not in model.vocab")
        merged = internal(parts[0] + parts[1])
        if merged not in ranks:
            raise TokenizerFileError(f"{path}: {where} = {merge!r} makes a token missing from the vocab")
        priority.setdefault(merged, i)
    return TokenizerData(
        ranks,
        METASPACE_SPLIT_PATTERN if split else None,
        specials,
        merge_priority=priority,
        byte_fallback=dict(sorted(fallback.items())),
        metaspace=scheme,
    )


def _post_processor_bos(
    path: str | os.PathLike, node: Any, specials: dict[str, int], where: str
) -> str | None:
    """The special token a ``TemplateProcessing`` post-processor puts before a single text (Llama's
    ``<s> $A``, Llama 3's ``<|begin_of_text|> $A``); None for ``$A`` alone and for other post-processors
    (ByteLevel's offsets, Roberta/Bert pairs: not read)."""
    if not isinstance(node, dict):
        return None
    kind = node.get("type")
    if kind == "Sequence":
        found = None
        processors = node.get("processors")
        for i, child in enumerate(processors if isinstance(processors, list) else []):
            found = _post_processor_bos(path, child, specials, f"{where}.processors[{i}]") or found
        return found
    if kind != "TemplateProcessing":
        return None
    single = node.get("single")
    pieces = []
    for item in single if isinstance(single, list) else [None]:
        if isinstance(item, dict) and len(item) == 1 and isinstance(next(iter(item.values())), dict):
            ((piece_kind, body),) = item.items()
            pieces.append((piece_kind, body.get("id")))
        else:
            pieces.append((None, item))
    if pieces == [("Sequence", "A")]:
        return None
    if len(pieces) == 2 and pieces[0][0] == "SpecialToken" and pieces[1] == ("Sequence", "A"):
        token = pieces[0][1]
        if token not in specials:
            raise TokenizerFileError(
                f"{path}: {where}.single puts {token!r} before the text, but added_tokens has no such token"
            )
        return token
    shown = " ".join("$" + str(v) if k == "Sequence" else str(v) for k, v in pieces)
    raise TokenizerFileError(
        f"{path}: {where}.single is {shown!r}; netcl supports '$A' and one special token before it ('<s> $A')"
    )




# ---------------------------------------------------------------------- SentencePiece tokenizer.model

# SentencePiece.Type values (sentencepiece_model.proto); UNUSED (5) pieces are ordinary, never merged to
_PIECE_NORMAL, _PIECE_UNKNOWN, _PIECE_CONTROL, _PIECE_USER_DEFINED, _PIECE_BYTE = 1, 2, 3, 4, 6
_SP_BPE = 2


def _protobuf_fields(path: str | os.PathLike, data: bytes, where: str) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one protobuf message: varints as int, 32-bit values as their
    4 bytes, length-delimited ones (strings, sub-messages) as bytes."""
    fields: list[tuple[int, int | bytes]] = []
    pos, n = 0, len(data)

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            if pos >= n or shift > 63:
                raise TokenizerFileError(
                    f"{path}: {where}: truncated or invalid protobuf (not a SentencePiece model?)"
                )
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while pos < n:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields.append((number, varint()))
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            fields.append((number, data[pos : pos + size]))
            pos += size
        elif wire == 2:
            size = varint()
            fields.append((number, data[pos : pos + size]))
            pos += size
        else:
            raise TokenizerFileError(
                f"{path}: {where}: protobuf wire type {wire} (not a SentencePiece model?)"
            )
        if pos > n:
            raise TokenizerFileError(f"{path}: {where}: truncated protobuf (not a SentencePiece model?)")
    return fields


def read_sentencepiece(path: str | os.PathLike) -> TokenizerData:
    """Read a SentencePiece ``tokenizer.model`` (its protobuf): a BPE model with byte fallback and the
    identity normalization, as Llama 2's and TinyLlama's, becomes what their tokenizer.json holds.

    Pieces: NORMAL ones are the vocabulary (``▁`` stored as a space), BYTE ones ``<0xAB>`` the byte fallback,
    UNKNOWN, CONTROL and USER_DEFINED ones special tokens. SentencePiece's BPE merges the adjacent pair whose
    concatenation is the piece with the highest score, so a piece's merge priority is its place in score
    order. ``add_dummy_prefix`` puts a space before each text segment (Hugging Face's legacy Llama
    tokenizer); the BOS is ``trainer_spec.bos_id``'s piece.
    """
    data = Path(path).read_bytes()
    pieces: list[tuple[str, float, int]] = []
    trainer: dict[int, int | bytes] = {}
    normalizer: dict[int, int | bytes] = {}
    for number, value in _protobuf_fields(path, data, "ModelProto"):
        if not isinstance(value, bytes):
            continue
        if number == 1:
            piece, score, kind = "", 0.0, _PIECE_NORMAL
            for field, item in _protobuf_fields(path, value, f"pieces[{len(pieces)}]"):
                if field == 1 and isinstance(item, bytes):
                    piece = item.decode("utf-8", "replace")
                elif field == 2 and isinstance(item, bytes) and len(item) == 4:
                    score = struct.unpack("<f", item)[0]
                elif field == 3 and isinstance(item, int):
                    kind = item
            pieces.append((piece, score, kind))
        elif number == 2:
            trainer = dict(_protobuf_fields(path, value, "trainer_spec"))
        elif number == 3:
            normalizer = dict(_protobuf_fields(path, value, "normalizer_spec"))
    if not pieces:
        raise TokenizerFileError(f"{path}: no pieces: not a SentencePiece model")
    model_type = trainer.get(3, 1)
    if model_type != _SP_BPE:
        kind = {1: "Unigram", 3: "Word", 4: "Char"}.get(model_type, str(model_type))  # type: ignore[arg-type]
        raise TokenizerFileError(f"{path}: a {kind} SentencePiece model: netcl reads BPE models only")
    if not trainer.get(35, 0):
        raise TokenizerFileError(
            f"{path}: trainer_spec.byte_fallback is false: netcl reads SentencePiece BPE with byte fallback "
            "(as Llama's)"
        )
    name = normalizer.get(1, b"identity")
    name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
    if name != "identity" or normalizer.get(4, 1) or not normalizer.get(5, 1):
        raise TokenizerFileError(
            f"{path}: normalizer_spec {name!r} (remove_extra_whitespaces={bool(normalizer.get(4, 1))}, "
            f"escape_whitespaces={bool(normalizer.get(5, 1))}): netcl reads the identity normalization with "
            "whitespace kept and escaped as ▁ only (Llama's); use the model's tokenizer.json"
        )
    ranks: dict[bytes, int] = {}
    specials: dict[str, int] = {}
    fallback: dict[int, int] = {}
    scored: list[tuple[float, int, bytes]] = []
    for tid, (piece, score, kind) in enumerate(pieces):
        where = f"pieces[{tid}] {piece!r}"
        if kind == _PIECE_BYTE:
            byte = _byte_token(piece)
            if byte is None or byte in fallback:
                raise TokenizerFileError(f"{path}: {where} is a BYTE piece but not a new <0xAB> byte")
            fallback[byte] = tid
        elif kind in (_PIECE_UNKNOWN, _PIECE_CONTROL, _PIECE_USER_DEFINED):
            if not piece or piece in specials:
                raise TokenizerFileError(f"{path}: {where}: empty or repeated special piece")
            specials[piece] = tid
        elif piece:
            token = piece.replace(METASPACE, " ").encode("utf-8")
            if token in ranks:
                raise TokenizerFileError(f"{path}: {where} repeats the piece of id {ranks[token]}")
            ranks[token] = tid
            if kind == _PIECE_NORMAL and len(piece) > 1:
                scored.append((-score, tid, token))
    missing = [b for b in range(256) if b not in fallback]
    if missing:
        raise TokenizerFileError(
            f"{path}: byte_fallback is on but {len(missing)} BYTE pieces <0x00>..<0xFF> are missing "
            f"(first: <0x{missing[0]:02X}>)"
        )
    priority = {token: rank for rank, (_, _, token) in enumerate(sorted(scored))}
    bos_id = trainer.get(41, 1)
    bos = next((p for p, tid in specials.items() if tid == bos_id), None)
    return TokenizerData(
        ranks,
        None,
        specials,
        Path(path).parent.name if Path(path).name == "tokenizer.model" else Path(path).stem,
        merge_priority=priority,
        byte_fallback=fallback,
        metaspace="prepend" if normalizer.get(3, 1) else "never",
        bos_token=bos,
    )


def split_in_two(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """The two parts BPE joins last to build ``token``: merge its bytes using only ranks below its own.

    Returns None when that does not end in exactly two parts (the token is unreachable by merging).
    """
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, best_rank = -1, limit
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            return None
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def onig_compatible(pattern: str) -> str:
    """Rewrite a pattern so Hugging Face's Oniguruma engine reads it as the `regex` package does.

    Oniguruma has ``?+ *+ ++`` as possessive quantifiers but parses ``{1,3}+`` as "one or more of
    {1,3}", which changes cl100k's digit groups. A possessive counted repeat that ends an alternative
    (next is ``|``, ``)`` or the end) matches exactly like the greedy one, so its ``+`` is dropped there.
    """
    return regex.sub(r"(?<!\\)(\{\d+(?:,\d*)?\})\+(?=\||\)|$)", r"\1", pattern)


def write_hf(
    path: str | os.PathLike, ranks: dict[bytes, int], pattern: str | None, special_tokens: dict[str, int]
) -> None:
    """Write a Hugging Face ``tokenizer.json`` for byte-level BPE.

    The pre-split pattern goes through `onig_compatible`. Merges are derived from the ranks (tiktoken's
    conversion):
    each multi-byte token, in rank order, is split by merging its bytes with lower-ranked tokens only; the two
    final
    parts form its merge.
    """
    encode_chars = bytes_to_unicode()

    def to_str(token: bytes) -> str:
        return "".join(encode_chars[b] for b in token)

    merges = []
    for token, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            pair = split_in_two(token, ranks)
            if pair is not None:
                merges.append([to_str(pair[0]), to_str(pair[1])])
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    if pattern is None:
        pre_tokenizer: dict[str, Any] = byte_level
    else:
        split = {
            "type": "Split",
            "pattern": {"Regex": onig_compatible(pattern)},
            "behavior": "Isolated",
            "invert": False,
        }
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [split, byte_level]}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": tid,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for tok, tid in sorted(special_tokens.items(), key=lambda kv: kv[1])
        ],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {to_str(token): rank for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])},
            "merges": merges,
        },
    }
    Path(path).write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
