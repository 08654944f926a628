"""SentencePiece-style tokenizer.json (Llama 2, TinyLlama, Mistral): byte_fallback BPE with ▁ for spaces,
checked id for id against the `tokenizers` library on files it builds and trains here."""

from __future__ import annotations

import copy
import json

import pytest

from netcl.text import (
    CHATML,
    LLAMA3,
    ZEPHYR,
    BPETokenizer,
    ChatFormat,
    TokenizerFileError,
    template_from_jinja,
)

from .conftest import build_corpus

tokenizers = pytest.importorskip("tokenizers")

SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
BOS_TEMPLATE = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [
        {"SpecialToken": {"id": "<s>", "type_id": 0}},
        {"Sequence": {"id": "A", "type_id": 0}},
        {"SpecialToken": {"id": "<s>", "type_id": 1}},
        {"Sequence": {"id": "B", "type_id": 1}},
    ],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
}
#: TinyLlama's / Llama 2's (legacy converter) normalizer and decoder.
PREPEND_NORMALIZER = {
    "type": "Sequence",
    "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
    ],
}
STRIP_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ],
}

#: Text the trained vocabulary lacks characters for (byte fallback), odd whitespace, specials, a literal ▁.
HARD_TEXTS = [
    "Hello world",
    "  two  leading, trailing  ",
    " ",
    "\t\ttabs\tand\nnew\r\nlines\n\n\n",
    "中文 😀 é ñ Ω Ж 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👩‍👩‍👧",
    "a▁literal▁metaspace ▁",
    "<s>hi</s>there <unk> </s>",
    "x",
    "\x00\x01 control \x7f",
]


def _train(text: str, vocab_size: int = 900) -> dict:
    """A tokenizer.json laid out as TinyLlama's: <unk> <s> </s>, the 256 byte tokens, then trained merges."""
    from tokenizers import Tokenizer, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS + BYTE_TOKENS, limit_alphabet=300, show_progress=False
    )
    tok.train_from_iterator([text[i : i + 2000] for i in range(0, len(text), 2000)], trainer)
    doc = json.loads(tok.to_str())
    doc["added_tokens"] = [a for a in doc["added_tokens"] if a["content"] in SPECIALS]
    doc["post_processor"] = copy.deepcopy(BOS_TEMPLATE)
    doc["decoder"] = copy.deepcopy(STRIP_DECODER)
    return doc


def _metaspace_variant(doc: dict, prepend_scheme: str, split: bool) -> dict:
    """The same vocabulary behind a Metaspace pre-tokenizer (the newer Llama converter's layout)."""
    out = copy.deepcopy(doc)
    out["normalizer"] = None
    out["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": prepend_scheme,
                            "split": split}
    # Llama's own decoder (the Metaspace decoder would leave <0xAB> tokens as text); no Strip for "never"
    out["decoder"] = copy.deepcopy(STRIP_DECODER)
    if prepend_scheme == "never":
        out["decoder"]["decoders"].pop()
    return out


# characters the trained vocabulary must not hold (the byte-fallback test): taken out of the corpus, whose
# stdlib part differs between Python versions (3.12's put "😀" among the 300 most frequent characters)
UNKNOWN_CHARS = "😀Ω𝔘\x01"


@pytest.fixture(scope="module")
def trained() -> dict:
    text = build_corpus(60_000)
    for char in UNKNOWN_CHARS:
        text = text.replace(char, "")
    return _train(text)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    corpus = build_corpus(30_000)
    lines = corpus.splitlines(keepends=True)
    return ["".join(lines[i : i + 9]) for i in range(0, len(lines), 9)] + HARD_TEXTS


