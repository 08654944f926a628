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
from tests.text.test_chat import QWEN25_TEMPLATE
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


def _write_model_dir(path, queue, tokenizer: dict, vocab_size: int | None = None, context: int = 48,
                     **config) -> None:
    """A tiny Llama of `vocab_size` (the tokenizer's n_vocab unless given) and `context` positions beside
    `tokenizer` (the document of tokenizer.json), config.json's fields changed by `config`."""
    path.mkdir(exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    vocab = vocab_size or BPETokenizer.from_hf(path / "tokenizer.json").n_vocab
    model = GPT(queue, GPTConfig(vocab_size=vocab, dim=16, n_layers=1, n_heads=2, max_seq_len=context))
    model.save_pretrained(path)
    saved = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**saved, **config}))


@pytest.fixture
def llama_dir(tmp_path, queue):
    _write_model_dir(tmp_path, queue, _tokenizer_json(), eos_token_id=2, bos_token_id=1)
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
    assert tok.bos_token == "<s>" and stop_ids(model.config, tok) == {2}
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


def _generate(llama_dir, *flags: str) -> list[str]:
    return ["generate", "--checkpoint", str(llama_dir), *flags]


def _replying(monkeypatch, tokens: list[int], seen: list | None = None) -> None:
    """GPT.generate yields `tokens` (as many as asked for), whatever the model; the calls' (ids, n, kwargs)
    go to `seen`."""
    def generate(self, ids, n, **kw):
        if seen is not None:
            seen.append((list(ids), n, kw))
        return iter(tokens[:n])

    monkeypatch.setattr(GPT, "generate", generate)


