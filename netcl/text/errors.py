"""Exceptions raised by netcl.text; all are `netcl.errors.NetclError` and ValueError (or TypeError) too."""

from __future__ import annotations

from netcl.errors import NetclError


class SpecialTokenError(NetclError, ValueError):
    """Text holds a special-token string that the caller did not allow.

    Attributes: ``token`` (the special-token string) and ``position`` (its character offset in the text).
    """

    def __init__(self, token: str, position: int) -> None:
        self.token = token
        self.position = position
        super().__init__(
            f"text contains the special token {token!r} at character {position}. Pass "
            f"allowed_special={{{token!r}}} (or 'all') to encode it as a control token, or "
            f"allowed_special='none' / encode_ordinary() to encode it as plain text."
        )


class UnknownTokenError(NetclError, ValueError):
    """A token id that is not in the vocabulary was given to decode."""


class TokenIdTypeError(UnknownTokenError, TypeError):
    """A value given to decode as a token id is not an integer (a float, a bool, a str, ...)."""


class TokenizerFileError(NetclError, ValueError):
    """A tokenizer file is malformed or uses a feature netcl does not support; the message names the file
    and the line or field."""
