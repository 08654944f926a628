"""`netcl lm-train`, `netcl generate` and `netcl chat` end to end at tiny sizes: the run directory, resume
(the same run, and a longer schedule), streaming generation, the chat loop on piped input, flag errors."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from netcl.cli import main
from netcl.core.tensor import Tensor
from netcl.io.checkpoint import read_checkpoint
from netcl.models import GPT, GPTConfig
from netcl.nn import init
from netcl.text import BPETokenizer, ChatFormat
from netcl.train import generate, lm, runs
from netcl.train.lm import fit_dialog, load_model_dir
from tests.distributed.launching import ROOT, environment, two_devices

WORDS = ["alpha", "beta", "gamma", "delta", "value", "result", "index", "items", "count", "total"]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """Twelve small generated Python files (about 9 kB)."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    for i in range(12):
        lines = [f'"""Module {i}."""', "", "import os", ""]
        for j in range(6):
            a, b = rng.choice(WORDS, 2, replace=False)
            lines += [f"def {a}_{j}({b}):", f"    {a} = {b} + {j}", f"    return {a} * {j}", ""]
        (root / f"mod_{i:02d}.py").write_text("\n".join(lines))
    return root


def _args(corpus_dir, out, *extra: str) -> list[str]:
    return [
        "lm-train",
        "--corpus",
        str(corpus_dir),
        "--cache-dir",
        str(out.parent / "cache"),
        "--vocab-size",
        "300",
        "--val-fraction",
        "0.2",
        "--layers",
        "1",
        "--heads",
        "2",
        "--dim",
        "16",
        "--context",
        "12",
        "--batch-size",
        "4",
        "--eval-windows",
        "3",
        "--samples",
        "1",
        "--sample-tokens",
        "4",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="module")
def trained(corpus_dir, tmp_path_factory):
    """A run of 6 steps (checkpoints at 3 and 6), and what it printed."""
    out = tmp_path_factory.mktemp("runs") / "lm"
    buf = io.StringIO()
    saved, sys.stdout = sys.stdout, buf
    try:
        assert main(_args(corpus_dir, out, "--steps", "6", "--eval-every", "3", "--warmup", "2")) == 0
    finally:
        sys.stdout = saved
    return out, buf.getvalue()


def test_a_run_writes_a_model_directory_and_reports_against_the_unigram_model(trained):
    out, text = trained
    claimed = sorted(line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("wrote "))
    names = [
        "checkpoint.safetensors",
        "best.safetensors",
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "curves.png",
        "samples.txt",
        "metrics.json",
    ]
    assert claimed == sorted(str(out / n) for n in names)  # model.safetensors was written but not claimed
    assert all((out / n).stat().st_size > 0 for n in names)
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    # one mode for all (the weights, checkpoint and config.json were 0600, the rest 0644)
    assert len({stat.S_IMODE((out / n).stat().st_mode) for n in names}) == 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert [s for s, _ in metrics["val_loss"]] == [3, 6]
    assert all(math.isfinite(v) and 0 < v < 10 for _, v in metrics["val_loss"])
    assert metrics["unigram_val_loss_nats"] > 0 and "unigram model" in text
    assert metrics["settings"]["steps"] == 6 and metrics["parameters"] > 0
    _, meta = read_checkpoint(out / "checkpoint.safetensors")
    assert meta["step"] == 6 and meta["extra"]["kind"] == "lm"
    assert len(meta["extra"]["history"]["loss"]) == 6
    assert meta["loader"]["step"] == 6
    assert "--- sample 1" in text


def test_the_model_directory_loads_and_its_tokenizer_round_trips(trained, corpus_dir):
    out, _ = trained
    model, tok = load_model_dir(str(out), "auto")
    src = (corpus_dir / "mod_00.py").read_text()
    assert tok.decode(tok.encode(src)) == src
    assert {"<|endoftext|>", "<|im_start|>", "<|im_end|>"} <= set(tok.special_tokens)
    assert model.config.max_seq_len == 12
    # the weights are those of the training checkpoint
    tensors, _ = read_checkpoint(out / "checkpoint.safetensors")
    ckpt = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    own = {k: t.to_host() for k, t in model.state_dict().items()}
    assert own.keys() == ckpt.keys()
    assert all(np.array_equal(own[k], ckpt[k]) for k in own)


