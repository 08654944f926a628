"""Pre-split regular expressions of the GPT-2, cl100k and o200k tokenizers (for the `regex` package).

BPE never merges across the boundaries these patterns draw, so a tokenizer's pattern is part of its identity.
`pre_splitter` cuts text into pieces with a pattern, losslessly: text no match covers is a piece of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import regex

#: GPT-2 / r50k / p50k. Same language as OpenAI's original
#: ``'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``, written with
#: possessive quantifiers as tiktoken does (faster, identical splits).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

#: cl100k_base (GPT-3.5/4): case-insensitive contractions, numbers in groups of at most 3 digits,
#: punctuation runs keep trailing newlines.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

#: o200k_base (GPT-4o): words split at case changes, contractions attached to the word.
O200K_PATTERN = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: Names accepted wherever a pattern is expected.
NAMED_PATTERNS: dict[str, str] = {"gpt2": GPT2_PATTERN, "cl100k": CL100K_PATTERN, "o200k": O200K_PATTERN}


def resolve_pattern(pattern: str | None) -> str | None:
    """Return the regex source for ``pattern``: a key of `NAMED_PATTERNS`, a regex source, or None.

    None means "no pre-splitting": the whole text (between special tokens) is one chunk.
    """
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str or None, got {type(pattern).__name__}")
    return NAMED_PATTERNS.get(pattern, pattern)


# Letters (upper and lower case, accented, CJK), digits, spaces, tabs, newlines, punctuation, an emoji: a
# pattern that matches anything at all matches some of this.
_SAMPLE = ("The quick brown fox, 1999-2024: jumps over the lazy dog!\n"
           "\tCafé 日本語 x_y = (a + b) * 42; 😀 'ok'?")


def tokenizer_pattern(pattern: str | None) -> str | None:
    """resolve_pattern, and refuse a pattern that matches only empty strings ("", r"\b", a bare lookahead):
    it marks no piece of its own, so every stretch between two of its zero-width matches becomes a piece
    ("" cuts text into single characters: no merge ever applies), which is never what a tokenizer meant.
    Judged on a sample of letters, digits, spaces and punctuation."""
    pattern = resolve_pattern(pattern)
    if pattern is None or pattern in NAMED_PATTERNS.values():
        return pattern
    spans = [m.span() for m in compile_pattern(pattern).finditer(_SAMPLE)]
    if spans and all(start == end for start, end in spans):
        raise ValueError(
            f"pre-split pattern {pattern!r} matches only empty strings, so it marks no pieces: give one "
            "that matches the pieces themselves (a name such as 'cl100k', or e.g. r'\\w+|\\s+|[^\\w\\s]+'), "
            "or None for no pre-splitting"
        )
    return pattern


_BARE_WORD = regex.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def named_or_regex(pattern: str | None) -> str | None:
    """tokenizer_pattern of a pattern a user typed: a bare word that names no pattern ("cl100k_base",
    "GPT2") is refused as the misspelt name it is (as a regex it would cut only that literal word out of the
    text, and the text between would go unsplit). Patterns read from tokenizer files are not judged so."""
    if isinstance(pattern, str) and pattern not in NAMED_PATTERNS and _BARE_WORD.fullmatch(pattern):
        raise ValueError(
            f"pre-split pattern {pattern!r} is not one of the named patterns {sorted(NAMED_PATTERNS)}; as a "
            "regular expression it would only cut that literal word out of the text: give a name, a "
            "pattern (e.g. r'\\w+|\\s+|[^\\w\\s]+'), or None for no pre-splitting"
        )
    return tokenizer_pattern(pattern)


@lru_cache(maxsize=32)
def compile_pattern(pattern: str) -> regex.Pattern:
    """Compile a pre-split pattern, naming it in the error if it is not a valid `regex` expression."""
    try:
        return regex.compile(pattern)
    except regex.error as err:
        raise ValueError(f"invalid pre-split pattern {pattern!r}: {err}") from err


def pre_splitter(pattern: str | None) -> Callable[[str], list[str]]:
    """A function text -> pieces whose concatenation is always the text.

    The pieces are the pattern's matches (whole matches: capturing groups do not matter) and, between
    them, each stretch of text no match covers, as its own piece (Hugging Face's ``Split`` pre-tokenizer
    with behavior "Isolated"). The built-in patterns cover all text, so there the pieces are exactly
    ``findall``'s. A pattern that matches the empty string may leave empty pieces (they encode to nothing).
    None: the whole text is one piece (no piece for empty text).
    """
    if pattern is None:
        return lambda text: [text] if text else []
    compiled = compile_pattern(pattern)
    findall, finditer = compiled.findall, compiled.finditer
    if pattern in NAMED_PATTERNS.values():
        # A character is a letter, a number, whitespace or none of these, and each built-in pattern has an
        # alternative that starts with each class, so findall never skips text: no check needed (3% of
        # encode time on code). tests/text/test_patterns.py checks this on random text.
        return findall

    def split(text: str) -> list[str]:
        if not compiled.groups:
            pieces = findall(text)
            # Matches never overlap, so they cover the text exactly when their lengths add up to it.
            if sum(map(len, pieces)) == len(text):
                return pieces
        pieces = []
        covered = 0
        for match in finditer(text):
            start, end = match.span()
            if start > covered:
                pieces.append(text[covered:start])
            if end > start:
                pieces.append(text[start:end])
            covered = end
        if covered < len(text):
            pieces.append(text[covered:])
        return pieces

    return split
