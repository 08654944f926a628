"""Tokenizer files: netcl's own JSON, tiktoken ``.tiktoken`` rank files, Hugging Face ``tokenizer.json``.

Readers return plain data (ranks, pattern, special tokens); `BPETokenizer` builds itself from it.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import os
from dataclasses import dataclass, field
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


def _load_json(path: str | os.PathLike) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TokenizerFileError(f"{path}: not UTF-8 text ({err})") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise TokenizerFileError(
            f"{path}: line {err.lineno} column {err.colno}: invalid JSON: {err.msg}"
        ) from err


def read_netcl(path: str | os.PathLike) -> TokenizerData:
    """Read a file written by `write_netcl`; errors name the entry that is wrong."""
    doc = _load_json(path)
    if not isinstance(doc, dict) or doc.get("format") != NETCL_FORMAT:
        raise TokenizerFileError(f'{path}: not a netcl tokenizer file (expected "format": "{NETCL_FORMAT}")')
    if doc.get("version") != NETCL_VERSION:
        raise TokenizerFileError(
            f"{path}: unsupported version {doc.get('version')!r} (this netcl reads {NETCL_VERSION})"
        )
    ranks: dict[bytes, int] = {}
    tokens = doc.get("tokens")
    if not isinstance(tokens, list):
        raise TokenizerFileError(f'{path}: "tokens" must be a list of [id, base64]')
    for i, entry in enumerate(tokens):
        try:
            rank, b64 = entry
            if not isinstance(rank, int):
                raise TypeError
            ranks[base64.b64decode(b64, validate=True)] = rank
        except (TypeError, ValueError, binascii.Error):
            raise TokenizerFileError(
                f"{path}: tokens[{i}] = {entry!r} is not [int id, base64 string]"
            ) from None
    pattern = doc.get("pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise TokenizerFileError(f'{path}: "pattern" must be a string or null')
    specials = doc.get("special_tokens", {})
    if not isinstance(specials, dict) or not all(isinstance(v, int) for v in specials.values()):
        raise TokenizerFileError(f'{path}: "special_tokens" must map str to int')
    merges = doc.get("merges")
    if merges is not None:
        try:
            merges = [((int(a), int(b)), int(new)) for a, b, new in merges]
        except (TypeError, ValueError):
            raise TokenizerFileError(f'{path}: "merges" must be a list of [left, right, new] ids') from None
    return TokenizerData(ranks, pattern, specials, str(doc.get("name", "")), merges)


# ---------------------------------------------------------------------- tiktoken


def read_tiktoken(path: str | os.PathLike) -> dict[bytes, int]:
    """Read a ``.tiktoken`` file: one ``base64(token) rank`` per line; blank lines are skipped."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            parts = line.split()
            try:
                if len(parts) != 2:
                    raise ValueError(f"expected 2 fields, got {len(parts)}")
                ranks[base64.b64decode(parts[0], validate=True)] = int(parts[1])
            except (ValueError, binascii.Error) as err:
                raise TokenizerFileError(
                    f"{path}: line {lineno}: expected 'base64-token rank', got {line[:80]!r} ({err})"
                ) from None
    return ranks


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


def _find_pre_tokenizer_pattern(node: Any, path: str | os.PathLike) -> tuple[str | None, bool]:
    """(Split regex if any, whether a ByteLevel pre-tokenizer with use_regex is present)."""
    if node is None:
        return None, False
    kind = node.get("type")
    if kind == "Sequence":
        found: str | None = None
        byte_regex = False
        for child in node.get("pretokenizers", []):
            pat, uses = _find_pre_tokenizer_pattern(child, path)
            if pat is not None:
                if found is not None:
                    raise TokenizerFileError(f"{path}: several Split pre-tokenizers are not supported")
                found = pat
            byte_regex = byte_regex or uses
        return found, byte_regex
    if kind == "Split":
        pattern = node.get("pattern", {})
        if "Regex" in pattern:
            regex_source = pattern["Regex"]
        elif "String" in pattern:
            regex_source = regex.escape(pattern["String"])
        else:
            raise TokenizerFileError(f"{path}: Split pre-tokenizer without a pattern")
        if node.get("behavior", "Isolated") != "Isolated" or node.get("invert", False):
            raise TokenizerFileError(
                f"{path}: Split behavior {node.get('behavior')!r} invert={node.get('invert')} is not supported "
                "(only Isolated, invert=false)"
            )
        return regex_source, False
    if kind == "ByteLevel":
        if node.get("add_prefix_space", False):
            raise TokenizerFileError(f"{path}: ByteLevel add_prefix_space=true is not supported")
        return None, bool(node.get("use_regex", True))
    raise TokenizerFileError(f"{path}: pre-tokenizer type {kind!r} is not supported (byte-level BPE only)")