def test_resume_after_an_interruption_gives_the_same_run(corpus_dir, trained, tmp_path, monkeypatch, capsys):
    """Interrupted after the step-3 checkpoint, then resumed: the uninterrupted run's weights and losses."""
    full, _ = trained
    out = tmp_path / "lm"
    calls = []
    real = lm.validation_loss

    def interrupt_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(lm, "validation_loss", interrupt_second)
    assert main(_args(corpus_dir, out, "--steps", "6", "--eval-every", "3", "--warmup", "2")) == 130
    assert f"interrupted; {out / 'checkpoint.safetensors'} holds step 3: `netcl lm-train --resume {out}`" in \
        capsys.readouterr().out
    monkeypatch.setattr(lm, "validation_loss", real)
    assert read_checkpoint(out / "checkpoint.safetensors")[1]["step"] == 3
    assert main(["lm-train", "--resume", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                 "--no-progress", "--samples", "0"]) == 0
    # the same up to float rounding: the embedding's gradient is summed with atomics, in no fixed order
    a, b = load_file(str(full / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=k)
    ha = read_checkpoint(full / "checkpoint.safetensors")[1]["extra"]["history"]
    hb = read_checkpoint(out / "checkpoint.safetensors")[1]["extra"]["history"]
    np.testing.assert_allclose(hb["loss"], ha["loss"], rtol=1e-5)
    np.testing.assert_allclose(hb["val_loss"], ha["val_loss"], rtol=1e-5)


def test_the_preset_help_gives_the_25m_models_size(queue, capsys):
    """--help said ~27M parameters; the 25m preset's model at the default vocabulary has 29.5M."""
    with pytest.raises(SystemExit):
        main(["lm-train", "--help"])
    stated = float(re.search(r"~([\d.]+)M\s+parameters", capsys.readouterr().out)[1])
    s = {**lm.DEFAULTS, **lm.PRESETS["25m"], "kv_heads": lm.PRESETS["25m"]["heads"], "arch": "llama"}
    with init.skipped():
        model = GPT(queue, lm._model_config(s, lm.DEFAULTS["vocab_size"]))
    assert stated == round(model.num_parameters() / 1e6, 1)


def test_ctrl_c_while_a_checkpoint_is_written_names_the_step_the_file_still_holds(
    corpus_dir, tmp_path, monkeypatch, capsys
):
    """A Ctrl-C inside the step-4 checkpoint leaves the step-2 one: the message said 'holds step 4' (the last
    evaluation), and `--resume` then went on from step 2."""
    out = tmp_path / "lm"
    real, calls = runs.Run.save, []

    def interrupt_second(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(runs.Run, "save", interrupt_second)
    assert main(_args(corpus_dir, out, "--steps", "4", "--eval-every", "2", "--warmup", "1",
                      "--samples", "0")) == 130
    assert f"{out / 'checkpoint.safetensors'} holds step 2: `netcl lm-train --resume {out}`" in \
        capsys.readouterr().out
    assert read_checkpoint(out / "checkpoint.safetensors")[1]["step"] == 2


def test_resume_with_more_steps_stretches_the_schedule(corpus_dir, tmp_path, capsys):
    out = tmp_path / "lm"
    assert (
        main(_args(corpus_dir, out, "--steps", "4", "--eval-every", "4", "--warmup", "1", "--samples", "0"))
        == 0
    )
    capsys.readouterr()
    assert main(["lm-train", "--resume", str(out), "--steps", "8", "--cache-dir", str(tmp_path / "cache"),
                 "--no-progress", "--samples", "0"]) == 0
    text = capsys.readouterr().out
    assert "now spans 8 steps" in text and "resumed from" in text
    # at step 4 of a warm-up-1 cosine over 8 steps the lr is halfway down: min + (max - min)(1 + cos(3pi/7))/2
    _, meta = read_checkpoint(out / "checkpoint.safetensors")
    args = meta["extra"]["args"]
    expected = args["min_lr"] + (args["lr"] - args["min_lr"]) * (1 + math.cos(math.pi * 3 / 7)) / 2
    assert f"lr {expected:.3g}" in text
    assert meta["step"] == 8 and meta["scheduler"]["state"]["total_steps"] == 8
    assert len(meta["extra"]["history"]["loss"]) == 8
    # the end: nothing to do, nothing written
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    assert (
        main(["lm-train", "--resume", str(out), "--no-progress", "--cache-dir", str(tmp_path / "cache")]) == 0
    )
    assert "already trained 8 of 8 steps: nothing to do" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    # fewer steps than it has done is a contradiction, not "8 of 5 steps: nothing to do"
    assert main(["lm-train", "--resume", str(out), "--steps", "5", "--no-progress", "--cache-dir",
                 str(tmp_path / "cache")]) == 1
    assert "--steps 5 is fewer than the 8 steps" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    # a resumed run keeps its settings
    assert main(["lm-train", "--resume", str(out), "--steps", "9", "--dim", "32", "--no-progress"]) == 1
    assert "--dim 32 differs from the resumed run's 16" in capsys.readouterr().err


def test_runs_are_never_overwritten_silently(corpus_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "lm"
    small = ("--steps", "2", "--eval-every", "2", "--warmup", "0", "--samples", "0")
    assert main(_args(corpus_dir, out, *small)) == 0
    assert main(_args(corpus_dir, out, *small)) == 1
    assert "already holds a run" in capsys.readouterr().err
    assert main(_args(corpus_dir, out, *small, "--overwrite")) == 0
    monkeypatch.chdir(tmp_path)
    args = [a for a in _args(corpus_dir, out, *small) if a not in ("--out", str(out))]
    assert main(args) == 0 and (tmp_path / "runs/lm/checkpoint.safetensors").exists()
    capsys.readouterr()
    assert main(args) == 0 and (tmp_path / "runs/lm-2/checkpoint.safetensors").exists()
    assert "runs/lm holds an earlier run: this one goes to runs/lm-2" in capsys.readouterr().out
    assert main(["lm-train", "--resume", "--steps", "3", "--no-progress", "--samples", "0",
                 "--cache-dir", str(out.parent / "cache")]) == 0
    assert "resumed from runs/lm-2/checkpoint.safetensors" in capsys.readouterr().out
    assert main(["lm-train", "--resume", str(tmp_path / "nothing"), "--no-progress"]) == 1
    assert "no checkpoint at" in capsys.readouterr().err


def _generated(trained, capsys, *extra: str) -> str:
    out, _ = trained
    assert main(["generate", "--checkpoint", str(out), *extra]) == 0
    return capsys.readouterr().out


def test_generate_streams_the_models_greedy_continuation(trained, capsys):
    out, _ = trained
    text = _generated(trained, capsys, "--prompt", "def alpha", "--max-new-tokens", "5", "--temperature", "0")
    model, tok = load_model_dir(str(out), "auto")
    ids = tok.encode("def alpha")
    expected = []
    for t in model.generate(ids, 5, temperature=0.0):
        if int(t) == tok.special_id("<|endoftext|>"):
            break
        expected.append(int(t))
    assert text == "def alpha" + tok.decode(expected) + "\n"
    # sampling: the seed decides
    a = _generated(trained, capsys, "--prompt", "import", "--max-new-tokens", "6", "--seed", "3")
    b = _generated(trained, capsys, "--prompt", "import", "--max-new-tokens", "6", "--seed", "3")
    assert a == b and a.startswith("import")
    # no prompt: a new file, from <|endoftext|>
    assert _generated(trained, capsys, "--max-new-tokens", "3", "--top-k", "5", "--top-p", "0.9").endswith(
        "\n"
    )


@pytest.mark.parametrize("flags", [("--dtype", "bfloat16"), ("--dtype", "float16", "--int8")])
def test_generate_with_half_and_int8_weights(trained, capsys, flags):
    """--dtype / --int8 load the run's weights that way: the text is that model's greedy continuation."""
    out, _ = trained
    text = _generated(trained, capsys, "--prompt", "def alpha", "--max-new-tokens", "5", "--temperature", "0",
                      *flags)
    model, tok = load_model_dir(str(out), "auto", dtype=flags[1], int8="--int8" in flags)
    assert {p.value.dtype.name for p in model.parameters()} == (
        {"float16", "uint8"} if "--int8" in flags else {flags[1]})
    expected = []
    for t in model.generate(tok.encode("def alpha"), 5, temperature=0.0):
        if int(t) == tok.special_id("<|endoftext|>"):
            break
        expected.append(int(t))
    assert text == "def alpha" + tok.decode(expected) + "\n"
    assert main(["generate", "--checkpoint", str(out / "checkpoint.safetensors"), "--dtype", "bfloat16"]) == 1
    assert "--dtype bfloat16 is for model directories" in capsys.readouterr().err


def test_generate_takes_the_checkpoint_file_too(trained, tmp_path, capsys):
    """--checkpoint RUN/checkpoint.safetensors (was "no such directory"): the checkpoint's own weights, with
    the config and tokenizer beside it; RUN/model.safetensors means the directory's weights."""
    out, _ = trained
    run = tmp_path / "run"
    shutil.copytree(out, run)
    model, _ = load_model_dir(str(run), "auto")
    weight = model.state_dict()["norm.weight"]
    weight.copy_(Tensor.from_host(weight.queue, np.zeros(weight.shape, weight.dtype)))
    model.save_pretrained(run)  # model.safetensors no longer holds the checkpoint's weights
    tensors, _ = read_checkpoint(run / "checkpoint.safetensors")
    for given, want_checkpoint in (("checkpoint.safetensors", True), ("model.safetensors", False)):
        loaded, _ = load_model_dir(str(run / given), "auto")
        got = loaded.state_dict()["norm.weight"].to_host()
        assert np.array_equal(got, tensors["model/norm.weight"] if want_checkpoint else np.zeros_like(got))
    args = ["--prompt", "def alpha", "--max-new-tokens", "4", "--temperature", "0"]
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out / "checkpoint.safetensors"), *args]) == 0
    from_file = capsys.readouterr().out
    assert main(["generate", "--checkpoint", str(out), *args]) == 0
    assert from_file == capsys.readouterr().out and from_file.startswith("def alpha")
    assert main(["generate", "--checkpoint", str(out / "metrics.json"), "--prompt", "x"]) == 1
    assert f"--checkpoint {out / 'metrics.json'} is neither a directory nor a .safetensors file" in (
        capsys.readouterr().err)