def test_generation_config_eos_replaces_config_json_eos(llama_dir, capsys, monkeypatch):
    """transformers' generate stops at generation_config.json's eos_token_id alone where it gives one."""
    _, tok = load_model_dir(str(llama_dir), "auto")
    hello, world, hi = (tok.ranks[t] for t in (b" hello", b" world", b" hi"))
    (llama_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": hi}))
    seen: list = []
    _replying(monkeypatch, [hello, 2, world, hi, hello], seen)
    assert main(_generate(llama_dir, "--prompt", "hi", "--max-new-tokens", "5")) == 0
    assert capsys.readouterr().out == "hi hello</s> world\n"  # </s> (config.json's eos) is text here
    assert set(seen[0][2]["stop_tokens"]) == {hi}
    (llama_dir / "generation_config.json").unlink()  # none: config.json's
    assert main(_generate(llama_dir, "--prompt", "hi", "--max-new-tokens", "5")) == 0
    assert capsys.readouterr().out == "hi hello\n"
    assert set(seen[1][2]["stop_tokens"]) == {2}


@pytest.mark.parametrize("file", ["generation_config.json", "tokenizer_config.json"])
def test_an_unreadable_json_file_is_an_error(llama_dir, capsys, monkeypatch, file):
    (llama_dir / file).write_text('{"eos_token_id": 2,')
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    assert main(["chat", "--checkpoint", str(llama_dir), "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert f"netcl: cannot read {llama_dir / file}: Expecting property name enclosed in double quotes" in err
    assert err.count("\n") == 1


def test_ids_the_model_has_but_the_tokenizer_lacks_read_as_nothing(tmp_path, queue, capsys, monkeypatch):
    """A vocabulary padded past the tokenizer's (Qwen2's layout): the padding ids the model samples are real
    outputs, decoded as transformers decodes them, to nothing; neither stream ends on them."""
    doc = _tokenizer_json()
    _write_model_dir(tmp_path, queue, doc, eos_token_id=2)
    n_vocab = load_model_dir(str(tmp_path), "auto")[1].n_vocab
    _write_model_dir(tmp_path, queue, doc, vocab_size=n_vocab + 6, eos_token_id=2)
    _, tok = load_model_dir(str(tmp_path), "auto")
    hello, world = tok.ranks[b" hello"], tok.ranks[b" world"]
    _replying(monkeypatch, [hello, n_vocab + 3, world, n_vocab + 5, 2])
    assert main(_generate(tmp_path, "--prompt", "hi", "--max-new-tokens", "5")) == 0
    assert capsys.readouterr().out == "hi hello world\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\nhello\n"))
    assert main(["chat", "--checkpoint", str(tmp_path), "--template", "zephyr", "--max-new-tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert out.count("assistant> hello world\n") == 2 and "you> hello" in out


def test_a_tokenizer_past_the_models_vocabulary_is_refused_up_front(tmp_path, queue, capsys, monkeypatch):
    doc = _tokenizer_json()
    _write_model_dir(tmp_path / "fits", queue, doc)
    n_vocab = load_model_dir(str(tmp_path / "fits"), "auto")[1].n_vocab
    # ordinary tokens the model has no row for: not its tokenizer
    _write_model_dir(tmp_path / "small", queue, doc, vocab_size=n_vocab - 4)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    assert main(["chat", "--checkpoint", str(tmp_path / "small"), "--template", "zephyr"]) == 1
    err = capsys.readouterr().err
    small, last = n_vocab - 4, n_vocab - 1
    assert err == (f"netcl: {tmp_path / 'small' / 'tokenizer.json'} has ordinary tokens up to id {last} "
                   f"({n_vocab} ids in all), but the model's vocab_size is {small} (config.json): it has no "
                   f"embedding for ids {small}..{last}, so this is not its tokenizer (only special tokens "
                   "that nothing uses may lie past the model's vocabulary)\n")
    # spare special tokens past the model's vocabulary are let be while nothing uses them
    spare = ["<|im_start|>", "<|im_end|>"]
    doc["added_tokens"] += [{**doc["added_tokens"][0], "id": n_vocab + i, "content": t}
                            for i, t in enumerate(spare)]
    _write_model_dir(tmp_path / "spare", queue, doc, vocab_size=n_vocab)
    assert main(_generate(tmp_path / "spare", "--prompt", "hello", "--max-new-tokens", "2")) == 0
    capsys.readouterr()
    assert main(_generate(tmp_path / "spare", "--prompt", "hello <|im_end|>", "--max-new-tokens", "2")) == 1
    err = capsys.readouterr().err
    assert err == (f"netcl: --prompt writes the special token <|im_end|> (id {n_vocab + 1}) lies past the "
                   f"model's vocab_size of {n_vocab}: the model has no embedding for it\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))  # chatml's tokens are the spare ones
    assert main(["chat", "--checkpoint", str(tmp_path / "spare"), "--template", "chatml"]) == 1
    captured = capsys.readouterr()
    assert captured.err == (f"netcl: the tokenizer of {tmp_path / 'spare'}: generation uses the special "
                            f"tokens <|im_start|> (id {n_vocab}), <|im_end|> (id {n_vocab + 1}), past the "
                            f"model's vocab_size of {n_vocab} (config.json): this is not the model's "
                            "tokenizer (only special tokens that nothing uses may lie past the model's "
                            "vocabulary)\n")
    assert "you>" not in captured.out


def test_an_empty_prompt_starts_from_the_models_bos_token_id(tmp_path, queue, capsys):
    """A tokenizer without a BOS or <|endoftext|>: transformers' generate starts from config.json's
    bos_token_id, and so does netcl's."""
    doc = {**_tokenizer_json(), "post_processor": None}
    _write_model_dir(tmp_path, queue, doc, bos_token_id=1)
    assert main(_generate(tmp_path, "--max-new-tokens", "5", "--temperature", "0")) == 0
    model, tok = load_model_dir(str(tmp_path), "auto")
    assert tok.bos_token is None and model.config.bos_token_id == 1
    want = tok.decode_bytes(list(model.generate([1], 5, temperature=0))).decode("utf-8", "replace")
    assert capsys.readouterr().out == want + "\n"
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "bos_token_id": None}))
    assert main(_generate(tmp_path, "--max-new-tokens", "5")) == 1
    assert "--prompt is empty, and neither the model (config.json's bos_token_id) nor the tokenizer" in (
        capsys.readouterr().err)


def test_flag_values_are_one_line_errors_or_work(llama_dir, capsys, monkeypatch):
    for flags, words in [
        (["--checkpoint", ""], "argument --checkpoint: expected a path, got an empty string"),
        (["--checkpoint", "x", "--seed", str(2**64)], f"argument --seed: must be an integer <= {2**64 - 1}"),
        (["--checkpoint", "x", "--seed", "-1"], "argument --seed: must be an integer >= 0, got -1"),
        (["--checkpoint", "x", "--max-new-tokens", "0"], "must be an integer >= 1, got 0 (0 would generate"),
        (["--checkpoint", "x", "--max-seq-len", "0"], "argument --max-seq-len: must be an integer >= 1"),
    ]:
        for command in ("generate", "chat"):
            with pytest.raises(SystemExit) as exc:
                main([command, *flags])
            assert exc.value.code == 2
            err = capsys.readouterr().err
            assert words in err and "Traceback" not in err
    # the largest seed: chat's later turns take the seeds after it, wrapping at 2**64
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\nhello\n"))
    flags = ["--max-new-tokens", "2", "--seed", str(2**64 - 1)]
    assert main(["chat", "--checkpoint", str(llama_dir), *flags]) == 0
    assert capsys.readouterr().out.count("assistant> ") == 2


def test_chat_says_what_it_cuts(llama_dir, capsys, monkeypatch):
    """A reply shorter than --max-new-tokens and a message that loses its start are notices, as generate's."""
    model, tok = load_model_dir(str(llama_dir), "auto")
    seen: list = []
    _replying(monkeypatch, [tok.ranks[b" hi"]] * 100, seen)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n" + "hello world " * 20 + "\n"))
    assert main(["chat", "--checkpoint", str(llama_dir), "--max-new-tokens", "500"]) == 0
    err = capsys.readouterr().err.splitlines()
    chat = ChatFormat(tok, ZEPHYR)
    first = len(chat.encode_dialog([{"role": "user", "content": "hi"}], add_generation_prompt=True)[0])
    long = [{"role": "user", "content": "hello world " * 20}]
    whole = len(chat.encode_dialog(long, add_generation_prompt=True)[0])
    assert [(len(ids), n) for ids, n, _ in seen] == [(first, 48 - first), (24, 24)]
    assert err == [
        f"netcl: generating {48 - first} tokens, not 500: the prompt ({first} tokens) and the reply share "
        "the context window of 48",
        "(dropped the 2 oldest message(s) to fit the context window of 48 tokens)",
        f"netcl: your message makes a prompt of {whole} tokens; the context window of 48 tokens leaves 24 "
        f"for the prompt (the rest is the reply's), so its first {whole - 24} tokens were cut: shorten the "
        "message",
        "netcl: generating 24 tokens, not 500: the prompt (24 tokens) and the reply share the context window "
        "of 48",
    ]


def test_a_context_too_long_for_this_host_names_the_flag_that_fixes_it(llama_dir, capsys):
    config = json.loads((llama_dir / "config.json").read_text())
    (llama_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 10**12}))
    assert main(_generate(llama_dir, "--prompt", "hello", "--max-new-tokens", "3", "--temperature", "0")) == 1
    err = capsys.readouterr().err
    assert err.startswith("netcl: config.json's max_position_embeddings=1000000000000: the rotary tables for "
                          "that many positions take")
    assert err.endswith("netcl generate/chat --max-seq-len N\n")
    assert err.count("\n") == 1
    flags = ["--prompt", "hello", "--max-new-tokens", "3", "--temperature", "0", "--max-seq-len", "40"]
    assert main(_generate(llama_dir, *flags)) == 0
    model, tok = load_model_dir(str(llama_dir), "auto", max_seq_len=40)
    assert model.config.max_seq_len == 40
    ids = tok.encode("hello", add_bos=True)
    tokens = [t for t in model.generate(ids, 3, temperature=0, stop_tokens=[2])]
    want = tok.decode_bytes(tokens[:-1] if tokens[-1] == 2 else tokens).decode("utf-8", "replace")
    assert capsys.readouterr().out == "hello" + want + "\n"


