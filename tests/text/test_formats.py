"""Tokenizer files: netcl JSON, .tiktoken and Hugging Face tokenizer.json round trips, hand-written files,
errors."""

from __future__ import annotations

import base64
import json
import re

import pytest

from netcl.text import BPETokenizer, TokenizerFileError, bytes_to_unicode
from netcl.text.formats import onig_compatible
from netcl.text.patterns import GPT2_PATTERN

from .conftest import DATA, cl100k_file

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def trained() -> BPETokenizer:
    text = (DATA / "multilingual.txt").read_text(encoding="utf-8")
    return BPETokenizer.train(text, 700, pattern="cl100k", special_tokens=SPECIALS, name="multi")


@pytest.fixture(scope="module")
def sample() -> str:
    return (DATA / "multilingual.txt").read_text(encoding="utf-8") + "unseen words: zyzzyva quixotic 漢字"


def _same_tokenizer(a: BPETokenizer, b: BPETokenizer, text: str, same_pattern: bool = True) -> None:
    assert a.ranks == b.ranks
    assert a.special_tokens == b.special_tokens
    if same_pattern:
        assert a.pattern == b.pattern
    assert a.encode(text, allowed_special="all") == b.encode(text, allowed_special="all")


def test_netcl_round_trip(trained, sample, tmp_path):
    path = tmp_path / "tok.json"
    trained.save(path)
    loaded = BPETokenizer.load(path)
    _same_tokenizer(trained, loaded, sample)
    assert loaded.merges == trained.merges
    assert loaded.name == "multi"
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["format"] == "netcl-bpe" and doc["version"] == 1
    assert doc["tokens"][97] == [97, base64.b64encode(b"a").decode()]


def test_tiktoken_round_trip(trained, sample, tmp_path):
    path = tmp_path / "multi.tiktoken"
    trained.save_tiktoken(path)
    lines = path.read_bytes().splitlines()
    assert len(lines) == len(trained.ranks)
    assert lines[32] == base64.b64encode(b" ") + b" 32"
    loaded = BPETokenizer.from_tiktoken(path, pattern=trained.pattern, special_tokens=trained.special_tokens)
    _same_tokenizer(trained, loaded, sample)
    assert loaded.name == "multi"


def test_cl100k_file_rewrites_byte_identical(cl100k, tmp_path):
    path = tmp_path / "cl100k_base.tiktoken"
    cl100k.save_tiktoken(path)
    assert path.read_bytes() == cl100k_file().read_bytes()


def test_hf_round_trip(trained, sample, tmp_path):
    path = tmp_path / "tokenizer.json"
    trained.save_hf(path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["model"]["type"] == "BPE"
    assert doc["model"]["vocab"]["Ġ"] == 32  # byte 0x20 is written as U+0120
    # Oniguruma reads "{1,3}+" as a repeat of a repeat: the writer drops that possessive "+".
    assert doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == trained.pattern.replace(
        r"\p{N}{1,3}+", r"\p{N}{1,3}"
    )
    assert {t["content"] for t in doc["added_tokens"]} == set(SPECIALS)
    # Every learned token is reachable, so there is exactly one merge per learned token.
    assert len(doc["model"]["merges"]) == len(trained.ranks) - 256
    loaded = BPETokenizer.from_hf(path)
    _same_tokenizer(trained, loaded, sample, same_pattern=False)


def test_onig_compatible_only_touches_counted_repeats_ending_an_alternative():
    assert onig_compatible(r"a{1,3}+|b{2}+)|c{1,}+") == r"a{1,3}|b{2})|c{1,}"
    assert onig_compatible(r"a{1,3}+b") == r"a{1,3}+b"
    assert onig_compatible(r"\{1,3}+|x?+|y++") == r"\{1,3}+|x?+|y++"


def test_bytes_to_unicode_is_gpt2s():
    table = bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert table[ord("a")] == "a" and table[ord("!")] == "!" and table[0xFF] == "ÿ"
    assert table[0] == "\u0100" and table[ord(" ")] == "\u0120" and table[ord("\n")] == "\u010a"
    assert table[0xAD] == "\u0143"  # soft hyphen: the last of the 68 remapped bytes


def _hf_doc(vocab_extra: dict[str, int], merges: list, **top) -> dict:
    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)} | vocab_extra
    return {"model": {"type": "BPE", "vocab": vocab, "merges": merges}, **top}


