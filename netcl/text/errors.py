"""Exceptions raised by netcl.text; all subclass ValueError so callers may catch either."""

from __future__ import annotations


class SpecialTokenError(ValueError):
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


class UnknownTokenError(ValueError):
    """A token id that is not in the vocabulary was given to decode."""


class TokenizerFileError(ValueError):
    """A tokenizer file is malformed or uses a feature netcl does not support; the message names the line."""
