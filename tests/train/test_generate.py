"""`netcl generate` / `netcl chat` on a Hugging Face layout directory with a SentencePiece-style tokenizer
(TinyLlama's: <s> added before the prompt, </s> as end of sequence, a Zephyr chat_template)."""

from __future__ import annotations

import io
import json
import sys

import pytest

from netcl.cli import main
from netcl.models import GPT, GPTConfig
from netcl.text import ZEPHYR, BPETokenizer, ChatFormat
from netcl.train.generate import chat_template, load_model_dir, stop_ids
from tests.text.test_metaspace import _sentencepiece_model

BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
SPECIALS = ["<unk>", "<s>", "</s>"]
ZEPHYR_JINJA = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] "
    "+ eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + "
    "eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n"
    "{% endif %}\n{% endfor %}"
)


def _tokenizer_json() -> dict:
    vocab = {t: i for i, t in enumerate(SPECIALS + BYTE_TOKENS)}
    merges = []
    for word in ["▁hello", "▁world", "▁hi", "<|user|>", "<|assistant|>"]:
        for char in word:
            vocab.setdefault(char, len(vocab))
        for end in range(2, len(word) + 1):  # each prefix is the one before it and one more character
            if word[:end] not in vocab:
                vocab[word[:end]] = len(vocab)
                merges.append(f"{word[: end - 1]} {word[end - 1]}")
    return {
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in enumerate(SPECIALS)
        ],
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
        },
        "decoder": None,
        "model": {
            "type": "BPE",
            "byte_fallback": True,
            "unk_token": "<unk>",
            "vocab": vocab,
            "merges": merges,
        },
    }


@pytest.fixture
def llama_dir(tmp_path, queue):
    (tmp_path / "tokenizer.json").write_text(
        json.dumps(_tokenizer_json(), ensure_ascii=False), encoding="utf-8"
    )
    tok = BPETokenizer.from_hf(tmp_path / "tokenizer.json")
    GPT(
        queue, GPTConfig(vocab_size=tok.n_vocab, dim=16, n_layers=1, n_heads=2, max_seq_len=48)
    ).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "eos_token_id": 2, "bos_token_id": 1}))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": ZEPHYR_JINJA, "eos_token": "</s>"})
    )
    return tmp_path


def test_generate_puts_bos_first_and_stops_at_eos(llama_dir, capsys):
    assert (
        main(
            [
                "generate",
                "--checkpoint",
                str(llama_dir),
                "--prompt",
                "hello world 😀",
                "--max-new-tokens",
                "6",
                "--temperature",
                "0",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    model, tok = load_model_dir(str(llama_dir), "auto")
    assert tok.bos_token == "<s>" and stop_ids(str(llama_dir), tok) == {2}
    ids = tok.encode("hello world 😀", add_bos=True)
    assert ids[:3] == [1, tok.ranks[b" hello"], tok.ranks[b" world"]]
    assert ids[4:] == [3 + b for b in "😀".encode()]  # byte fallback
    expected = []
    for t in model.generate(ids, 6, temperature=0.0):
        if int(t) == 2:
            break
        expected.append(int(t))
    assert text == "hello world 😀" + tok.decode_bytes(expected).decode("utf-8", "replace") + "\n"


def test_chat_takes_the_zephyr_template_from_tokenizer_config(llama_dir, capsys, monkeypatch):
    assert chat_template(str(llama_dir), None) is ZEPHYR
    assert chat_template(str(llama_dir), "chatml") == "chatml"
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    assert main(["chat", "--checkpoint", str(llama_dir), "--max-new-tokens", "3", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert "zephyr template" in out and out.count("assistant> ") == 1
    _, tok = load_model_dir(str(llama_dir), "auto")
    ids, _ = ChatFormat(tok, ZEPHYR).encode_dialog(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    # "<|user|>\nhi</s>\n<|assistant|>\n" as Hugging Face tokenizes it: a ▁ before each text segment
    assert tok.decode(ids) == "<|user|>\nhi</s> \n<|assistant|>\n"
    assert ids[0] == tok.ranks[b" "] and ids[1] == tok.ranks[b"<|user|>"]


def test_unknown_chat_template_is_a_clear_error(llama_dir, capsys, monkeypatch):
    (llama_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ '[INST] ' + x }}"}))
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    assert main(["chat", "--checkpoint", str(llama_dir)]) == 1
    err = capsys.readouterr().err
    assert "its chat_template is not a layout netcl knows (netcl runs no Jinja" in err
    assert "pass --template NAME" in err and "Traceback" not in err


def test_a_sentencepiece_model_alone_generates_as_tokenizer_json_does(llama_dir, capsys):
    args = [
        "generate",
        "--checkpoint",
        str(llama_dir),
        "--prompt",
        "hello hi 😀",
        "--max-new-tokens",
        "5",
        "--temperature",
        "0",
    ]
    assert main(args) == 0
    with_json = capsys.readouterr().out
    _sentencepiece_model(_tokenizer_json(), llama_dir / "tokenizer.model")
    (llama_dir / "tokenizer.json").unlink()
    assert main(args) == 0
    assert capsys.readouterr().out == with_json
    _, tok = load_model_dir(str(llama_dir), "auto")
    assert tok.bos_token == "<s>" and tok.encode("hello") == [tok.ranks[b" hello"]]
    (llama_dir / "tokenizer.model").write_bytes(b"\x0a\xff")
    assert main(args) == 1
    assert "tokenizer.model: ModelProto: truncated or invalid protobuf" in capsys.readouterr().err


def test_chat_reply_drops_the_space_its_first_token_carries(llama_dir, capsys, monkeypatch):
    _, tok = load_model_dir(str(llama_dir), "auto")
    reply = [tok.ranks[b" "], tok.ranks[b" hello"], tok.ranks[b" world"], 2, tok.ranks[b" hi"]]
    monkeypatch.setattr(GPT, "generate", lambda self, ids, n, **kw: iter(reply[:n]))
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    assert main(["chat", "--checkpoint", str(llama_dir), "--max-new-tokens", "5"]) == 0
    # " " alone is dropped, then " hello world" as is; </s> (id 2) ends the reply
    assert "assistant>  hello world\n" in capsys.readouterr().out