def test_hf_hand_written_gpt2_style(tmp_path):
    # No pre_tokenizer: GPT-2's pattern. Merges as "a b" strings; <|endoftext|> sits in both vocab and
    # added_tokens as in GPT-2's file, and must become a special token only.
    doc = _hf_doc(
        {"he": 256, "ll": 257, "hell": 258, "Ġw": 259, "<|endoftext|>": 260},
        ["h e", "l l", "he ll", "Ġ w"],
        added_tokens=[{"id": 260, "content": "<|endoftext|>", "special": True}],
    )
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    tok = BPETokenizer.from_hf(path)
    assert tok.pattern == GPT2_PATTERN
    assert tok.special_tokens == {"<|endoftext|>": 260}
    # "hello" -> he, ll -> hell + o ; " world" -> Ġw + o r l d
    assert tok.encode("hello world<|endoftext|>", allowed_special="all") == [
        258,
        ord("o"),
        259,
        ord("o"),
        ord("r"),
        ord("l"),
        ord("d"),
        260,
    ]


def test_hf_ids_not_in_merge_order_use_merge_priority(tmp_path):
    # "ab" has the larger id but the earlier merge: merging follows the merges list, not the ids.
    doc = _hf_doc({"ab": 300, "bc": 260}, [["a", "b"], ["b", "c"]])
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    tok = BPETokenizer.from_hf(path)
    assert tok.encode("abc") == [300, ord("c")]
    assert tok.encode("bc") == [260]


def test_hf_split_pre_tokenizer_is_used(tmp_path):
    split = {"type": "Split", "pattern": {"Regex": r"\d|\D+"}, "behavior": "Isolated", "invert": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
    doc = _hf_doc(
        {"12": 256}, ["1 2"], pre_tokenizer={"type": "Sequence", "pretokenizers": [split, byte_level]}
    )
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    tok = BPETokenizer.from_hf(path)
    assert tok.pattern == r"\d|\D+"
    assert tok.encode("12") == [ord("1"), ord("2")]  # the pattern isolates digits, so "12" never merges


# ---------------------------------------------------------------------- malformed files


def test_malformed_tiktoken_names_line(tmp_path):
    path = tmp_path / "bad.tiktoken"
    good = [base64.b64encode(bytes([b])) + b" " + str(b).encode() for b in range(3)]
    path.write_bytes(b"\n".join([*good[:2], b"not-base64!! 2", good[2]]) + b"\n")
    with pytest.raises(TokenizerFileError, match="line 3"):
        BPETokenizer.from_tiktoken(path, pattern="gpt2")
    path.write_bytes(b"YQ== 1 extra\n")
    with pytest.raises(TokenizerFileError, match="line 1.*expected 2 fields"):
        BPETokenizer.from_tiktoken(path, pattern="gpt2")


def test_malformed_json_names_line(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{\n"model": {\n"type": "BPE",,\n}}', encoding="utf-8")
    with pytest.raises(TokenizerFileError, match="line 3"):
        BPETokenizer.from_hf(path)
    with pytest.raises(TokenizerFileError, match="line 3"):
        BPETokenizer.load(path)


def test_netcl_file_errors(trained, tmp_path):
    path = tmp_path / "tok.json"
    path.write_text(json.dumps({"format": "other"}), encoding="utf-8")
    with pytest.raises(TokenizerFileError, match="not a netcl tokenizer"):
        BPETokenizer.load(path)
    trained.save(path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["tokens"][5] = [5, "%%%"]
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(TokenizerFileError, match=r"tokens\[5\]"):
        BPETokenizer.load(path)


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda d: d["model"]["merges"].append("x y"), "makes a token missing"),
        (lambda d: d["model"]["merges"].append("xyz"), "is not a pair"),
        (lambda d: d["model"]["vocab"].update({"a b": 999}), "outside the byte-level alphabet"),
        (lambda d: d.update(normalizer={"type": "NFC"}), "normalizer 'NFC'"),
        (lambda d: d["model"].update(byte_fallback=True), "byte_fallback"),
        (lambda d: d["model"].update(type="WordPiece"), "BPE model"),
        (
            lambda d: d.update(pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True}),
            "add_prefix_space",
        ),
        (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "'Whitespace' is not supported"),
    ],
)
def test_hf_unsupported_or_malformed(tmp_path, change, words):
    doc = _hf_doc({}, [])
    change(doc)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(TokenizerFileError, match=words):
        BPETokenizer.from_hf(path)