def test_generate_says_when_the_context_window_caps_the_reply(trained, capsys):
    out, _ = trained
    assert main(["generate", "--checkpoint", str(out), "--prompt", "def alpha", "--max-new-tokens", "50",
                 "--temperature", "0"]) == 0
    assert "the prompt" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(out), "--prompt", "alpha beta gamma " * 10]) == 1
    assert "the model's context window is 12" in capsys.readouterr().err


def test_stream_decoding_keeps_multibyte_characters_whole():
    tok = BPETokenizer.train("plain ascii text only", 260)

    # stands in for a GPT: yields the UTF-8 bytes of "ü!€" as byte tokens, then a stop token
    class ByteTokens:
        def generate(self, ids, n, **kw):
            yield from [0xC3, 0xBC, ord("!"), 0xE2, 0x82, 0xAC, 7, ord("x")][:n]

    pieces = list(lm.stream_tokens(ByteTokens(), tok, [1], 8, temperature=0.0, top_k=None, top_p=None, seed=0,
                                   stop=[7]))
    assert pieces == ["ü", "!", "€"]  # a character split over tokens comes out whole; the stop token ends it


def test_chat_on_piped_input_streams_replies_resets_and_exits(trained, capsys, monkeypatch):
    out, _ = trained
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello there\n\n/reset\nagain\n/exit\nnever read\n"))
    assert main(["chat", "--checkpoint", str(out), "--max-new-tokens", "3", "--temperature", "0",
                 "--system", "be brief"]) == 0
    text = capsys.readouterr().out
    assert text.count("you> ") == 2 and text.count("assistant> ") == 2
    assert "you> hello there" in text and "(history cleared)" in text and "never read" not in text
    # end of input ends the chat too
    monkeypatch.setattr(sys, "stdin", io.StringIO("one line, no newline"))
    assert main(["chat", "--checkpoint", str(out), "--max-new-tokens", "2"]) == 0
    assert capsys.readouterr().out.count("assistant> ") == 1


