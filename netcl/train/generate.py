"""`netcl generate` and `netcl chat`: stream text from a GPT in a run or model directory (what `netcl
lm-train` writes: config.json, model.safetensors, tokenizer.json, checkpoint.safetensors)."""

from __future__ import annotations

import argparse
import codecs
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from netcl.errors import NetclError
from netcl.io import load_checkpoint
from netcl.io.checkpoint import read_checkpoint
from netcl.io.huggingface import WEIGHTS, read_json
from netcl.models import GPT
from netcl.models.config import DTYPES, GPTConfig
from netcl.text import BPETokenizer, ChatFormat, ChatTemplate, UnknownTokenError, template_from_jinja
from netcl.text.chat import TEMPLATES
from netcl.train import flags
from netcl.train.corpus import END_OF_TEXT
from netcl.train.runs import open_device

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SENTENCEPIECE_MODEL = "tokenizer.model"


def _max_new_tokens(text: str) -> int:
    """--max-new-tokens: an integer >= 1. GPT.generate(ids, 0) is an empty stream; here 0 would only echo
    the prompt (or, in chat, answer nothing), so it is refused with that reason."""
    try:
        return flags.int_at_least(1)(text)
    except argparse.ArgumentTypeError as exc:
        zero = text.strip().lstrip("+-") == "0"
        raise argparse.ArgumentTypeError(f"{exc}{' (0 would generate nothing)' if zero else ''}") from None


def _add_sampling(p: argparse.ArgumentParser, max_new: int) -> None:
    p.add_argument("--max-new-tokens", type=_max_new_tokens, default=max_new,
                   help=f"tokens to generate at most (default {max_new}; never past the context window)")
    p.add_argument("--temperature", type=flags.number(0.0), default=0.8,
                   help="sampling temperature (default 0.8; 0 = greedy)")
    p.add_argument("--top-k", type=flags.int_at_least(1), default=None,
                   help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=flags.number(0.0, 1.0, low_open=True), default=None,
                   help="sample among the most likely tokens whose probabilities sum to p (0 < p <= 1)")
    p.add_argument("--seed", type=flags.seed, default=0,
                   help="sampling seed, in [0, 2**64) (default 0)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="the weights' storage on the device (default float32; bfloat16 and float16 hold a "
                        "Hugging Face checkpoint at half the bytes, computed in float32)")
    p.add_argument("--int8", action="store_true",
                   help="weight-only int8 linear layers (a scale per output channel), dequantized on the fly")
    p.add_argument("--max-seq-len", type=flags.int_at_least(1), default=None, metavar="N",
                   help="the context window in tokens (default: the model's, config.json's "
                        "max_position_embeddings); fewer positions take smaller rotary tables")


def register(subparsers: Any) -> None:
    gen = subparsers.add_parser(
        "generate", help="stream text from a trained GPT (netcl lm-train's run directory)"
    )
    gen.add_argument("--checkpoint", required=True, metavar="PATH", type=flags.path_arg,
                     help="a run or model directory, or its checkpoint.safetensors")
    gen.add_argument("--prompt", default="", help="text to continue (default: the start of a new file); "
                     "special-token text in it, such as <|endoftext|>, is that control token")
    _add_sampling(gen, 200)
    flags.add_device_argument(gen)
    gen.set_defaults(func=run_generate)

    chat = subparsers.add_parser("chat", help="multi-turn terminal chat with a GPT through a chat template")
    chat.add_argument("--checkpoint", required=True, metavar="PATH", type=flags.path_arg,
                      help="a run or model directory, or its checkpoint.safetensors")
    chat.add_argument("--system", default=None, help="a system message that starts the dialog")
    chat.add_argument("--template", choices=tuple(TEMPLATES), default=None,
                      help="chat template (default: the one tokenizer_config.json's chat_template lays out, "
                           "else chatml; the tokenizer must have its special tokens)")
    _add_sampling(chat, 128)
    flags.add_device_argument(chat)
    chat.set_defaults(func=run_chat)