def test_max_seq_len_of_a_gpt2_is_its_position_table(tmp_path, queue, capsys):
    (tmp_path / "tokenizer.json").write_text(json.dumps(_tokenizer_json()), encoding="utf-8")
    vocab = BPETokenizer.from_hf(tmp_path / "tokenizer.json").n_vocab
    config = GPTConfig(vocab_size=vocab, dim=16, n_layers=1, n_heads=2, max_seq_len=48, arch="gpt2")
    GPT(queue, config).save_pretrained(tmp_path)
    assert main(_generate(tmp_path, "--prompt", "hello", "--max-seq-len", "32")) == 1
    err = capsys.readouterr().err
    assert err.startswith("netcl: --max-seq-len 32: a GPT-2's max_seq_len is its learned position table")
    assert err.count("\n") == 1


def test_chat_starts_with_the_templates_default_system_message(tmp_path, queue, capsys, monkeypatch):
    """A Qwen2.5 chat_template: a dialog without --system starts with its default system message, as
    transformers' apply_chat_template lays it out; --system replaces it."""
    doc = _tokenizer_json()
    first = max(doc["model"]["vocab"].values()) + 1
    doc["added_tokens"] += [{**doc["added_tokens"][0], "id": first + i, "content": t}
                            for i, t in enumerate(["<|im_start|>", "<|im_end|>"])]
    _write_model_dir(tmp_path, queue, doc, context=256)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN25_TEMPLATE}))
    seen: list = []
    _replying(monkeypatch, [first + 1], seen)
    for flags in ([], ["--system", "Be brief."]):
        monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
        assert main(["chat", "--checkpoint", str(tmp_path), "--max-new-tokens", "1", *flags]) == 0
    assert not capsys.readouterr().err  # nothing cut
    _, tok = load_model_dir(str(tmp_path), "auto")
    system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    for (ids, _, _), content in zip(seen, [system, "Be brief."], strict=True):
        dialog = [{"role": "system", "content": content}, {"role": "user", "content": "hi"}]
        assert ids == ChatFormat(tok, "chatml").encode_dialog(dialog, add_generation_prompt=True)[0]