# ---------------------------------------------------------------------- every field a reader uses


def _valid_hf() -> dict:
    """A small valid file using every field read_hf reads: merges in both forms, an added token that is
    also in the vocab (GPT-2 style), a Split + ByteLevel pre-tokenizer, a null normalizer."""
    split = {"type": "Split", "pattern": {"Regex": r"\p{L}+|\s+|."}, "behavior": "Isolated", "invert": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    doc = _hf_doc(
        {"ab": 256, "abc": 257, "<|endoftext|>": 258},
        ["a b", ["ab", "c"]],
        added_tokens=[{"id": 258, "content": "<|endoftext|>", "special": True, "lstrip": False}],
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split, byte_level]},
        normalizer=None,
    )
    doc["model"].update(
        dropout=None, continuing_subword_prefix=None, end_of_word_suffix=None, byte_fallback=False
    )
    return doc


def test_valid_hf_file_loads(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_valid_hf()), encoding="utf-8")
    tok = BPETokenizer.from_hf(path)
    assert tok.encode("abc ab<|endoftext|>", allowed_special="all") == [257, 32, 256, 258]
    assert tok.pattern == r"\p{L}+|\s+|."


def _pre(*parts: dict) -> dict:
    return {"type": "Sequence", "pretokenizers": list(parts)}


SPLIT = {"type": "Split", "pattern": {"Regex": r"\S+|\s+"}, "behavior": "Isolated", "invert": False}
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}


def _vocab_with_duplicate_key(doc: dict) -> str:
    text = json.dumps(doc)
    assert text.count('"ab": 256') == 1
    return text.replace('"ab": 256', '"ab": 256, "ab": 300')