def stream_tokens(model: GPT, tokenizer: BPETokenizer, ids: list[int], max_new_tokens: int, *,
                  temperature: float, top_k: int | None, top_p: float | None, seed: int,
                  stop: Iterable[int] = ()) -> Iterable[str]:
    """Text pieces as the model generates tokens after `ids`, decoded incrementally (a character split
    across tokens comes out whole, with the token that completes it); stop tokens end it unprinted. A token
    the tokenizer lacks (a model's vocabulary padded past its tokenizer's, as Qwen2's is) is a real output
    that reads as nothing, as Hugging Face's decode reads it."""
    stop = set(stop)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for token in model.generate(list(ids), max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                seed=seed, stop_tokens=tuple(stop)):
        token = int(token)
        if token in stop:
            break
        try:
            data = tokenizer.decode_bytes([token])
        except UnknownTokenError:
            data = b""
        piece = decoder.decode(data)
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def load_model_dir(directory: str, device: str, flag: str = "--checkpoint", dtype: str = "float32",
                   int8: bool = False, max_seq_len: int | None = None) -> tuple[GPT, BPETokenizer]:
    """The GPT and tokenizer of a run or model directory (config.json, model.safetensors, tokenizer.json), or
    of a .safetensors file in one: its weights (model.safetensors, a shard) or lm-train's
    checkpoint.safetensors, whose own weights are then loaded; weights stored in `dtype` (the linear layers'
    as int8 with `int8`), a context of `max_seq_len` positions (None: the model's). The tokenizer must
    make no token the model lacks (check_vocabulary). Errors name the command-line `flag`."""
    path = Path(directory)
    checkpoint = None
    if path.is_file():
        if path.suffix != ".safetensors":
            raise NetclError(f"{flag} {path} is neither a directory nor a .safetensors file: give a run or "
                             "model directory, or its checkpoint.safetensors")
        if not (path.name == WEIGHTS or path.name.startswith("model-")):
            checkpoint = path  # a training checkpoint: the model comes from the directory around it
        path = path.parent
    elif not path.is_dir():
        raise NetclError(f"{flag} {path}: no such directory or file")
    # tokenizer.json first; a SentencePiece tokenizer.model (Llama 2's BPE) where it is the only one
    tokenizer_file = path / TOKENIZER_FILE
    if not tokenizer_file.is_file() and (path / SENTENCEPIECE_MODEL).is_file():
        tokenizer_file = path / SENTENCEPIECE_MODEL
    missing = [n for n in ("config.json", tokenizer_file.name) if not (path / n).is_file()]
    if missing:
        raise NetclError(f"{flag} {path} has no {' or '.join(missing)}: a model directory holds "
                         "config.json, the weights and tokenizer.json (netcl lm-train writes them; a "
                         "SentencePiece tokenizer.model does too)")
    if checkpoint is not None and read_checkpoint(checkpoint)[1].get("extra", {}).get("kind") != "lm":
        raise NetclError(f"{flag} {checkpoint} is not a checkpoint of netcl lm-train; give the directory "
                         f"{path} for its model.safetensors")
    if checkpoint is not None and dtype != "float32":
        raise NetclError(f"--dtype {dtype} is for model directories; {checkpoint} is a float32 training "
                         f"checkpoint (give the directory {path}, or --dtype float32)")
    if tokenizer_file.name == SENTENCEPIECE_MODEL:
        tokenizer = BPETokenizer.from_sentencepiece(tokenizer_file)
    else:
        tokenizer = BPETokenizer.from_hf(tokenizer_file)
    overrides: dict[str, Any] = {"dtype": dtype}
    if max_seq_len is not None:
        overrides["max_seq_len"] = max_seq_len
    try:
        model = GPT.from_pretrained(path, open_device(device).queue, **overrides)
    except ValueError as exc:
        if isinstance(exc, NetclError) or max_seq_len is None:
            raise
        # the override's own error (a GPT-2 takes no max_seq_len): the flag that set it
        reason = str(exc).removeprefix("from_pretrained: ")
        raise NetclError(f"--max-seq-len {max_seq_len}: {reason}") from None
    used = [t for t in (tokenizer.bos_token, END_OF_TEXT) if t in tokenizer.special_tokens]
    check_vocabulary(model, tokenizer, f"{path / tokenizer_file.name}", used)
    if checkpoint is not None:
        load_checkpoint(checkpoint, model, restore_rng=False)
    if int8:
        model.quantize_int8()
    model.eval()
    return model, tokenizer


