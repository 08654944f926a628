"""examples/chat_finetune.py: its examples train on assistant tokens only (ChatFormat's loss mask), the
loss and its gradient come from those positions alone, and the model it writes is one `netcl chat` runs."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.cli import main
from netcl.core.tensor import Tensor
from netcl.models import GPT, GPTConfig
from netcl.ops import random
from netcl.text import BPETokenizer, ChatFormat

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chat_finetune.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("chat_finetune", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def chat(example):
    dialogs = example.make_dialogs(40, seed=1)
    text = "\n".join(m["content"] for d in dialogs for m in d) + "\nuser\nassistant\nsystem\n"
    tok = BPETokenizer.train(text, 512, special_tokens=example.SPECIALS)
    return ChatFormat(tok, "chatml"), dialogs


def test_targets_are_the_next_assistant_tokens_and_ignore_the_rest(example, chat):
    fmt, dialogs = chat
    pad = fmt.tokenizer.special_id("<|endoftext|>")
    ids, targets = example.encode_examples(fmt, dialogs, 96, pad)
    assert ids.shape == targets.shape == (40, 96) and ids.dtype == targets.dtype == np.int32
    im_end = fmt.tokenizer.special_id("<|im_end|>")
    for row, dialog in enumerate(dialogs):
        full, mask = fmt.encode_dialog(dialog)
        n = len(full)
        assert ids[row, :n].tolist() == full and (ids[row, n:] == pad).all()
        trained = targets[row] != example.IGNORE
        assert trained[:n - 1].tolist() == [bool(m) for m in mask[1:]] and not trained[n - 1:].any()
        assert (targets[row, trained] == np.asarray(full[1:])[trained[:n - 1]]).all()
        # what is trained decodes to the assistant replies, each closed by <|im_end|>
        replies = [m["content"] for m in dialog if m["role"] == "assistant"]
        assert (
            fmt.tokenizer.decode(targets[row, trained].tolist()) == "<|im_end|>".join(replies) + "<|im_end|>"
        )
        assert (targets[row, trained] == im_end).sum() == len(replies)
    with pytest.raises(ValueError, match="does not fit the context of 8"):
        example.encode_examples(fmt, dialogs, 8, pad)


def test_only_assistant_positions_carry_loss_and_gradient(example, chat, queue):
    fmt, dialogs = chat
    pad = fmt.tokenizer.special_id("<|endoftext|>")
    ids, targets = example.encode_examples(fmt, dialogs[:3], 96, pad)
    random.manual_seed(0)
    model = GPT(
        queue, GPTConfig(vocab_size=fmt.tokenizer.n_vocab, dim=16, n_layers=1, n_heads=2, max_seq_len=96)
    )
    logits = model(Tensor.from_host(queue, ids)).value.to_host().astype(np.float64)
    # the loss: float64 NumPy over the assistant targets only
    keep = targets != example.IGNORE
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    expected = -logp[keep, targets[keep]].mean()
    loss = example.assistant_loss(model, Tensor.from_host(queue, ids), Tensor.from_host(queue, targets))
    assert loss.value.to_host()[0] == pytest.approx(expected, rel=1e-5)
    # GPT.loss with ChatFormat's mask (targets = every next token, mask on the assistant's) is the same loss
    full_targets = np.where(keep, targets, np.roll(ids, -1, axis=1)).astype(np.int32)
    masked = model.loss(Tensor.from_host(queue, ids), Tensor.from_host(queue, full_targets), loss_mask=keep)
    assert masked.value.to_host()[0] == pytest.approx(expected, rel=1e-5)
    # the gradient reaching the logits is zero on every non-assistant position, softmax - onehot elsewhere
    node = ag.tensor(Tensor.from_host(queue, logits.astype(np.float32)), requires_grad=True)
    with ag.Tape() as tape:
        out = ag.cross_entropy(node, ag.tensor(Tensor.from_host(queue, targets)), ignore_index=example.IGNORE)
    tape.backward(out)
    grad = node.grad.to_host()
    assert not grad[~keep].any()
    onehot = np.zeros_like(logits)
    rows, cols = np.nonzero(keep)
    onehot[rows, cols, targets[keep]] = 1.0
    np.testing.assert_allclose(grad[keep], (np.exp(logp) - onehot)[keep] / keep.sum(), rtol=1e-4, atol=1e-7)


def test_the_example_trains_a_model_netcl_chat_talks_to(example, tmp_path, capsys, monkeypatch):
    out = tmp_path / "chat"
    assert example.main(["--out", str(out), "--steps", "4", "--dialogs", "60", "--batch-size", "4"]) == 0
    text = capsys.readouterr().out
    assert "assistant targets" in text and "step 4/4" in text and "user: What is 4 plus 3?" in text
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is 2 plus 2?\n"))
    assert main(["chat", "--checkpoint", str(out), "--max-new-tokens", "4", "--temperature", "0"]) == 0
    assert "assistant> " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        example.main(["--steps", "0"])
    assert "--steps must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("extra,words", [
    (("--steps", "0"), "--steps must be >= 1, got 0"),
    (("--batch-size", "-2"), "--batch-size must be >= 1, got -2"),
    (("--dialogs", "0"), "--dialogs must be >= 1, got 0"),
    (("--lr", "nan"), "--lr must be a finite number > 0, got nan"),
    (("--seed", "-1"), "--seed must be >= 0, got -1"),
    (("--steps", "x"), "argument --steps: invalid int value: 'x'"),
    (("--init", "{tmp}/absent-run"), "--init {tmp}/absent-run: no such directory"),  # never there
    (("--device", "nosuch"), "--device nosuch: unknown device"),
    (("--out", "{a_file}/run"), "Not a directory"),
])
def test_bad_example_flags_are_clear_errors_and_write_nothing(example, tmp_path, capsys, extra, words):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    extra = [e.format(a_file=a_file, tmp=tmp_path) for e in extra]
    with pytest.raises(SystemExit) as exc:
        example.main(["--out", str(tmp_path / "never"), "--dialogs", "5", *extra])
    assert exc.value.code == 2
    assert words.format(tmp=tmp_path) in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