def test_chat_history_is_trimmed_to_the_context(trained, capsys, monkeypatch):
    out, _ = trained
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"message {i}\n" for i in range(4))))
    assert main(["chat", "--checkpoint", str(out), "--max-new-tokens", "2"]) == 0
    assert "oldest message(s) to fit the context window of 12 tokens" in capsys.readouterr().err


def test_fit_dialog_drops_the_oldest_turns_and_keeps_the_system_message():
    tok = BPETokenizer.train("system user assistant hello world " * 20, 300,
                             special_tokens=["<|im_start|>", "<|im_end|>"])
    chat = ChatFormat(tok, "chatml")
    messages = [{"role": "system", "content": "s"}]
    for i in range(3):
        messages += [
            {"role": "user", "content": f"hello {i}"},
            {"role": "assistant", "content": f"world {i}"},
        ]
    messages.append({"role": "user", "content": "last"})
    full, _ = chat.encode_dialog(messages, add_generation_prompt=True)
    kept = messages[:1] + messages[-3:]
    budget = len(chat.encode_dialog(kept, add_generation_prompt=True)[0])
    trimmed = list(messages)
    ids, dropped = fit_dialog(chat, trimmed, budget)
    assert trimmed == kept and dropped == 4 and len(ids) == budget < len(full)
    assert fit_dialog(chat, list(messages), len(full)) == (full, 0)
    # the last message alone too long: its beginning is cut
    ids, _ = fit_dialog(chat, [{"role": "user", "content": "hello world " * 30}], 10)
    assert len(ids) == 10