def _context(model: GPT) -> int:
    return int(model.config.max_seq_len)


def _model_dir(checkpoint: str) -> Path:
    path = Path(checkpoint)
    return path.parent if path.is_file() else path


def check_vocabulary(model: GPT, tokenizer: BPETokenizer, source: str, used: Iterable[str]) -> None:
    """The tokenizer (read from `source`) makes only ids the model has: every ordinary token (any text may
    encode to it), and the special tokens in `used` (a BOS, <|endoftext|>, a chat template's). Special tokens
    above the model's vocabulary that nothing uses are let be (a tokenizer's spare added tokens); a prompt
    that writes one out is refused where it is encoded."""
    vocab = model.config.vocab_size
    specials = {tid: token for token, tid in tokenizer.special_tokens.items()}
    for tid in range(tokenizer.n_vocab - 1, vocab - 1, -1):
        if tid in specials:
            continue
        try:
            tokenizer.token_bytes(tid)
        except UnknownTokenError:  # an id the tokenizer leaves unassigned
            continue
        raise NetclError(
            f"{source} has ordinary tokens up to id {tid} ({tokenizer.n_vocab} ids in all), but the model's "
            f"vocab_size is {vocab} (config.json): it has no embedding for ids {vocab}..{tid}, so this is "
            "not its tokenizer (only special tokens that nothing uses may lie past the model's vocabulary)"
        )
    outside = [f"{t} (id {tokenizer.special_id(t)})" for t in used if tokenizer.special_id(t) >= vocab]
    if outside:
        tokens = "token " if len(outside) == 1 else "tokens "
        raise NetclError(
            f"{source}: generation uses the special {tokens}{', '.join(outside)}, past the model's "
            f"vocab_size of {vocab} (config.json): this is not the model's tokenizer (only special tokens "
            "that nothing uses may lie past the model's vocabulary)"
        )


def stop_ids(config: GPTConfig, tokenizer: BPETokenizer) -> set[int]:
    """Tokens that end generation: <|endoftext|> where the tokenizer has it, and the model's end-of-sequence
    ids (GPTConfig.eos_token_ids: a Hugging Face directory's, generation_config.json's before config.json's,
    as transformers' generate takes them)."""
    stop = {tokenizer.special_id(END_OF_TEXT)} if END_OF_TEXT in tokenizer.special_tokens else set()
    return stop | set(config.eos_token_ids)


def chat_template(checkpoint: str, name: str | None) -> str | ChatTemplate:
    """``--template NAME``, else the built-in layout tokenizer_config.json's ``chat_template`` is (netcl
    runs no Jinja: an unknown one is an error asking for --template), else chatml."""
    if name is not None:
        return name
    config = _model_dir(checkpoint) / TOKENIZER_CONFIG
    source = (read_json(config) or {}).get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str):
        return "chatml"
    template = template_from_jinja(source)
    if template is None:
        raise NetclError(f"{config}: its chat_template is not a layout netcl knows (netcl runs no Jinja; it "
                         f"has {', '.join(TEMPLATES)}): pass --template NAME")
    return template