def _pair(doc: dict, tmp_path, name: str = "tokenizer.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return BPETokenizer.from_hf(path), tokenizers.Tokenizer.from_file(str(path))


VARIANTS = {
    "normalizer": lambda doc: doc,
    "metaspace-first": lambda doc: _metaspace_variant(doc, "first", False),
    "metaspace-always-split": lambda doc: _metaspace_variant(doc, "always", True),
    "metaspace-never": lambda doc: _metaspace_variant(doc, "never", False),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_ids_and_text_equal_tokenizers(trained, texts, tmp_path, variant):
    ours, ref = _pair(VARIANTS[variant](trained), tmp_path)
    for text in texts:
        expected = ref.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, allowed_special="all") == expected, text[:80]
        assert ours.encode(text, allowed_special="all", add_bos=True) == ref.encode(text).ids, text[:80]
        assert ours.decode(expected) == ref.decode(expected, skip_special_tokens=False), text[:80]


def test_round_trip_and_bos(trained, texts, tmp_path):
    ours, _ = _pair(trained, tmp_path)
    assert ours.metaspace == "prepend"
    assert ours.bos_token == "<s>" and ours.special_tokens == {"<unk>": 0, "<s>": 1, "</s>": 2}
    for text in texts:
        expected = text.replace("▁", " ")  # ▁ is a space to SentencePiece, so it decodes as one
        assert ours.decode(ours.encode_ordinary(text)) == expected, text[:80]
        # the space before the text stays after <s>, as in Hugging Face's decode with the special tokens
        assert ours.decode(ours.encode(text, allowed_special="none", add_bos=True)) == "<s> " + expected


def test_byte_fallback_gives_the_bytes_of_unknown_characters(trained, tmp_path):
    ours, ref = _pair(trained, tmp_path)
    vocab = trained["model"]["vocab"]
    for char in UNKNOWN_CHARS:
        assert char not in vocab
        ids = ours.encode_ordinary(char)
        # a space (▁ or its byte fallback when ▁ alone is not a token) then the character's UTF-8 bytes
        byte_ids = [vocab[f"<0x{b:02X}>"] for b in char.encode("utf-8")]
        assert ids[-len(byte_ids) :] == byte_ids
        assert ids == ref.encode(char, add_special_tokens=False).ids
        assert ours.decode(ids) == char


def test_hand_checked_ids(tmp_path):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{t: 3 + b for b, t in enumerate(BYTE_TOKENS)}}
    for token in ["▁", "h", "i", "é", "▁h", "▁hi", "hi", "é▁"]:
        vocab[token] = len(vocab)
    doc = {
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, t in enumerate(SPECIALS)
        ],
        "normalizer": PREPEND_NORMALIZER,
        "pre_tokenizer": None,
        "post_processor": BOS_TEMPLATE,
        "decoder": STRIP_DECODER,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True,
                  "byte_fallback": True, "vocab": vocab, "merges": ["▁ h", "▁h i", "h i", "é ▁"]},
    }
    ours, ref = _pair(doc, tmp_path)
    # ids: ▁ 259, h 260, i 261, é 262, ▁h 263, ▁hi 264, hi 265, é▁ 266
    # "hi hé" -> "▁hi▁hé": ▁+h at both places (merge 0), then ▁h+i (merge 1); the second ▁h and é stay
    expected = ref.encode("hi hé", add_special_tokens=False).ids
    assert ours.encode_ordinary("hi hé") == [264, 263, 262] == expected
    # "😀" is no token: ▁ then the four bytes F0 9F 98 80 as <0xF0> <0x9F> <0x98> <0x80>
    assert ours.encode("😀", add_bos=True) == [1, 259, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80]
    # "▁é▁é": é+▁ (merge 3) is the only pair that is a merge
    assert ours.encode("é é") == [259, 266, 262] == ref.encode("é é", add_special_tokens=False).ids
    assert ours.decode([1, 264, 262]) == "<s> hié"
    assert ours.decode([264, 262]) == "hié"
    assert ours.decode([3 + 0xC3, 3 + 0xA9]) == "é"