def read_hf(path: str | os.PathLike) -> TokenizerData:
    """Read a Hugging Face byte-level BPE ``tokenizer.json``.

    Vocab strings are mapped back to bytes through `bytes_to_unicode`. Merge ``i`` (``"a b"`` or
    ``["a", "b"]``) gives the token ``a+b`` merge priority ``256 + i``; when priorities follow id order (as
    in GPT-2 or Llama-3 files) the ids themselves are used. The pre-split regex is the ``Split``
    pre-tokenizer's, else GPT-2's (for ``ByteLevel`` with ``use_regex`` or no pre-tokenizer). Every entry
    of ``added_tokens`` becomes a special token. Normalizers and ``byte_fallback`` are refused.
    """
    doc = _load_json(path)
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
        raise TokenizerFileError(
            f'{path}: "model" must be a BPE model, got {None if model is None else model.get("type")!r}'
        )
    if model.get("byte_fallback"):
        raise TokenizerFileError(f"{path}: byte_fallback BPE (SentencePiece-style) is not byte-level BPE")
    if doc.get("normalizer") is not None:
        raise TokenizerFileError(f"{path}: normalizer {doc['normalizer'].get('type')!r} is not supported")
    vocab = model.get("vocab")
    merges = model.get("merges", [])
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise TokenizerFileError(f'{path}: model needs a "vocab" object and a "merges" list')

    decode_char = {ch: b for b, ch in bytes_to_unicode().items()}

    def to_bytes(token: str, where: str) -> bytes:
        try:
            return bytes([decode_char[ch] for ch in token])
        except KeyError as err:
            raise TokenizerFileError(
                f"{path}: {where}: {token!r} has character {err.args[0]!r} outside the byte-level alphabet"
            ) from None

    specials = {}
    for i, added in enumerate(doc.get("added_tokens") or []):
        try:
            specials[added["content"]] = int(added["id"])
        except (KeyError, TypeError, ValueError):
            raise TokenizerFileError(f'{path}: added_tokens[{i}] needs "content" and "id"') from None
    special_ids = set(specials.values())

    ranks: dict[bytes, int] = {}
    for token, tid in vocab.items():
        if tid in special_ids:
            continue
        if not isinstance(tid, int):
            raise TokenizerFileError(f"{path}: vocab[{token!r}] = {tid!r} is not an int id")
        ranks[to_bytes(token, "vocab")] = tid

    priority: dict[bytes, int] = {bytes([b]): b - 256 for b in range(256)}  # below every merge
    for i, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(parts, list) or len(parts) != 2:
            raise TokenizerFileError(f"{path}: merges[{i}] = {merge!r} is not a pair")
        merged = to_bytes(parts[0], f"merges[{i}]") + to_bytes(parts[1], f"merges[{i}]")
        if merged not in ranks:
            raise TokenizerFileError(f"{path}: merges[{i}] = {merge!r} makes a token missing from the vocab")
        priority.setdefault(merged, 256 + i)
    merged_tokens = sorted((p, ranks[t]) for t, p in priority.items() if len(t) > 1)
    ids_follow_merges = all(a[1] < b[1] for a, b in itertools.pairwise(merged_tokens))
    # A vocab token no merge produces can only be reached by the whole-chunk fast path; keep it out of merging.
    reachable = {t: (ranks[t] if ids_follow_merges else p) for t, p in priority.items()}

    pattern, byte_regex = _find_pre_tokenizer_pattern(doc.get("pre_tokenizer"), path)
    if pattern is None and (byte_regex or doc.get("pre_tokenizer") is None):
        pattern = GPT2_PATTERN
    name = Path(path).parent.name if Path(path).name == "tokenizer.json" else Path(path).stem
    return TokenizerData(ranks, pattern, specials, name, None, reachable)


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

    The pre-split pattern goes through `onig_compatible`. Merges are derived from the ranks (tiktoken's conversion): each multi-byte token, in rank order, is
    split by merging its bytes with lower-ranked tokens only; the two final parts form its merge.
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