def run_generate(args: argparse.Namespace) -> int:
    model, tokenizer = load_model_dir(args.checkpoint, args.device, dtype=args.dtype, int8=args.int8,
                                      max_seq_len=args.max_seq_len)
    bos = tokenizer.bos_token
    # the prompt is the model's raw input: special-token text in it (<|endoftext|>, a hand-written
    # <|im_start|>) is the control token, as the model saw it in training, not an error; the BOS a
    # Hugging Face tokenizer's post-processor adds (<s>, <|begin_of_text|>) comes first
    if args.prompt:
        ids = tokenizer.encode(args.prompt, allowed_special="all", add_bos=bos is not None)
    else:
        # transformers' generate starts an empty input from the model's bos_token_id; else the tokenizer's
        # BOS, else <|endoftext|> (netcl lm-train's models)
        starts = [model.config.bos_token_id, *(tokenizer.special_tokens.get(t) for t in (bos, END_OF_TEXT))]
        ids = [t for t in starts if t is not None][:1]
    if not ids:
        raise NetclError(
            "--prompt is empty, and neither the model (config.json's bos_token_id) nor the tokenizer (a BOS, "
            "<|endoftext|>) names a token to start from; give a prompt"
        )
    vocab = model.config.vocab_size
    outside = [t for t in ids if t >= vocab]
    if outside:  # only a special token can be (check_vocabulary): a spare one the prompt writes out
        names = {tid: token for token, tid in tokenizer.special_tokens.items()}
        what = f"--prompt writes the special token {names.get(outside[0])}" if args.prompt else \
            "the model's bos_token_id (its config.json or generation_config.json)"
        raise NetclError(f"{what} (id {outside[0]}) lies past the model's vocab_size of {vocab}: the model "
                         "has no embedding for it")
    context = _context(model)
    if len(ids) >= context:
        raise NetclError(
            f"--prompt is {len(ids)} tokens; the model's context window is {context}: shorten it"
        )
    budget = min(args.max_new_tokens, context - len(ids))
    if budget < args.max_new_tokens:
        print(
            f"netcl: generating {budget} tokens, not "
            f"{args.max_new_tokens}: the prompt ({len(ids)} tokens) and "
            f"the reply share the context window of {context}",
            file=sys.stderr,
        )
    out: TextIO = sys.stdout
    # the prompt goes out with the first piece: the first token builds the kernels, whose notice (stderr)
    # would otherwise land inside the echoed line
    head = [args.prompt]
    try:
        for piece in stream_tokens(
            model,
            tokenizer,
            ids,
            budget,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop=stop_ids(model.config, tokenizer),
        ):
            out.write("".join(head) + piece)
            head.clear()
            out.flush()
    except KeyboardInterrupt:  # Ctrl-C ends the text where it is
        out.write("".join(head) + "\n")
        return 130
    out.write("".join(head) + "\n")
    return 0