def _llama_file(**changes) -> dict:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{t: 3 + b for b, t in enumerate(BYTE_TOKENS)}, "▁a": 259,
             "▁": 260, "a": 261}
    doc = {
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, t in enumerate(SPECIALS)
        ],
        "normalizer": PREPEND_NORMALIZER,
        "pre_tokenizer": None,
        "post_processor": BOS_TEMPLATE,
        "decoder": STRIP_DECODER,
        "model": {"type": "BPE", "byte_fallback": True, "vocab": vocab, "merges": ["▁ a"]},
    }
    doc.update(changes)
    return copy.deepcopy(doc)  # the tests change it in place; the shared pieces must not change


def test_tiny_file_loads(tmp_path):
    ours, ref = _pair(_llama_file(), tmp_path)
    assert ours.encode("a a") == [259, 259] == ref.encode("a a", add_special_tokens=False).ids


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda d: d["model"].update(type="Unigram"), "model.type is 'Unigram': netcl reads only BPE models"),
        (lambda d: d.update(normalizer={"type": "NFKC"}), "normalizer 'NFKC' {} is not supported; "
         "SentencePiece-style files need"),
        (lambda d: d.update(normalizer=None, pre_tokenizer={"type": "Whitespace"}),
         r"pre_tokenizer type 'Whitespace' is not supported with byte_fallback BPE \(Metaspace or null\)"),
        (lambda d: d.update(normalizer=None), "neither normalizer nor pre_tokenizer"),
        (lambda d: d.update(normalizer={"type": "Prepend", "prepend": "▁"}), 'has no Replace " " -> "▁"'),
        (lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁"}),
         "normalizer and a Metaspace pre-tokenizer both"),
        (lambda d: d.update(normalizer=None, pre_tokenizer={"type": "Metaspace", "replacement": "_"}),
         "pre_tokenizer.replacement is '_'"),
        (lambda d: d.update(normalizer=None, pre_tokenizer={"type": "Metaspace", "prepend_scheme": "often"}),
         "prepend_scheme is 'often'; supported: 'always', 'first', 'never'"),
        (lambda d: d["model"]["vocab"].pop("<0x7F>"), r"byte_fallback is true but model.vocab lacks 1 of the "
         r"byte tokens <0x00>..<0xFF> \(first: <0x7F>\)"),
        (lambda d: d["model"]["vocab"].update({" a": 262}), r"model.vocab\[' a'\] gives the byte string"),
        (lambda d: d["model"]["merges"].append("a ▁"), r"model.merges\[1\] = 'a ▁' makes a token missing"),
        (lambda d: d.update(normalizer=None) or d["model"].update(byte_fallback=False),
         r"outside the byte-level alphabet \(a SentencePiece-style vocab: netcl reads one with "
         r"model.byte_fallback=true only\)"),
        (lambda d: d["post_processor"]["single"].append({"SpecialToken": {"id": "</s>", "type_id": 0}}),
         r"post_processor.single is '<s> \$A </s>'; netcl supports '\$A' and one special token before it"),
    ],
)
def test_unsupported_or_malformed(tmp_path, change, words):
    doc = _llama_file()
    change(doc)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(TokenizerFileError, match=words):
        BPETokenizer.from_hf(path)


def test_add_bos_without_a_bos_token_says_so(tmp_path):
    doc = _llama_file(post_processor=None)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    tok = BPETokenizer.from_hf(path)
    assert tok.bos_token is None
    with pytest.raises(ValueError, match="has no bos_token"):
        tok.encode("a", add_bos=True)


#: TinyLlama-1.1B-Chat's chat_template (tokenizer_config.json), a Zephyr-style layout.
TINYLLAMA_CHAT_TEMPLATE = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + "
    "message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}"
)
DIALOG = [
    {"role": "system", "content": "You are a friendly chatbot who always responds in the style of a pirate."},
    {"role": "user", "content": "How many helicopters can a human eat in one sitting? 😀"},
    {"role": "assistant", "content": "  None, matey — Ω not on the menu.\n"},
    {"role": "user", "content": "Why   not?"},
]