@pytest.mark.parametrize("flag,value,words", [
    ("--steps", "0", "must be an integer >= 1, got 0"),
    ("--steps", "ten", "expected an integer >= 1, got 'ten'"),
    ("--batch-size", "0", "must be an integer >= 1, got 0"),
    ("--layers", "-1", "must be an integer >= 1, got -1"),
    ("--heads", "0", "must be an integer >= 1"),
    ("--kv-heads", "0", "must be an integer >= 1"),
    ("--dim", "x", "expected an integer >= 1"),
    ("--context", "1", "must be an integer >= 2, got 1"),
    ("--vocab-size", "100", "must be an integer >= 259, got 100"),
    ("--vocab-size", "70000", "must be an integer <= 65535, got 70000"),
    ("--val-fraction", "1", "must be a finite number in (0, 1), got 1"),
    ("--val-fraction", "0", "must be a finite number in (0, 1), got 0"),
    ("--lr", "0", "must be a finite number in (0, inf), got 0"),
    ("--lr", "nan", "must be a finite number"),
    ("--min-lr", "-1", "must be a finite number in [0, inf)"),
    ("--warmup", "-2", "must be an integer >= 0, got -2"),
    ("--weight-decay", "-0.1", "must be a finite number in [0, inf)"),
    ("--clip", "inf", "must be a finite number"),
    ("--seed", "-1", "must be an integer >= 0"),
    ("--eval-every", "0", "must be an integer >= 1"),
    ("--eval-windows", "0", "must be an integer >= 1"),
    ("--samples", "-1", "must be an integer >= 0"),
    ("--sample-tokens", "0", "must be an integer >= 1"),
    ("--preset", "huge", "invalid choice: 'huge'"),
    ("--arch", "bert", "invalid choice: 'bert'"),
])
def test_bad_train_flags_are_one_line_errors(tmp_path, capsys, flag, value, words):
    with pytest.raises(SystemExit) as exc:
        main(["lm-train", flag, value, "--out", str(tmp_path / "never")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {words}" in err and "Traceback" not in err
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("extra,words", [
    (("--dim", "30", "--heads", "4"), "--dim 30 is not a multiple of --heads 4"),
    (("--heads", "4", "--kv-heads", "3", "--dim", "32"), "--kv-heads 3 does not divide --heads 4"),
    (("--heads", "4", "--kv-heads", "2", "--dim", "32", "--arch", "gpt2"), "--kv-heads 2 with --arch gpt2"),
    (("--dim", "12", "--heads", "4"), "head dimension 12 / 4 = 3 is odd"),
    (("--warmup", "5", "--steps", "5"), "--warmup 5 must be smaller than --steps 5"),
    (("--lr", "1e-3", "--min-lr", "1e-2"), "--min-lr 0.01 is larger than --lr 0.001"),
    (("--corpus", "{tmp}/absent"), "does not exist"),  # under tmp_path: never there, whatever the machine
    (("--context", "5000", "--steps", "2", "--warmup", "0"), "cannot fill one window"),
])
def test_bad_combinations_are_clear_errors_before_anything_is_written(
    tmp_path, capsys, corpus_dir, extra, words
):
    args = [
        "lm-train",
        "--corpus",
        str(corpus_dir),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--vocab-size",
        "300",
        "--no-progress",
        "--out",
        str(tmp_path / "never"),
        *(value.format(tmp=tmp_path) for value in extra),
    ]
    assert main(args) == 1
    assert words in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("command,flag,value,words", [
    ("generate", "--max-new-tokens", "0", "must be an integer >= 1, got 0"),
    ("generate", "--temperature", "-1", "must be a finite number in [0, inf), got -1"),
    ("generate", "--top-k", "0", "must be an integer >= 1, got 0"),
    ("generate", "--top-p", "0", "must be a finite number in (0, 1], got 0"),
    ("generate", "--top-p", "1.5", "must be a finite number in (0, 1], got 1.5"),
    ("generate", "--seed", "-3", "must be an integer >= 0, got -3"),
    ("chat", "--max-new-tokens", "-1", "must be an integer >= 1"),
    ("chat", "--temperature", "nan", "must be a finite number"),
    ("chat", "--template", "alpaca", "invalid choice: 'alpaca'"),
])
def test_bad_generation_flags_are_one_line_errors(tmp_path, capsys, command, flag, value, words):
    with pytest.raises(SystemExit) as exc:
        main([command, "--checkpoint", str(tmp_path), flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}: {words}" in capsys.readouterr().err


def test_bad_checkpoint_directories_are_clear_errors(tmp_path, capsys, trained):
    assert main(["generate", "--checkpoint", str(tmp_path / "missing"), "--prompt", "x"]) == 1
    assert "no such directory or file" in capsys.readouterr().err
    assert main(["chat", "--checkpoint", str(tmp_path)]) == 1
    assert "has no config.json or tokenizer.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "x"])
    assert "--checkpoint" in capsys.readouterr().err
    # a template whose special tokens the tokenizer lacks
    out, _ = trained
    assert main(["chat", "--checkpoint", str(out), "--template", "llama3"]) == 1
    assert "--template llama3" in capsys.readouterr().err



def test_bad_paths_and_devices_are_clear_errors_before_anything_is_written(
    tmp_path, capsys, corpus_dir, trained
):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    cases = [
        (
            ("--device", "nosuch", "--out", str(tmp_path / "never")),
            "--device nosuch: unknown device 'nosuch'",
        ),
        (
            ("--cache-dir", str(a_file / "cache"), "--out", str(tmp_path / "never")),
            "cannot create the corpus cache directory",
        ),
        (("--out", str(a_file)), f"--out {a_file} is a file, not a directory"),
        (("--out", str(a_file / "run")), f"{a_file} is a file, not a directory"),
    ]
    for extra, words in cases:
        args = [
            "lm-train",
            "--corpus",
            str(corpus_dir),
            "--vocab-size",
            "300",
            "--no-progress",
            "--steps",
            "2",
            "--warmup",
            "0",
            "--cache-dir",
            str(tmp_path / "cache"),
            *extra,
        ]
        assert main(args) == 1, extra
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, (extra, err)
        assert not (tmp_path / "never").exists() and a_file.read_text() == "not a directory"
    # a checkpoint that another job wrote is not resumed
    other = tmp_path / "other"
    other.mkdir()
    out, _ = trained
    tensors, meta = read_checkpoint(out / "checkpoint.safetensors")
    meta["extra"]["kind"] = "train"
    save_file(tensors, str(other / "checkpoint.safetensors"), metadata={"netcl": json.dumps(meta)})
    assert read_checkpoint(other / "checkpoint.safetensors")[1]["extra"]["kind"] == "train"
    assert main(["lm-train", "--resume", str(other), "--no-progress"]) == 1
    assert (f"--resume: {other / 'checkpoint.safetensors'} was not written by netcl lm-train but by netcl "
            f"train (an image classifier); continue it with `netcl train --resume {other}`"
            in capsys.readouterr().err)
    # and netcl train does not take an lm-train run (it listed every model key as missing)
    assert main(["train", "--resume", str(out), "--no-progress"]) == 1
    assert capsys.readouterr().err == (
        f"netcl: --resume: {out / 'checkpoint.safetensors'} was written by netcl lm-train (a language "
        f"model, not an image classifier); continue it with `netcl lm-train --resume {out}`\n")
    assert main(["generate", "--checkpoint", str(out), "--device", "nosuch"]) == 1
    assert "--device nosuch: unknown device" in capsys.readouterr().err


def test_samples_share_the_context_with_their_prompt(corpus_dir, tmp_path, capsys):
    """A context barely longer than the sample prompts: samples are cut to fit, never an error at the end."""
    out = tmp_path / "lm"
    args = [a if a != "12" else "3" for a in _args(corpus_dir, out, "--steps", "1", "--warmup", "0",
                                                    "--samples", "4", "--sample-tokens", "50")]
    assert args[args.index("--context") + 1] == "3"
    assert main(args) == 0
    text = capsys.readouterr().out
    assert (out / "samples.txt").is_file() and "validation loss" in text
    tok = BPETokenizer.from_hf(out / "tokenizer.json")
    for i, prompt in enumerate(lm.SAMPLE_PROMPTS):
        n = len(tok.encode(prompt))
        assert (f"--- sample {i + 1}: the prompt {prompt!r} ({n} tokens) fills the context" in text) == (
            n >= 3
        )


def test_amp_float16_keeps_its_loss_scale_across_a_resume(corpus_dir, tmp_path, capsys):
    out = tmp_path / "lm"
    assert main(_args(corpus_dir, out, "--steps", "2", "--eval-every", "2", "--warmup", "0", "--samples", "0",
                      "--amp")) == 0
    assert "mixed precision: autocast float16, dynamic loss scaling" in capsys.readouterr().out
    _, meta = read_checkpoint(out / "checkpoint.safetensors")
    assert meta["extra"]["grad_scaler"]["_growth_tracker"] == 2  # two clean steps counted on the device
    assert all(math.isfinite(v) for v in meta["extra"]["history"]["loss"])
    assert main(["lm-train", "--resume", str(out), "--steps", "3", "--amp", "float16", "--no-progress",
                 "--samples", "0", "--cache-dir", str(tmp_path / "cache")]) == 0
    _, meta = read_checkpoint(out / "checkpoint.safetensors")
    assert meta["extra"]["grad_scaler"]["_growth_tracker"] == 3 and meta["step"] == 3
    assert json.loads((out / "metrics.json").read_text())["amp"] == "float16"
    with pytest.raises(SystemExit):
        main(["lm-train", "--amp", "float8", "--out", str(tmp_path / "never")])
    assert "argument --amp: invalid choice: 'float8'" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def _same_training(one, two) -> tuple[dict, dict]:
    """Run `two`'s weights and loss history equal run `one`'s up to float rounding; returns both histories."""
    a, b = load_file(str(one / "model.safetensors")), load_file(str(two / "model.safetensors"))
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
    ha = read_checkpoint(one / "checkpoint.safetensors")[1]["extra"]["history"]
    hb = read_checkpoint(two / "checkpoint.safetensors")[1]["extra"]["history"]
    np.testing.assert_allclose(hb["loss"], ha["loss"], rtol=1e-5)
    return ha, hb


def test_a_rank_left_out_still_trains_what_one_process_trains(corpus_dir, tmp_path, capsys):
    """Rank 0 slowed to 0.2 s a sample (tests/train/slowed_rank_script.py): measured after 3 steps, it is left
    out (rank 1 trains on the whole global batch of 4, no all-reduce), does not evaluate, and gets rank 1's
    weights before it writes the checkpoint: the weights and losses are one process's with --batch-size 4."""
    one, two = tmp_path / "one", tmp_path / "two"
    common = ("--steps", "6", "--eval-every", "6", "--warmup", "1", "--samples", "0")
    assert main(_args(corpus_dir, one, *common, "--batch-size", "4")) == 0
    capsys.readouterr()
    cmd = [sys.executable, "-m", "netcl.cli", "run", "--nproc", "2", "--balance", "on",
           str(ROOT / "tests/train/slowed_rank_script.py"), "0", "0.2",
           *_args(corpus_dir, two, *common, "--batch-size", "2", "--nproc", "2")]
    proc = subprocess.run(cmd, env=environment(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "a rank worth less than its all-reduce and its one-sample floor is left out" in proc.stdout
    assert "balance: after step 3, shares [2, 2] -> [0, 4] of 4" in proc.stdout, proc.stdout
    assert "balance: rank 0 (" in proc.stdout and "one rank works alone" in proc.stdout, proc.stdout
    assert proc.stdout.count("step 6: validation loss") == 1
    ha, hb = _same_training(one, two)
    np.testing.assert_allclose(hb["val_loss"][-1][1], ha["val_loss"][-1][1], rtol=1e-5)  # rank 1's alone
    assert json.loads((two / "metrics.json").read_text())["shares"] == [0, 4]


def test_two_processes_train_what_one_trains_on_their_joint_batch(corpus_dir, tmp_path, capsys):
    """--nproc 2 --batch-size 2: each rank takes half of every global batch of 4 and DDP averages the
    gradients,
    so the weights and the losses are those of one process with --batch-size 4 (up to float rounding)."""
    one, two = tmp_path / "one", tmp_path / "two"
    specs, balance = two_devices()
    common = ("--steps", "3", "--eval-every", "3", "--warmup", "1", "--samples", "0")
    assert main(_args(corpus_dir, one, *common, "--batch-size", "4")) == 0
    capsys.readouterr()
    cmd = [
        sys.executable,
        "-m",
        "netcl.cli",
        *_args(corpus_dir, two, *common, "--batch-size", "2", "--nproc", "2"),
        "--devices", ",".join(specs), *balance,  # two platforms where there are (shares stay equal 3 steps)
    ]
    proc = subprocess.run(cmd, env=environment(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "batch 2 x 2 processes x 12 tokens" in proc.stdout and "eager steps" in proc.stdout
    assert "global batch 4, balanced by measured speed" in proc.stdout
    for r, spec in enumerate(specs):
        assert f"rank {r}: [{spec}]" in proc.stdout and "share 2 of 4 (50.0%)" in proc.stdout, proc.stdout
    assert proc.stdout.count("step 3: validation loss") == 1  # rank 0 logs, rank 1 is quiet
    _same_training(one, two)
    assert json.loads((two / "metrics.json").read_text())["processes"] == 2
    # a resumed run keeps its number of processes
    assert main(["lm-train", "--resume", str(two), "--steps", "4", "--no-progress"]) == 1
    assert "the resumed run trained with --nproc 2: pass --nproc 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["lm-train", "--nproc", "0", "--out", str(tmp_path / "never")])
    assert "argument --nproc: must be an integer >= 1, got 0" in capsys.readouterr().err


def test_ctrl_c_ends_generate_and_chat_without_a_traceback(trained, capsys, monkeypatch):
    out, _ = trained
    real = generate.stream_tokens

    def interrupted(*a, **k):  # one piece, then the user's Ctrl-C
        for piece in real(*a, **k):
            yield piece
            raise KeyboardInterrupt

    monkeypatch.setattr(generate, "stream_tokens", interrupted)
    assert main(["generate", "--checkpoint", str(out), "--prompt", "def", "--max-new-tokens", "5",
                 "--temperature", "0"]) == 130
    text = capsys.readouterr().out
    assert text.startswith("def") and text.endswith("\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\nnever answered\n"))
    assert main(["chat", "--checkpoint", str(out), "--max-new-tokens", "5", "--temperature", "0"]) == 130
    text = capsys.readouterr().out
    assert text.count("assistant> ") == 1 and "never answered" not in text


def test_patience_stops_the_run_and_the_best_checkpoint_is_a_model(corpus_dir, tmp_path, capsys, monkeypatch):
    """Validation losses 3.0, 2.0, 2.5, 2.2 at steps 2, 4, 6, 8: --patience 2 stops at step 8 of 12 and
    best.safetensors holds step 4, which `netcl generate` and load_model_dir take as a checkpoint."""
    scripted = iter([3.0, 2.0, 2.5, 2.2])
    monkeypatch.setattr(lm, "validation_loss", lambda *a, **k: next(scripted))
    out = tmp_path / "lm"
    assert main(_args(corpus_dir, out, "--steps", "12", "--eval-every", "2", "--warmup", "1",
                      "--samples", "0", "--patience", "2")) == 0
    text = capsys.readouterr().out
    assert (f"stopping early at step 8: the validation loss has not improved for 2 evaluations "
            f"(--patience 2); the best, 2.0000 at step 4, is in {out / 'best.safetensors'}") in text
    assert "best.safetensors: the checkpoint of the best validation loss, 2.0000 at step 4" in text
    assert f"wrote {out / 'best.safetensors'}" in text.splitlines()
    last, best = read_checkpoint(out / "checkpoint.safetensors"), read_checkpoint(out / "best.safetensors")
    assert last[1]["step"] == 8 and best[1]["step"] == 4
    assert [v for _, v in best[1]["extra"]["history"]["val_loss"]] == [3.0, 2.0]
    key = "model/tok_embeddings.weight"
    assert not np.array_equal(last[0][key], best[0][key])  # 4 steps apart
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best"] == {"at": "step 4", "validation_loss": 2.0, "checkpoint": "best.safetensors"}
    assert metrics["stopped_early_at"] == "step 8" and metrics["final_val_loss_nats"] == 2.2
    model, _ = load_model_dir(str(out / "best.safetensors"), "auto")
    for k, t in model.state_dict().items():
        np.testing.assert_array_equal(t.to_host(), best[0][f"model/{k}"], err_msg=k)


def test_dropout_is_a_setting_of_the_run_and_off_in_validation(corpus_dir, tmp_path, capsys, queue):
    out = tmp_path / "lm"
    base = ("--steps", "2", "--eval-every", "2", "--warmup", "0", "--samples", "0")
    assert main(_args(corpus_dir, out, *base, "--dropout", "0.3")) == 0
    _, meta = read_checkpoint(out / "checkpoint.safetensors")
    assert meta["extra"]["args"]["dropout"] == 0.3
    assert json.loads((out / "config.json").read_text())["attention_dropout"] == 0.3
    plain = tmp_path / "plain"
    assert main(_args(corpus_dir, plain, *base)) == 0
    _, plain_meta = read_checkpoint(plain / "checkpoint.safetensors")
    assert plain_meta["extra"]["args"]["dropout"] == 0.0
    # same seed, same first batch and weights: only dropout makes the first training loss differ
    assert meta["extra"]["history"]["loss"][0] != plain_meta["extra"]["history"]["loss"][0]
    # a resumed run keeps it
    capsys.readouterr()
    assert main(["lm-train", "--resume", str(out), "--steps", "3", "--dropout", "0.1", "--no-progress"]) == 1
    assert "--dropout 0.1 differs from the resumed run's 0.3" in capsys.readouterr().err
    # validation runs without dropout, and gives the model back in training mode
    config = dict(vocab_size=50, dim=16, n_layers=1, n_heads=2, max_seq_len=12)
    dropped = GPT(queue, GPTConfig(**config, dropout=0.5, attn_dropout=0.5))
    kept = GPT(queue, GPTConfig(**config))
    kept.load_state_dict({k: t.to_host() for k, t in dropped.state_dict().items()})
    windows = np.random.default_rng(1).integers(0, 50, (5, 13)).astype(np.int32)
    assert lm.validation_loss(dropped, windows, 2) == lm.validation_loss(kept, windows, 2)
    assert dropped.training


def test_lm_train_writes_tensorboard_scalars(corpus_dir, tmp_path, capsys):
    pytest.importorskip("tensorboardX", reason="not installed: pip install 'netcl[tensorboard]'")
    reader = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="TensorBoard's event reader is not installed: pip install tensorboard",
    )
    out, logdir = tmp_path / "lm", tmp_path / "tb"
    assert main(_args(corpus_dir, out, "--steps", "4", "--eval-every", "2", "--warmup", "1",
                      "--samples", "0", "--tensorboard", str(logdir))) == 0
    assert f"wrote {logdir}" in capsys.readouterr().out.splitlines()
    acc = reader.EventAccumulator(str(logdir))
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    history = read_checkpoint(out / "checkpoint.safetensors")[1]["extra"]["history"]
    assert [s for s, _ in got["train/loss"]] == [1, 2, 3, 4]
    np.testing.assert_allclose([v for _, v in got["train/loss"]], history["loss"], rtol=1e-6)
    assert [s for s, _ in got["validation/loss"]] == [2, 4]
    np.testing.assert_allclose([v for _, v in got["validation/loss"]], [v for _, v in history["val_loss"]],
                               rtol=1e-6)
    assert [s for s, _ in got["train/learning_rate"]] == [2, 4]
    assert all(v > 0 for _, v in got["train/tokens_per_second"])