def fit_dialog(chat: ChatFormat, messages: list[dict[str, str]], budget: int) -> tuple[list[int], int]:
    """The prompt ids of `messages` plus the assistant header, made to fit `budget` tokens by dropping the
    oldest turns (a system message stays); returns (ids, number of messages dropped). When the last user
    message alone is too long, its beginning is cut (the ids keep their last `budget` tokens)."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system):]
    dropped = 0
    while True:
        ids, _ = chat.encode_dialog(system + turns, add_generation_prompt=True)
        if len(ids) <= budget or len(turns) <= 1:
            break
        turns = turns[1:]
        dropped += 1
        while turns and turns[0]["role"] != "user":  # a dialog restarts with the user
            turns = turns[1:]
            dropped += 1
    messages[:] = system + turns
    return (ids if len(ids) <= budget else ids[-budget:]), dropped


def chat_name(template: str | ChatTemplate) -> str:
    return template if isinstance(template, str) else template.name


def run_chat(args: argparse.Namespace) -> int:
    model, tokenizer = load_model_dir(args.checkpoint, args.device, dtype=args.dtype, int8=args.int8,
                                      max_seq_len=args.max_seq_len)
    template = chat_template(args.checkpoint, args.template)
    try:
        chat = ChatFormat(tokenizer, template)
    except ValueError as exc:
        raise NetclError(f"--template {chat_name(template)}: {exc}") from None
    check_vocabulary(model, tokenizer, f"the tokenizer of {_model_dir(args.checkpoint)}",
                     chat.template.specials())
    stop = {tokenizer.special_id(chat.template.end_of_turn)} | stop_ids(model.config, tokenizer)
    context = _context(model)
    system = [{"role": "system", "content": args.system}] if args.system else []
    if system:  # the dialog keeps the system message: one that fills the window would be cut silently
        n = len(chat.encode_dialog([*system, {"role": "user", "content": ""}], add_generation_prompt=True)[0])
        room = context - min(args.max_new_tokens, context // 2)
        if n > room:
            print(f"netcl: --system is {n} tokens with the turn headers; the context window of {context} "
                  f"tokens leaves {room} for the dialog (the rest is the reply's), so every prompt loses the "
                  "start of the system message: shorten it", file=sys.stderr)
    interactive = sys.stdin.isatty()
    print(f"netcl chat: {args.checkpoint} ({model.num_parameters():,} parameters, context {context} tokens, "
          f"{chat.template.name} template). /reset clears the history, /exit (or end of input) leaves.")
    try:
        return _chat_loop(args, model, tokenizer, chat, stop, system, interactive)
    except KeyboardInterrupt:  # Ctrl-C leaves, as /exit does
        print()
        return 130


def _chat_loop(
    args: argparse.Namespace,
    model: GPT,
    tokenizer: BPETokenizer,
    chat: ChatFormat,
    stop: set[int],
    system: list[dict[str, str]],
    interactive: bool,
) -> int:
    """Read a line, answer it (streamed), until /exit or the end of input."""
    context = _context(model)
    reply_room = min(args.max_new_tokens, context // 2)
    messages = list(system)
    turn = 0
    capped = args.max_new_tokens  # the reply length the last notice named
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:  # end of input
            if interactive:
                print()
            return 0
        text = line.rstrip("\n")
        if text.strip() == "/exit":
            return 0
        if text.strip() == "/reset":
            messages = list(system)
            print("(history cleared)")
            continue
        if not text.strip():
            continue
        if not interactive:
            print(f"you> {text}")
        messages.append({"role": "user", "content": text})
        ids, dropped = fit_dialog(chat, messages, context - reply_room)
        if dropped:
            print(f"(dropped the {dropped} oldest message(s) to fit the context window of {context} tokens)",
                  file=sys.stderr)
        whole = len(chat.encode_dialog(messages, add_generation_prompt=True)[0])
        if whole > len(ids):
            print(f"netcl: your message makes a prompt of {whole} tokens; the context window of {context} "
                  f"tokens leaves {len(ids)} for the prompt (the rest is the reply's), so its first "
                  f"{whole - len(ids)} tokens were cut: shorten the message", file=sys.stderr)
        budget = min(args.max_new_tokens, context - len(ids))
        if budget < args.max_new_tokens and budget != capped:
            print(f"netcl: generating {budget} tokens, not {args.max_new_tokens}: the prompt ({len(ids)} "
                  f"tokens) and the reply share the context window of {context}", file=sys.stderr)
        capped = budget
        head = ["assistant> "]   # out with the first piece (the first turn's kernels' notice before it)
        reply: list[str] = []
        # a SentencePiece reply's first token carries the space its tokenizer puts before a text; the reply
        # is its own text (Hugging Face's decode drops that space too)
        drop_space = tokenizer.metaspace not in (None, "never")
        # each turn its own stream: the seed's successors, wrapping at 2**64 as a seed does
        for piece in stream_tokens(model, tokenizer, ids, budget, temperature=args.temperature,
                                   top_k=args.top_k, top_p=args.top_p, seed=(args.seed + turn) % (1 << 64),
                                   stop=stop):
            if drop_space:  # one space, from the first piece only
                drop_space = False
                if piece.startswith(" "):
                    piece = piece[1:]
                    if not piece:
                        continue
            reply.append(piece)
            print("".join(head) + piece, end="", flush=True)
            head.clear()
        print("".join(head))
        messages.append({"role": "assistant", "content": "".join(reply)})
        turn += 1
