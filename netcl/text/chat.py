"""Multi-turn chat templates (ChatML, Llama-3, Zephyr, plain) that encode a dialog to ids plus a loss mask.

Role names and message contents are always encoded as plain text, so a message that contains a
special-token string can never inject a control token. netcl does not run Jinja: `template_from_jinja`
recognizes the Hugging Face chat templates these layouts come from.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .bpe import BPETokenizer

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    """How one turn is laid out. ``{role}`` in a text piece is replaced by the message's role.

    A turn is ``header`` pieces, the content, ``end_of_turn`` (a special token) then ``after_turn`` text.
    A piece written ``<special:NAME>`` is the special token NAME; anything else is plain text.
    ``default_system``: the system message a dialog without one starts with (Qwen2's templates write one).
    """

    name: str
    header: tuple[str, ...]
    end_of_turn: str
    after_turn: str = ""
    begin: str | None = None
    strip_content: bool = False
    default_system: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"ChatTemplate name must be str, got {type(self.name).__name__}")
        if not isinstance(self.header, tuple) or not all(isinstance(p, str) for p in self.header):
            raise TypeError(
                f"ChatTemplate {self.name!r}: header must be a tuple of str pieces, got {self.header!r}"
            )
        for piece in self.header:
            if piece.startswith("<special:") and (not piece.endswith(">") or piece == "<special:>"):
                raise ValueError(
                    f"ChatTemplate {self.name!r}: header piece {piece!r} must be written <special:TOKEN>"
                )
        for field_name in ("end_of_turn", "begin"):
            value = getattr(self, field_name)
            if (value is not None or field_name == "end_of_turn") and (
                not isinstance(value, str) or not value
            ):
                raise TypeError(
                    f"ChatTemplate {self.name!r}: {field_name} must be a special-token string, got {value!r}"
                )
        if not isinstance(self.after_turn, str):
            raise TypeError(f"ChatTemplate {self.name!r}: after_turn must be str, got {self.after_turn!r}")
        if self.default_system is not None and not isinstance(self.default_system, str):
            raise TypeError(
                f"ChatTemplate {self.name!r}: default_system must be str or None, got {self.default_system!r}"
            )
        if not isinstance(self.strip_content, bool):
            raise TypeError(
                f"ChatTemplate {self.name!r}: strip_content must be True or False, got {self.strip_content!r}"
            )

    def specials(self) -> list[str]:
        """Special tokens this template needs."""
        needed = [p[len("<special:") : -1] for p in self.header if p.startswith("<special:")]
        needed.append(self.end_of_turn)
        if self.begin is not None:
            needed.insert(0, self.begin)
        return needed


def _special(token: str) -> str:
    return f"<special:{token}>"


#: ``<|im_start|>{role}\n{content}<|im_end|>\n``
CHATML = ChatTemplate("chatml", (_special("<|im_start|>"), "{role}\n"), "<|im_end|>", after_turn="\n")
#: ``<|begin_of_text|>`` once, then ``<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>``;
#: content is stripped of surrounding whitespace as Meta's reference ``ChatFormat`` does.
LLAMA3 = ChatTemplate(
    "llama3",
    (_special("<|start_header_id|>"), "{role}", _special("<|end_header_id|>"), "\n\n"),
    "<|eot_id|>",
    begin="<|begin_of_text|>",
    strip_content=True,
)
#: ``<|{role}|>\n{content}</s>\n`` (Zephyr, TinyLlama-chat): the role markers are plain text, the end of a
#: turn is the end-of-sequence token ``</s>``.
ZEPHYR = ChatTemplate("zephyr", ("<|{role}|>\n",), "</s>", after_turn="\n")
#: ``{role}: {content}<|endoftext|>\n``: no template tokens beyond the end-of-text token most vocabularies
#have.
PLAIN = ChatTemplate("plain", ("{role}: ",), "<|endoftext|>", after_turn="\n")

TEMPLATES: dict[str, ChatTemplate] = {t.name: t for t in (CHATML, LLAMA3, ZEPHYR, PLAIN)}

#: Strings whose presence identifies a Hugging Face Jinja chat template as one of netcl's layouts.
_JINJA_MARKERS: tuple[tuple[ChatTemplate, tuple[str, ...]], ...] = (
    (LLAMA3, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    (CHATML, ("<|im_start|>", "<|im_end|>")),
    (ZEPHYR, ("<|user|>", "<|assistant|>", "eos_token")),
)


#: A ChatML template's default system turn as one Jinja string literal (Qwen2's and Qwen2.5's
#: ``'<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n'``), its newlines escaped or not.
_CHATML_DEFAULT_SYSTEM = re.compile(
    r"""(['"])<\|im_start\|>system(?:\\n|\n)((?:\\.|(?!\1)[^\\])*?)<\|im_end\|>(?:\\n|\n)\1"""
)
_JINJA_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}


def template_from_jinja(source: str) -> ChatTemplate | None:
    """The built-in template a Hugging Face ``chat_template`` (Jinja source, from tokenizer_config.json)
    lays dialogs out as, recognized by the marker strings it writes; None when it is none of them (netcl
    does not run Jinja, so such a template is not supported: pick a built-in one). A ChatML template that
    writes a whole system turn as one literal (Qwen2's "You are a helpful assistant.") has that message as
    its default_system, which its Jinja puts first where a dialog has no system message."""
    if not isinstance(source, str):
        raise TypeError(f"chat_template must be a str of Jinja source, got {type(source).__name__}")
    for template, markers in _JINJA_MARKERS:
        if all(marker in source for marker in markers):
            found = _CHATML_DEFAULT_SYSTEM.search(source) if template is CHATML else None
            if found is None:
                return template
            text = re.sub(r"\\(.)", lambda m: _JINJA_ESCAPES.get(m[1], m[1]), found[2], flags=re.DOTALL)
            return dataclasses.replace(template, default_system=text)
    return None


class ChatFormat:
    """Encode dialogs for a tokenizer with a template ('chatml', 'llama3', 'plain' or a `ChatTemplate`).

    Loss mask choice: 1 on the tokens of assistant contents and on the assistant's end-of-turn special
    token (the model must learn to stop), 0 elsewhere: system/user turns, every header (so role names
    are never trained on), the text after the end-of-turn token, and the generation prompt.
    """

    def __init__(self, tokenizer: BPETokenizer, template: str | ChatTemplate = "chatml") -> None:
        if not isinstance(tokenizer, BPETokenizer):
            raise TypeError(f"tokenizer must be a BPETokenizer, got {type(tokenizer).__name__}")
        if isinstance(template, str):
            if template not in TEMPLATES:
                raise ValueError(f"unknown chat template {template!r}; choose one of {sorted(TEMPLATES)}")
            template = TEMPLATES[template]
        if not isinstance(template, ChatTemplate):
            raise TypeError(f"template must be a name or ChatTemplate, got {type(template).__name__}")
        specials = tokenizer.special_tokens
        missing = [t for t in template.specials() if t not in specials]
        if missing:
            raise ValueError(
                f"chat template {template.name!r} needs special tokens {missing} that the tokenizer lacks "
                f"(it has {sorted(specials) or 'none'}); add them as special_tokens when training or loading"
            )
        self.tokenizer = tokenizer
        self.template = template
        self._ids = {t: specials[t] for t in template.specials()}

    def _dialog(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool
    ) -> Sequence[Mapping[str, str]]:
        """`messages`, checked, after the template's default system message where they have none."""
        _validate(messages, add_generation_prompt)
        default = self.template.default_system
        if default is not None and messages[0]["role"] != "system":
            return [{"role": "system", "content": default}, *messages]
        return messages

    def _piece_ids(self, piece: str, role: str) -> list[int]:
        if piece.startswith("<special:"):
            return [self._ids[piece[len("<special:") : -1]]]
        return self.tokenizer.encode_ordinary(piece.replace("{role}", role))

    def _header(self, role: str) -> list[int]:
        return [i for piece in self.template.header for i in self._piece_ids(piece, role)]

    def _pieces(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool
    ) -> list[tuple[str | int, int]]:
        """The dialog as (plain text or special-token id, loss mask) pieces, in order."""
        template = self.template
        pieces: list[tuple[str | int, int]] = []
        if template.begin is not None:
            pieces.append((self._ids[template.begin], 0))

        def header(role: str) -> None:
            for piece in template.header:
                if piece.startswith("<special:"):
                    pieces.append((self._ids[piece[len("<special:") : -1]], 0))
                else:
                    pieces.append((piece.replace("{role}", role), 0))

        for message in messages:
            role, content = message["role"], message["content"]
            trained = 1 if role == "assistant" else 0
            header(role)
            pieces.append((content.strip() if template.strip_content else content, trained))
            pieces.append((self._ids[template.end_of_turn], trained))
            pieces.append((template.after_turn, 0))
        if add_generation_prompt:
            header("assistant")
        return pieces

    def _encode_runs(self, pieces: list[tuple[str | int, int]]) -> tuple[list[int], list[int]]:
        """For SentencePiece-style tokenizers: the text between two special tokens is encoded as one
        segment, as Hugging Face tokenizes a rendered template (a space goes before each segment, not
        before each piece). A token takes the mask of the piece its first byte is in."""
        tok = self.tokenizer
        ids: list[int] = []
        mask: list[int] = []
        run: list[tuple[str, int]] = []

        def flush() -> None:
            text = "".join(t for t, _ in run)
            run_ids = tok.encode_ordinary(text, at_start=not ids)
            lengths = [len(tok.token_bytes(i)) for i in run_ids]
            # byte offsets in the encoded run: first the space the tokenizer put before it, if any
            end = sum(lengths) - len(text.replace("\u2581", " ").encode("utf-8"))
            ends = []
            for piece, piece_mask in run:
                end += len(piece.replace("\u2581", " ").encode("utf-8"))
                ends.append((end, piece_mask))
            offset = 0
            for tid, length in zip(run_ids, lengths, strict=True):
                ids.append(tid)
                mask.append(next((m for e, m in ends if offset < e), run[-1][1]))
                offset += length
            run.clear()

        for piece, piece_mask in pieces:
            if isinstance(piece, int):
                if run:
                    flush()
                ids.append(piece)
                mask.append(piece_mask)
            elif piece:
                run.append((piece, piece_mask))
        if run:
            flush()
        return ids, mask

    def encode_dialog(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False
    ) -> tuple[list[int], list[int]]:
        """Return ``(ids, loss_mask)``, two lists of equal length; mask values are 0 or 1.

        ``messages``: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``; a system message
        may only come first (without one, the template's default_system, if it has one, is).
        ``add_generation_prompt`` appends the assistant header so a model continues with the reply (not
        allowed when the last message is already the assistant's).
        """
        messages = self._dialog(messages, add_generation_prompt)
        if self.tokenizer.metaspace is not None:
            return self._encode_runs(self._pieces(messages, add_generation_prompt))
        template = self.template
        ids: list[int] = []
        mask: list[int] = []
        if template.begin is not None:
            ids.append(self._ids[template.begin])
            mask.append(0)
        end = self._ids[template.end_of_turn]
        after = self.tokenizer.encode_ordinary(template.after_turn)
        for message in messages:
            role, content = message["role"], message["content"]
            trained = 1 if role == "assistant" else 0
            header = self._header(role)
            if template.strip_content:
                content = content.strip()
            body = self.tokenizer.encode_ordinary(content)
            ids += header
            mask += [0] * len(header)
            ids += body
            ids.append(end)
            mask += [trained] * (len(body) + 1)
            ids += after
            mask += [0] * len(after)
        if add_generation_prompt:
            header = self._header("assistant")
            ids += header
            mask += [0] * len(header)
        return ids, mask

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False) -> str:
        """The dialog as text (special tokens written out); for display, not for encoding."""
        messages = self._dialog(messages, add_generation_prompt)
        template = self.template

        def header(role: str) -> str:
            return "".join(
                p[len("<special:") : -1] if p.startswith("<special:") else p.replace("{role}", role)
                for p in template.header
            )

        out = [template.begin or ""]
        for m in messages:
            content = m["content"].strip() if template.strip_content else m["content"]
            out.append(header(m["role"]) + content + template.end_of_turn + template.after_turn)
        if add_generation_prompt:
            out.append(header("assistant"))
        return "".join(out)


def _validate(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> None:
    if not isinstance(add_generation_prompt, bool):
        raise TypeError(
            f"add_generation_prompt must be True or False, got {type(add_generation_prompt).__name__} "
            f"{add_generation_prompt!r}"
        )
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(
            f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages is empty: a dialog needs at least one message")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(
                f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        for key in ("role", "content"):
            if key not in message:
                keys = ", ".join(sorted(repr(k) for k in message)) or "none"
                raise ValueError(f"messages[{i}] has no {key!r} key (keys: {keys})")
        role, content = message["role"], message["content"]
        if not isinstance(role, str):
            raise TypeError(
                f"messages[{i}]['role'] must be str, got {type(role).__name__} {role!r}; roles are "
                f"{list(ROLES)}"
            )
        if role not in ROLES:
            raise ValueError(f"messages[{i}] has role {role!r}; roles are {list(ROLES)}")
        if not isinstance(content, str):
            raise TypeError(f"messages[{i}]['content'] must be str, got {type(content).__name__}")
        if role == "system" and i != 0:
            raise ValueError(f"messages[{i}] is a system message; only the first message may be one")
    if add_generation_prompt and messages[-1]["role"] == "assistant":
        raise ValueError("add_generation_prompt=True but the last message is already the assistant's")