HF_MALFORMED = [
    # (id, change: mutates the doc, or returns the file's text / a new document, words in the message)
    ("not-json", lambda d: "this is not JSON", "line 1 column 1: invalid JSON"),
    ("truncated", lambda d: json.dumps(d)[: len(json.dumps(d)) // 2], "invalid JSON"),
    ("empty-file", lambda d: "", "invalid JSON"),
    ("top-level-list", lambda d: [d], "the top level must be a JSON object, got list"),
    ("top-level-string", lambda d: json.dumps("BPE"), "the top level must be a JSON object, got string"),
    ("no-model", lambda d: d.pop("model") and None, "model must be an object .*got null"),
    ("model-string", lambda d: d.update(model="BPE"), "model must be an object .*got string"),
    ("model-type-number", lambda d: d["model"].update(type=5), "model.type is 5"),
    (
        "no-vocab",
        lambda d: d["model"].pop("vocab") and None,
        "model.vocab must be an object of token -> id, got null",
    ),
    (
        "vocab-list",
        lambda d: d["model"].update(vocab=[]),
        "model.vocab must be an object of token -> id, got list",
    ),
    (
        "vocab-id-string",
        lambda d: d["model"]["vocab"].update(ab="256"),
        r"model.vocab\['ab'\] = '256' is not an int",
    ),
    (
        "vocab-id-float",
        lambda d: d["model"]["vocab"].update(ab=256.0),
        r"model.vocab\['ab'\] = 256.0 is not an int",
    ),
    (
        "vocab-id-bool",
        lambda d: d["model"]["vocab"].update(ab=True),
        r"model.vocab\['ab'\] = True is not an int",
    ),
    (
        "vocab-id-negative",
        lambda d: d["model"]["vocab"].update(ab=-3),
        r"model.vocab\['ab'\] = -3 is not an int",
    ),
    (
        "vocab-two-tokens-one-id",
        lambda d: d["model"]["vocab"].update(ab=97),
        r"model.vocab\['ab'\] gives id 97 to b'ab', but model.vocab\['a'\] already gave it to b'a'",
    ),
    (
        "vocab-key-twice",
        _vocab_with_duplicate_key,
        r"model.vocab has the key 'ab' twice \(values 256 and 300\): two ids for the byte string b'ab'",
    ),
    (
        "vocab-missing-byte",
        lambda d: d["model"]["vocab"].pop("a") and None,
        r"1 of the 256 single-byte tokens are missing \(first: b'a'\)",
    ),
    (
        "merges-object",
        lambda d: d["model"].update(merges={"a": "b"}),
        "model.merges must be a list of .*got object",
    ),
    ("merge-number", lambda d: d["model"]["merges"].append(5), r"model.merges\[2\] = 5 is not a pair"),
    (
        "merge-one-part",
        lambda d: d["model"]["merges"].append(["a"]),
        r"model.merges\[2\] = \['a'\] is not a pair",
    ),
    (
        "merge-three-parts",
        lambda d: d["model"]["merges"].append("a b c"),
        r"merges\[2\] = 'a b c' is not a pair",
    ),
    ("merge-empty-part", lambda d: d["model"]["merges"].append("a "), r"merges\[2\] = 'a ' is not a pair"),
    (
        "merge-number-part",
        lambda d: d["model"]["merges"].append(["a", 1]),
        r"merges\[2\] = \['a', 1\] is not a pair",
    ),
    (
        "merge-part-not-in-vocab",
        lambda d: d["model"]["merges"].append("bc d"),
        r"merges\[2\] = 'bc d': 'bc' is not in",
    ),
    (
        "added-object",
        lambda d: d.update(added_tokens={"id": 258}),
        "added_tokens must be a list of objects, got object",
    ),
    (
        "added-empty-object",
        lambda d: d.update(added_tokens={}),
        "added_tokens must be a list of objects, got object",
    ),
    ("added-entry-string", lambda d: d["added_tokens"].append("<x>"), r"added_tokens\[1\] must be an object"),
    (
        "added-no-content",
        lambda d: d["added_tokens"].append({"id": 300}),
        r"added_tokens\[1\].content must be a",
    ),
    (
        "added-empty-content",
        lambda d: d["added_tokens"].append({"id": 300, "content": ""}),
        r"added_tokens\[1\].content must be a non-empty string, got ''",
    ),
    (
        "added-no-id",
        lambda d: d["added_tokens"].append({"content": "<x>"}),
        r"added_tokens\[1\].id must be a",
    ),
    (
        "added-id-string",
        lambda d: d["added_tokens"].append({"content": "<x>", "id": "300"}),
        r"added_tokens\[1\].id must be a non-negative integer, got '300'",
    ),
    (
        "added-id-float",
        lambda d: d["added_tokens"].append({"content": "<x>", "id": 300.5}),
        r"added_tokens\[1\].id must be a non-negative integer, got 300.5",
    ),
    (
        "added-same-content-twice",
        lambda d: d["added_tokens"].append({"content": "<|endoftext|>", "id": 300}),
        r"added_tokens\[1\] gives '<\|endoftext\|>' id 300, but added_tokens\[0\] already gave it id 258",
    ),
    (
        "added-same-id-twice",
        lambda d: d["added_tokens"].append({"content": "<x>", "id": 258}),
        r"added_tokens\[1\] gives id 258 to the special token '<x>', but added_tokens\[0\] already gave it",
    ),
    (
        "added-id-of-ordinary-token",
        lambda d: d["added_tokens"].append({"content": "<x>", "id": 97}),
        r"model.vocab\['a'\] has id 97, which added_tokens\[1\] gives to '<x>'",
    ),
    (
        "added-flag-not-bool",
        lambda d: d["added_tokens"][0].update(special="yes"),
        r"added_tokens\[0\].special must be true or false, got string 'yes'",
    ),
    ("normalizer-string", lambda d: d.update(normalizer="NFC"), "normalizer must be null .*got string"),
    ("normalizer-nfc", lambda d: d.update(normalizer={"type": "NFC"}), "normalizer 'NFC' is not supported"),
    (
        "pre-string",
        lambda d: d.update(pre_tokenizer="ByteLevel"),
        "pre_tokenizer must be an object or null, got string",
    ),
    (
        "pre-sequence-object",
        lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": {}}),
        "pre_tokenizer.pretokenizers must be a list of pre-tokenizers, got object",
    ),
    (
        "pre-sequence-number",
        lambda d: d.update(pre_tokenizer=_pre(5)),
        r"pre_tokenizer.pretokenizers\[0\] must be an object, got number",
    ),
    (
        "split-no-pattern",
        lambda d: d.update(pre_tokenizer=_pre({"type": "Split"}, BYTE_LEVEL)),
        r"pre_tokenizer.pretokenizers\[0\].pattern must be \{\"Regex\": str\}",
    ),
    (
        "split-regex-number",
        lambda d: d.update(pre_tokenizer=_pre(SPLIT | {"pattern": {"Regex": 5}}, BYTE_LEVEL)),
        r"pretokenizers\[0\].pattern.Regex must be a string, got number",
    ),
    (
        "split-regex-invalid",
        lambda d: d.update(pre_tokenizer=_pre(SPLIT | {"pattern": {"Regex": "(unclosed"}}, BYTE_LEVEL)),
        r"pretokenizers\[0\].pattern.Regex is not a valid regex",
    ),
    (
        "split-removed",
        lambda d: d.update(pre_tokenizer=_pre(SPLIT | {"behavior": "Removed"}, BYTE_LEVEL)),
        "Split behavior 'Removed' invert=False is not supported",
    ),
    (
        "split-invert-string",
        lambda d: d.update(pre_tokenizer=_pre(SPLIT | {"invert": "no"}, BYTE_LEVEL)),
        r"pretokenizers\[0\].invert must be true or false",
    ),
    (
        "byte-level-use-regex-string",
        lambda d: d.update(pre_tokenizer=_pre(SPLIT, BYTE_LEVEL | {"use_regex": "yes"})),
        r"pretokenizers\[1\].use_regex must be true or false",
    ),
    (
        "split-and-byte-level-regex",
        lambda d: d.update(pre_tokenizer=_pre(SPLIT, BYTE_LEVEL | {"use_regex": True})),
        r"pretokenizers\[1\]: ByteLevel with use_regex=true beside the Split .*splits twice",
    ),
    (
        "split-after-byte-level",
        lambda d: d.update(pre_tokenizer=_pre(BYTE_LEVEL, SPLIT)),
        r"pretokenizers\[1\]: a Split after ByteLevel",
    ),
    (
        "two-splits",
        lambda d: d.update(pre_tokenizer=_pre(SPLIT, SPLIT, BYTE_LEVEL)),
        r"pretokenizers\[1\]: several Split pre-tokenizers",
    ),
    (
        "byte-fallback-string",
        lambda d: d["model"].update(byte_fallback="no"),
        "model.byte_fallback must be true or",
    ),
    ("dropout", lambda d: d["model"].update(dropout=0.1), "model.dropout = 0.1: BPE dropout"),
    (
        "subword-prefix",
        lambda d: d["model"].update(continuing_subword_prefix="##"),
        "continuing_subword_prefix = '##'",
    ),
    ("word-suffix", lambda d: d["model"].update(end_of_word_suffix="</w>"), "end_of_word_suffix = '</w>'"),
    (
        "key-twice-at-top",
        lambda d: json.dumps(d)[:-1] + ', "model": {}}',
        "the top-level object has the key 'model'",
    ),
]


@pytest.mark.parametrize(
    "change, words", [row[1:] for row in HF_MALFORMED], ids=[row[0] for row in HF_MALFORMED]
)
def test_hf_malformed_fields_name_file_and_field(tmp_path, change, words):
    doc = _valid_hf()
    result = change(doc)
    path = tmp_path / "tokenizer.json"
    path.write_text(result if isinstance(result, str) else json.dumps(doc if result is None else result))
    with pytest.raises(TokenizerFileError) as info:
        BPETokenizer.from_hf(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert re.search(words, message), message


def test_hf_byte_level_without_regex_means_no_pre_split(tmp_path):
    doc = _valid_hf()
    doc["pre_tokenizer"] = BYTE_LEVEL
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    tok = BPETokenizer.from_hf(path)
    assert tok.pattern is None
    assert tok.encode("ab abc") == [256, 32, 257]


# ---------------------------------------------------------------------- tiktoken rank files


def _rank_lines(ranks: dict[bytes, int]) -> list[bytes]:
    return [
        base64.b64encode(t) + b" " + str(r).encode() for t, r in sorted(ranks.items(), key=lambda kv: kv[1])
    ]


BYTE_RANKS = {bytes([b]): b for b in range(256)}

TIKTOKEN_MALFORMED = [
    # (id, lines of the file, words)
    (
        "token-twice",
        [*_rank_lines(BYTE_RANKS | {b"ab": 256}), base64.b64encode(b"ab") + b" 257"],
        r"line 258 gives the byte string b'ab' id 257, but line 257 already gave it id 256",
    ),
    (
        "rank-twice",
        [*_rank_lines(BYTE_RANKS | {b"ab": 256}), base64.b64encode(b"cd") + b" 256"],
        r"line 258 gives id 256 to b'cd', but line 257 already gave it to b'ab'",
    ),
    (
        "rank-float",
        [*_rank_lines(BYTE_RANKS), b"YWI= 256.0"],
        "line 257: .*the rank '256.0' is not a non-negative",
    ),
    (
        "rank-negative",
        [*_rank_lines(BYTE_RANKS), b"YWI= -3"],
        "line 257: .*the rank '-3' is not a non-negative",
    ),
    ("rank-word", [*_rank_lines(BYTE_RANKS), b"YWI= many"], "line 257: .*the rank 'many' is not"),
    ("rank-underscore", [*_rank_lines(BYTE_RANKS), b"YWI= 1_000"], "line 257: .*the rank '1_000' is not"),
    ("one-field", [*_rank_lines(BYTE_RANKS), b"YWI="], "line 257: .*expected 2 fields, got 1"),
    (
        "missing-byte",
        _rank_lines(BYTE_RANKS)[1:],
        r"1 of the 256 single-byte tokens are missing \(first: b'\\x00'\)",
    ),
]


@pytest.mark.parametrize(
    "lines, words", [row[1:] for row in TIKTOKEN_MALFORMED], ids=[r[0] for r in TIKTOKEN_MALFORMED]
)
def test_tiktoken_malformed_names_file_and_line(tmp_path, lines, words):
    path = tmp_path / "bad.tiktoken"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TokenizerFileError) as info:
        BPETokenizer.from_tiktoken(path, pattern="gpt2")
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert re.search(words, message), message


def test_tiktoken_ranks_with_gaps_load_like_tiktoken(tmp_path, tiktoken_cl100k):
    # tiktoken does not require contiguous ranks (cl100k itself skips ids before its special tokens).
    tiktoken = pytest.importorskip("tiktoken")
    ranks = BYTE_RANKS | {b"ab": 1000, b"abc": 5000, b"cd": 300}
    path = tmp_path / "gaps.tiktoken"
    path.write_bytes(b"\n".join(_rank_lines(ranks)) + b"\n")
    ours = BPETokenizer.from_tiktoken(path, pattern="gpt2")
    theirs = tiktoken.Encoding("gaps", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    for text in ("abc abcd cdab", "abcabc", "dcba"):
        assert ours.encode(text) == theirs.encode_ordinary(text)


# ---------------------------------------------------------------------- netcl files


NETCL_MALFORMED = [
    (
        "tokens-object",
        lambda d: d.update(tokens={}),
        '"tokens" must be a list of \\[id, base64\\], got object',
    ),
    (
        "token-id-bool",
        lambda d: d["tokens"].__setitem__(5, [True, "BQ=="]),
        r"tokens\[5\] = \[True, 'BQ=='\] is not",
    ),
    (
        "token-id-float",
        lambda d: d["tokens"].__setitem__(5, [5.0, "BQ=="]),
        r"tokens\[5\] = \[5.0, 'BQ=='\] is not",
    ),
    ("token-b64-number", lambda d: d["tokens"].__setitem__(5, [5, 5]), r"tokens\[5\] = \[5, 5\] is not"),
    (
        "token-empty",
        lambda d: d["tokens"].append([999, ""]),
        r"tokens\[\d+\]: the empty byte string cannot be a token",
    ),
    (
        "token-twice",
        lambda d: d["tokens"].append([999, "YQ=="]),
        r"tokens\[\d+\] gives the byte string b'a' id 999, but tokens\[97\] already gave it id 97",
    ),
    (
        "id-twice",
        lambda d: d["tokens"].append([97, base64.b64encode(b"zzz").decode()]),
        r"gives id 97 to b'zzz', but tokens\[97\] already gave it to b'a'",
    ),
    ("pattern-number", lambda d: d.update(pattern=5), '"pattern" must be a regex string, got number'),
    ("pattern-invalid", lambda d: d.update(pattern="(unclosed"), '"pattern" is not a valid regex'),
    (
        "specials-list",
        lambda d: d.update(special_tokens=["<x>"]),
        '"special_tokens" must be an object .*got list',
    ),
    ("special-id-string", lambda d: d["special_tokens"].update({"<x>": "5"}), "entry '<x>': '5' must be"),
    (
        "special-id-ordinary",
        lambda d: d["special_tokens"].update({"<x>": 97}),
        "special token '<x>' has id 97, which the ordinary token b'a' already has",
    ),
    (
        "special-id-twice",
        lambda d: d["special_tokens"].update({"<x>": d["special_tokens"]["<|endoftext|>"]}),
        "gives id .* to the special token '<x>', but .* already gave it to '<\\|endoftext\\|>'",
    ),
    ("name-number", lambda d: d.update(name=5), '"name" must be a string, got number'),
    ("merges-string", lambda d: d.update(merges="none"), '"merges" must be a list'),
    (
        "merge-pair",
        lambda d: d["merges"].append([1, 2]),
        r'"merges"\[\d+\] = \[1, 2\] is not \[left, right, new\]',
    ),
    (
        "merge-unknown-id",
        lambda d: d["merges"].append([1, 2, 99999]),
        r"= \[1, 2, 99999\] is not \[left, right, new\]",
    ),
    (
        "key-twice",
        lambda d: json.dumps(d)[:-1] + ', "name": "again"}',
        "the top-level object has the key 'name' twice",
    ),
]


@pytest.mark.parametrize(
    "change, words", [row[1:] for row in NETCL_MALFORMED], ids=[row[0] for row in NETCL_MALFORMED]
)
def test_netcl_malformed_names_file_and_field(trained, tmp_path, change, words):
    path = tmp_path / "tok.json"
    trained.save(path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    result = change(doc)
    path.write_text(result if isinstance(result, str) else json.dumps(doc), encoding="utf-8")
    with pytest.raises(TokenizerFileError) as info:
        BPETokenizer.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert re.search(words, message), message
