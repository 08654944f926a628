"""Tokenizer files: netcl JSON, .tiktoken and Hugging Face tokenizer.json round trips, hand-written files, errors."""

from __future__ import annotations

import base64
import json

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
