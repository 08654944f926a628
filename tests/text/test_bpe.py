"""BPETokenizer: hand-checked merges, round trips, special tokens, decoding and bad input."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netcl.text import BPETokenizer, SpecialTokenError, TokenIdTypeError, UnknownTokenError
from netcl.text.merge import byte_pair_split

from .conftest import DATA

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def small() -> BPETokenizer:
    text = (DATA / "multilingual.txt").read_text(encoding="utf-8")
    return BPETokenizer.train(text, 600, pattern="cl100k", special_tokens=SPECIALS)


def test_wikipedia_aaabdaaabac():
    # aa -> Z (256); then ab and Za both occur twice: the tie goes to the smaller pair (97, 98), so
    # ab -> Y (257); then ZY -> X (258). Encoding gives XdXac as on Wikipedia's "Byte pair encoding" page.
    tok = BPETokenizer.train("aaabdaaabac", 259, pattern=None)
    assert tok.merges == [((97, 97), 256), ((97, 98), 257), ((256, 257), 258)]
    assert [tok.token_bytes(i) for i in (256, 257, 258)] == [b"aa", b"ab", b"aaab"]
    assert tok.encode("aaabdaaabac") == [258, ord("d"), 258, ord("a"), ord("c")]
    assert tok.n_vocab == 259


def test_pre_split_limits_merges():
    # gpt2 pattern splits "ab ab ab" into "ab", " ab", " ab": (a, b) counts 3, (' ', a) 2, then (' ', ab) 2.
    tok = BPETokenizer.train("ab ab ab", 258, pattern="gpt2")
    assert tok.merges == [((97, 98), 256), ((32, 256), 257)]
    assert tok.encode("ab ab") == [256, 257]
    # The pattern never lets a merge cross a chunk boundary: no token contains "b ".
    assert all(b"b " not in tok.token_bytes(i) for i in range(tok.n_vocab))


def test_training_stops_when_pairs_run_out_and_specials_follow():
    tok = BPETokenizer.train("ab", 1000, pattern=None, special_tokens=["<|endoftext|>"])
    assert tok.merges == [((97, 98), 256)]
    assert tok.special_tokens == {"<|endoftext|>": 257}
    assert tok.n_vocab == 258


def test_special_tokens_are_not_learned():
    text = "<|endoftext|>" * 50 + "hello"
    tok = BPETokenizer.train(text, 270, pattern="gpt2", special_tokens=["<|endoftext|>"])
    learned = [tok.token_bytes(new) for _, new in tok.merges]
    assert all(b"<" not in t and b"|" not in t for t in learned)
    assert tok.encode("<|endoftext|>", allowed_special="all") == [tok.special_id("<|endoftext|>")]


def test_train_from_files(tmp_path):
    # Each file is pre-split on its own; with files that end in "\n" and start with a letter, the
    # concatenated text has the same chunk multiset, so the learned merges must be identical.
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("low lower lowest\n" * 20, encoding="utf-8")
    b.write_text("newer newest wider\n" * 20, encoding="utf-8")
    from_files = BPETokenizer.train([a, str(b)], 300, pattern="gpt2")
    from_text = BPETokenizer.train(a.read_text() + b.read_text(), 300, pattern="gpt2")
    assert from_files.merges == from_text.merges
    assert len(from_files.merges) > 10  # the whole vocabulary of this text, fewer than 44 merges
    single = BPETokenizer.train(a, 270, pattern="gpt2")
    assert single.merges == BPETokenizer.train(a.read_text(), 270, pattern="gpt2").merges


def test_train_progress_and_verbose(capsys):
    tok = BPETokenizer.train("hello hello help", 260, pattern="gpt2", verbose=True, progress=True)
    out = capsys.readouterr().out
    assert out.count("merge ") == len(tok.merges) == 4


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello world",
        "  leading and trailing  \n\n\t",
        "我能吞下玻璃而不伤身体。",
        "いろはにほへと 東京",
        "😀👍🏽👨‍👩‍👧‍👦🏳️‍🌈🇯🇵",
        "e\u0301 n\u0303 Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o",
        "Съешь же ещё этих мягких французских булок",
        "نص حكيم له سر قاطع",
        "\x00\x01\x7f\u0080\uffff\U0010ffff",
    ],
)
def test_round_trip_fixed(small, cl100k, text):
    for tok in (small, cl100k):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert tok.decode_bytes(ids) == text.encode("utf-8")


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_round_trip_random_strings(small, cl100k, text):
    assert small.decode(small.encode_ordinary(text)) == text
    assert cl100k.decode(cl100k.encode_ordinary(text)) == text


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_round_trip_random_bytes(small, data):
    # Arbitrary bytes reach the tokenizer as text decoded with replacement; that text must round-trip.
    text = data.decode("utf-8", errors="replace")
    assert small.decode(small.encode(text)) == text


def test_lone_surrogates_become_replacement(cl100k, tiktoken_cl100k):
    text = "a\ud800b"
    assert cl100k.encode(text) == tiktoken_cl100k.encode(text)
    assert cl100k.decode(cl100k.encode(text)) == "a\ufffdb"


def test_decode_invalid_utf8_uses_replacement(cl100k):
    euro = cl100k.encode("€")  # 3 UTF-8 bytes e2 82 ac
    first_byte = cl100k.encode_ordinary("\u20ac")[0]
    assert cl100k.decode_bytes(euro) == b"\xe2\x82\xac"
    partial = [cl100k.ranks[b"\xe2"]]
    assert cl100k.decode(partial) == "\ufffd"
    assert cl100k.decode_bytes(partial) == b"\xe2"
    assert first_byte in euro


def test_decode_random_ids_gives_exact_bytes(small):
    rng = random.Random(0)
    ids = [rng.randrange(small.n_vocab) for _ in range(500)]
    data = small.decode_bytes(ids)
    assert data == b"".join(small.token_bytes(i) for i in ids)
    assert small.decode(ids) == data.decode("utf-8", errors="replace")


def test_fast_path_whole_chunk_is_one_token(cl100k):
    word = " hello"
    assert cl100k.encode(word) == [cl100k.ranks[b" hello"]]


def test_byte_pair_split_leftmost_lowest_rank():
    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 300, b"bc": 300 + 1, b"abc": 302}
    # "abc": ab (300) beats bc (301), then ab+c (302): one part.
    assert byte_pair_split(b"abc", ranks) == [0, 3]
    # "abab": ab at 0 and 2 tie at 300; leftmost first, then the other; "abab" is not a token.
    assert byte_pair_split(b"abab", ranks) == [0, 2, 4]
    assert byte_pair_split(b"", ranks) == [0]


def test_encode_batch_matches_encode(small):
    texts = ["one", "two three", "", "四五"]
    assert small.encode_batch(texts) == [small.encode(t) for t in texts]
    with pytest.raises(TypeError, match="sequence of str"):
        small.encode_batch("not a list")


# ---------------------------------------------------------------------- special tokens


def test_special_token_in_text_raises_by_default(small):
    with pytest.raises(SpecialTokenError) as info:
        small.encode("hi <|im_end|> there")
    assert info.value.token == "<|im_end|>"
    assert info.value.position == 3
    assert isinstance(info.value, ValueError)
    assert "allowed_special" in str(info.value)


def test_special_token_allowed_set_all_and_plain(small):
    text = "a<|im_start|>b<|endoftext|>"
    start, end = small.special_id("<|im_start|>"), small.special_id("<|endoftext|>")
    assert small.encode(text, allowed_special="all") == small.encode("a") + [start] + small.encode("b") + [
        end
    ]
    with pytest.raises(SpecialTokenError, match="endoftext"):
        small.encode(text, allowed_special={"<|im_start|>"})
    plain = small.encode(text, allowed_special="none")
    assert plain == small.encode_ordinary(text)
    assert start not in plain and end not in plain
    assert small.decode(plain) == text


def test_allowed_special_bad_values(small):
    with pytest.raises(ValueError, match="lacks"):
        small.encode("x", allowed_special={"<|nope|>"})
    with pytest.raises(ValueError, match="none_raise"):
        small.encode("x", allowed_special="some")
    with pytest.raises(TypeError, match="allowed_special"):
        small.encode("x", allowed_special=3)


# ---------------------------------------------------------------------- bad input


def test_bad_input_errors(small):
    with pytest.raises(TypeError, match="text must be str"):
        small.encode(b"bytes")
    with pytest.raises(UnknownTokenError, match="token id 99999 at position 1"):
        small.decode([1, 99999])
    with pytest.raises(UnknownTokenError, match="position 0"):
        small.decode(["a"])
    with pytest.raises(KeyError, match="not in this tokenizer"):
        small.special_id("<|eot_id|>")


def test_train_argument_errors():
    with pytest.raises(ValueError, match="smaller than 256 byte tokens \\+ 2 special tokens = 258"):
        BPETokenizer.train("abc", 257, special_tokens=["<a>", "<b>"])
    with pytest.raises(TypeError, match="vocab_size must be int"):
        BPETokenizer.train("abc", 300.0)
    with pytest.raises(TypeError, match="text_or_files"):
        BPETokenizer.train(12, 300)
    with pytest.raises(ValueError, match="duplicates"):
        BPETokenizer.train("abc", 300, special_tokens=["<a>", "<a>"])
    with pytest.raises(ValueError, match="invalid pre-split pattern"):
        BPETokenizer.train("abc", 300, pattern="(unclosed")


def test_constructor_validates_ranks():
    ranks = {bytes([b]): b for b in range(256)}
    with pytest.raises(ValueError, match="1 missing"):
        BPETokenizer({k: v for k, v in ranks.items() if k != b"\x05"}, "gpt2")
    with pytest.raises(ValueError, match="collides"):
        BPETokenizer(ranks, "gpt2", {"<s>": 3})
    with pytest.raises(ValueError, match="duplicate ids"):
        BPETokenizer(ranks | {b"ab": 3}, "gpt2")
    with pytest.raises(TypeError, match="ranks must map bytes"):
        BPETokenizer(ranks | {"ab": 300}, "gpt2")


# ---------------------------------------------------------------------- decode: what counts as a token id


def test_decode_accepts_numpy_integers(cl100k, tiktoken_cl100k):
    np = pytest.importorskip("numpy")
    text = "decode NumPy ids: 日本語 😀"
    ids = tiktoken_cl100k.encode(text)
    for dtype in (np.int64, np.int32, np.uint32):
        assert cl100k.decode(np.array(ids, dtype=dtype)) == text
        assert cl100k.decode([dtype(i) for i in ids]) == text
    assert cl100k.decode(np.array([], dtype=np.int64)) == ""


@pytest.mark.parametrize(
    "ids, words",
    [
        ([1.0, True], r"token id 1\.0 at position 0 is a float"),
        ([5, True], "token id True at position 1 is a bool"),
        ([5, "7"], "token id '7' at position 1 is a str"),
        ([None], "token id None at position 0 is a NoneType"),
    ],
)
def test_decode_rejects_non_integer_ids(small, ids, words):
    for call in (small.decode, small.decode_bytes):
        with pytest.raises(TypeError, match=words) as info:
            call(ids)
        assert isinstance(info.value, TokenIdTypeError)


def test_decode_rejects_non_integer_arrays_and_containers(small):
    np = pytest.importorskip("numpy")
    with pytest.raises(TokenIdTypeError, match="dtype float64"):
        small.decode(np.array([1.0, 2.0]))
    with pytest.raises(TokenIdTypeError, match="dtype bool"):
        small.decode(np.array([True]))
    with pytest.raises(TypeError, match="is a float64"):
        small.decode([np.float64(1.0)])
    with pytest.raises(TypeError, match="is a bool"):
        small.decode([np.True_])
    with pytest.raises(TypeError, match=r"1-D array, got shape \(1, 2\)"):
        small.decode(np.array([[1, 2]]))
    with pytest.raises(TypeError, match="use encode"):
        small.decode("hello")
    with pytest.raises(TypeError, match="use encode"):
        small.decode(b"hello")
    with pytest.raises(TypeError, match="iterable of int token ids, got int"):
        small.decode(5)


@pytest.mark.parametrize("bad_id", [-1, 10**6, 599 + 100])
def test_decode_out_of_vocabulary_ids(small, bad_id):
    with pytest.raises(UnknownTokenError, match=f"token id {bad_id} at position 2 is not in the vocabulary"):
        small.decode([1, 2, bad_id])
    with pytest.raises(UnknownTokenError, match=f"token id {bad_id} at position 0"):
        small.token_bytes(bad_id)


# ---------------------------------------------------------------------- encode: arguments


def test_encode_arguments_are_checked(small):
    for call in (small.encode, small.encode_ordinary):
        for bad in (None, 3, b"bytes", ["a"]):
            with pytest.raises(TypeError, match=f"text must be str, got {type(bad).__name__}"):
                call(bad)
    with pytest.raises(TypeError, match=r"texts\[1\] must be str, got int"):
        small.encode_batch(["a", 3])
    with pytest.raises(TypeError, match="sequence of str, got NoneType"):
        small.encode_batch(None)
    assert small.encode_batch(t for t in ("a", "b")) == [small.encode("a"), small.encode("b")]


@pytest.mark.parametrize(
    "allowed, error, words",
    [
        ({1}, TypeError, "allowed_special holds 1, a int"),
        ({"<|endoftext|>", 2.5}, TypeError, "allowed_special holds 2.5"),
        ({"<|nope|>"}, ValueError, r"lacks: \['<\|nope\|>'\] \(it has: <\|endoftext\|>, <\|im_end\|>"),
        ("<|endoftext|>", ValueError, r"to allow that one token pass \{'<\|endoftext\|>'\}"),
        (None, TypeError, "got NoneType"),
        ([["<|endoftext|>"]], TypeError, "allowed_special must be"),
    ],
)
def test_allowed_special_is_checked(small, allowed, error, words):
    with pytest.raises(error, match=words):
        small.encode("x", allowed_special=allowed)


# ---------------------------------------------------------------------- constructor and train arguments

BYTES = {bytes([b]): b for b in range(256)}


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"ranks": BYTES | {b"ab": True}}, TypeError, "non-negative int, got b'ab' -> True"),
        ({"ranks": BYTES | {b"ab": 3.0}}, TypeError, "got b'ab' -> 3.0"),
        ({"ranks": BYTES | {b"": 300}}, ValueError, "empty byte string to id 300"),
        ({"ranks": BYTES | {b"ab": 97}}, ValueError, "duplicate ids: b'a' and b'ab' both have id 97"),
        ({"special_tokens": ["<s>"]}, TypeError, "special_tokens must be a mapping str -> int id, got list"),
        ({"special_tokens": {"<s>": True}}, TypeError, "'<s>' needs a non-negative int id, got True"),
        ({"special_tokens": {"<s>": 300, "</s>": 300}}, ValueError, "share an id: '<s>' and '</s>' -> 300"),
        ({"special_tokens": {"<s>": 97}}, ValueError, r"collides with an ordinary token id \(token b'a'\)"),
        ({"cache_size": 1.5}, TypeError, "cache_size must be an int number of entries, got 1.5"),
        ({"cache_size": "100"}, TypeError, "got '100'"),
        ({"cache_size": -1}, ValueError, "cache_size must be >= 0"),
        ({"name": 3}, TypeError, "name must be str, got int"),
        ({"merge_priority": {b"zz": 1}}, ValueError, "merge_priority has b'zz', which is not in ranks"),
        ({"merge_priority": {b"ab": 1.0}}, TypeError, "merge_priority must map bytes to int"),
        (
            {"merges": [(97, 98)]},
            TypeError,
            r"merges\[0\] = \(97, 98\) is not \(\(left_id, right_id\), new_id\)",
        ),
        ({"merges": [((97, 98), 999)]}, ValueError, "names id 999, which is not an ordinary token's id"),
        ({"merges": [((97, 98.0), 256)]}, TypeError, "holds 98.0"),
        ({"pattern": 5}, TypeError, "pattern must be a str or None, got int"),
    ],
)
def test_constructor_arguments_are_checked(kwargs, error, words):
    args = {"ranks": BYTES | {b"ab": 256}, "pattern": "gpt2"} | kwargs
    ranks, pattern = args.pop("ranks"), args.pop("pattern")
    with pytest.raises(error, match=words):
        BPETokenizer(ranks, pattern, **args)


@pytest.mark.parametrize(
    "args, kwargs, error, words",
    [
        (("abc", "300"), {}, TypeError, "vocab_size must be int, got str '300'"),
        (("abc", 300.0), {}, TypeError, r"got float 300\.0 \(sizes are never rounded\)"),
        (("abc", True), {}, TypeError, "got bool True"),
        (("abc", 255), {}, ValueError, "smaller than 256 byte tokens"),
        (
            ("abc", 300),
            {"special_tokens": "<|endoftext|>"},
            TypeError,
            re.escape("single str '<|endoftext|>'; wrap it in a list"),
        ),
        (("abc", 300), {"special_tokens": None}, TypeError, "iterable of non-empty str, got NoneType"),
        (("abc", 300), {"special_tokens": ["<a>", ""]}, TypeError, "non-empty str, got ''"),
        (("abc", 300), {"special_tokens": [7]}, TypeError, "non-empty str, got 7"),
        ((b"abc", 300), {}, TypeError, "decode bytes to str first"),
        (([b"a.txt"], 300), {}, TypeError, "training file list holds a bytes"),
        (("abc", 300), {"name": None}, TypeError, "name must be str, got NoneType"),
        (("abc", 300), {"pattern": 3}, TypeError, "pattern must be a str or None"),
    ],
)
def test_train_arguments_are_checked(args, kwargs, error, words):
    with pytest.raises(error, match=words):
        BPETokenizer.train(*args, **kwargs)


def test_a_str_that_names_a_file_is_not_taken_for_the_text(tmp_path, monkeypatch):
    """train("corpus.txt", ...) trained on the 10 characters of the name (a 267-id tokenizer, silently), where
    ["corpus.txt"] and Path("corpus.txt") read the file."""
    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text("the cat sat on the mat. " * 20, encoding="utf-8")
    with pytest.raises(ValueError, match=r"str 'corpus.txt', which names a file: .* Path\('corpus.txt'\)"):
        BPETokenizer.train("corpus.txt", 270)
    from_file = BPETokenizer.train(Path("corpus.txt"), 270)
    assert BPETokenizer.train(["corpus.txt"], 270).ranks == from_file.ranks
    assert from_file.ranks == BPETokenizer.train("the cat sat on the mat. " * 20, 270).ranks
    assert BPETokenizer.train("corpus", 257).n_vocab == 257  # a str naming no file is text, as before


@pytest.mark.parametrize("name", ["cl100k_base", "GPT2", "o200k-base", "nope"])
def test_a_misspelt_pattern_name_is_refused(name, tmp_path):
    """A bare word that names no pattern was taken as a regex: it cut only that literal word out of the text
    and left the rest unsplit, so merges crossed words (a 300-id tokenizer came out, silently)."""
    words = re.escape(f"pre-split pattern {name!r} is not one of the named patterns ")
    with pytest.raises(ValueError, match=words):
        BPETokenizer.train("ab cd ab cd " * 20, 260, pattern=name)
    path = tmp_path / "r.tiktoken"
    BPETokenizer.train("ab cd " * 20, 260).save_tiktoken(path)
    with pytest.raises(ValueError, match=words):
        BPETokenizer.from_tiktoken(path, pattern=name)
    for kept in ("gpt2", r"[a-z]+", r"\w+|\s+"):
        assert len(BPETokenizer.train("ab cd ab cd " * 20, 260, pattern=kept).encode("ab")) == 1


@pytest.mark.parametrize("pattern", ["", r"\b", r"(?=\w)", "^"])
def test_a_pattern_that_matches_only_empty_strings_is_refused(pattern, tmp_path):
    """Such a pattern marks no piece: "" cut text into single characters (no merge ever applied), silently.
    Every way in refuses it, naming the pattern; one that matches something is kept."""
    words = re.escape(f"pre-split pattern {pattern!r} matches only empty strings")
    trained = BPETokenizer.train("ab cd ab cd " * 20, 260, pattern=r"[a-z]+|\s+")
    path = tmp_path / "r.tiktoken"
    trained.save_tiktoken(path)
    with pytest.raises(ValueError, match=words):
        BPETokenizer.from_tiktoken(path, pattern=pattern)
    with pytest.raises(ValueError, match=words):
        BPETokenizer(BYTES | {b"ab": 256}, pattern)
    with pytest.raises(ValueError, match=words):
        BPETokenizer.train("ab cd " * 20, 260, pattern=pattern)
    for kept in (r"\d*", r"[a-z]+", None):  # matches digits (and empty strings elsewhere); covers letters
        tok = BPETokenizer.from_tiktoken(path, pattern=kept)
        assert tok.decode(tok.encode("ab cd 12")) == "ab cd 12"
    assert len(BPETokenizer.from_tiktoken(path, pattern=r"[a-z]+").encode("ab")) == 1  # "ab" is one piece