@pytest.mark.parametrize("variant", ["normalizer", "metaspace-first"])
def test_zephyr_chat_equals_transformers_apply_chat_template(trained, tmp_path, variant):
    transformers = pytest.importorskip("transformers")
    ours, _ = _pair(VARIANTS[variant](trained), tmp_path)
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "tokenizer.json"), bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    hf.chat_template = TINYLLAMA_CHAT_TEMPLATE
    chat = ChatFormat(ours, template_from_jinja(TINYLLAMA_CHAT_TEMPLATE))
    assert chat.template is ZEPHYR
    for messages, prompt in [(DIALOG, True), (DIALOG[:3], False), (DIALOG[1:2], True)]:
        expected = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt)
        if not isinstance(expected, list):
            expected = expected["input_ids"]
        ids, mask = chat.encode_dialog(messages, add_generation_prompt=prompt)
        assert ids == list(expected)
        assert chat.render(messages, add_generation_prompt=prompt) == hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=prompt
        )
        # the loss mask covers the assistant's reply and its </s>, nothing else
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        trained_text = ours.decode_bytes([i for i, m in zip(ids, mask, strict=True) if m]).decode()
        assert trained_text == "".join(r + "</s>" for r in replies)


def test_template_from_jinja_recognizes_known_layouts_only():
    assert template_from_jinja(TINYLLAMA_CHAT_TEMPLATE) is ZEPHYR
    chatml = "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}"
    assert template_from_jinja(chatml) is CHATML
    llama3 = "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}"
    assert template_from_jinja(llama3) is LLAMA3
    assert template_from_jinja("{{ '[INST] ' + m['content'] + ' [/INST]' }}") is None
    with pytest.raises(TypeError, match="chat_template must be a str"):
        template_from_jinja(None)


def test_saving_as_byte_level_is_refused(tmp_path):
    tok, _ = _pair(_llama_file(), tmp_path)
    for method in ("save", "save_hf", "save_tiktoken"):
        with pytest.raises(ValueError, match=f"{method}\\(\\) writes byte-level BPE; tokenizer .* is "
                                             "SentencePiece-style"):
            getattr(tok, method)(tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_byte_level_file_with_llama3_post_processor_has_its_bos(tmp_path):
    """Llama 3's tokenizer.json: Sequence[ByteLevel, TemplateProcessing(<|begin_of_text|> $A)]."""
    specials = ["<|begin_of_text|>", "<|eot_id|>"]
    trained = BPETokenizer.train(build_corpus(20_000), 400, special_tokens=specials)
    trained.save_hf(tmp_path / "tokenizer.json")
    doc = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    bos = copy.deepcopy(BOS_TEMPLATE)
    bos["single"][0]["SpecialToken"]["id"] = "<|begin_of_text|>"
    bos["pair"][0]["SpecialToken"]["id"] = bos["pair"][2]["SpecialToken"]["id"] = "<|begin_of_text|>"
    begin = trained.special_id("<|begin_of_text|>")
    bos["special_tokens"] = {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [begin],
                                                   "tokens": ["<|begin_of_text|>"]}}
    doc["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}, bos]}
    ours, ref = _pair(doc, tmp_path)
    assert ours.bos_token == "<|begin_of_text|>" and ours.metaspace is None
    for text in HARD_TEXTS:
        assert ours.encode(text, allowed_special="all", add_bos=True) == ref.encode(text).ids
        assert ours.encode(text, allowed_special="all") == ref.encode(text, add_special_tokens=False).ids


def _sentencepiece_model(doc: dict, path, **normalizer) -> None:
    """``doc``'s vocabulary as a SentencePiece BPE ``tokenizer.model`` (the protobuf transformers bundles):
    a merged piece scores minus the index of the first merge making it, so score order is merge order."""
    pb = pytest.importorskip("transformers.utils.sentencepiece_model_pb2_new")
    first_merge: dict[str, int] = {}
    for i, merge in enumerate(doc["model"]["merges"]):
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        first_merge.setdefault(left + right, i)
    model = pb.ModelProto()
    kinds = {"<unk>": pb.ModelProto.SentencePiece.UNKNOWN, "<s>": pb.ModelProto.SentencePiece.CONTROL,
             "</s>": pb.ModelProto.SentencePiece.CONTROL}
    for piece, _ in sorted(doc["model"]["vocab"].items(), key=lambda kv: kv[1]):
        entry = model.pieces.add()
        entry.piece = piece
        entry.score = -float(first_merge.get(piece, 1_000_000))
        entry.type = kinds.get(piece, pb.ModelProto.SentencePiece.BYTE if piece in BYTE_TOKENS
                               else pb.ModelProto.SentencePiece.NORMAL)
    model.trainer_spec.model_type = pb.TrainerSpec.BPE
    model.trainer_spec.byte_fallback = True
    model.trainer_spec.bos_id = 1
    model.normalizer_spec.name = normalizer.get("name", "identity")
    model.normalizer_spec.add_dummy_prefix = True
    model.normalizer_spec.remove_extra_whitespaces = normalizer.get("remove_extra_whitespaces", False)
    path.write_bytes(model.SerializeToString())


def test_sentencepiece_model_encodes_as_its_tokenizer_json(trained, texts, tmp_path):
    _, ref = _pair(trained, tmp_path)
    _sentencepiece_model(trained, tmp_path / "tokenizer.model")
    ours = BPETokenizer.from_sentencepiece(tmp_path / "tokenizer.model")
    assert ours.bos_token == "<s>" and ours.metaspace == "prepend"
    assert ours.n_vocab == len(trained["model"]["vocab"])
    for text in texts:
        expected = ref.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, allowed_special="all") == expected, text[:80]
        assert ours.encode(text, allowed_special="all", add_bos=True) == ref.encode(text).ids
        assert ours.decode(ours.encode_ordinary(text)) == text.replace("▁", " ")


def test_sentencepiece_model_unsupported_is_clear(trained, tmp_path):
    path = tmp_path / "tokenizer.model"
    _sentencepiece_model(trained, path, name="nmt_nfkc", remove_extra_whitespaces=True)
    with pytest.raises(TokenizerFileError, match="normalizer_spec 'nmt_nfkc' .*netcl reads the identity"):
        BPETokenizer.from_sentencepiece(path)
    path.write_bytes(b"\x0a\xff\xff")
    with pytest.raises(TokenizerFileError, match="truncated or invalid protobuf"):
        BPETokenizer.from_sentencepiece(path)
    pb = pytest.importorskip("transformers.utils.sentencepiece_model_pb2_new")
    model = pb.ModelProto()
    model.pieces.add(piece="▁a", score=0.0)
    model.trainer_spec.model_type = pb.TrainerSpec.UNIGRAM
    path.write_bytes(model.SerializeToString())
    with pytest.raises(TokenizerFileError, match="a Unigram SentencePiece model: netcl reads BPE models"):
        BPETokenizer.from_sentencepiece(path)


def test_metaspace_pre_tokenizer_without_byte_fallback_says_what_it_needs(tmp_path):
    BPETokenizer.train("low lower lowest " * 20, 270).save_hf(tmp_path / "tokenizer.json")
    doc = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    doc["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    words = (
        r"pre-tokenizer type 'Metaspace' is not supported .*a Metaspace \(SentencePiece-style\) BPE "
        "needs model.byte_fallback=true, which this file lacks"
    )
    with pytest.raises(TokenizerFileError, match=words):
        BPETokenizer.from_hf(tmp_path / "tokenizer.json")
