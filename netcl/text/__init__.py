"""Text tokenization for netcl: BPE (byte-level with regex pre-splitting, or SentencePiece-style with byte
fallback), tokenizer files, chat templates.

Pure host code (no OpenCL); importing it does not import the rest of netcl.
"""

from .bpe import BPETokenizer
from .chat import CHATML, LLAMA3, PLAIN, ZEPHYR, ChatFormat, ChatTemplate, template_from_jinja
from .errors import SpecialTokenError, TokenIdTypeError, TokenizerFileError, UnknownTokenError
from .formats import bytes_to_unicode
from .patterns import CL100K_PATTERN, GPT2_PATTERN, NAMED_PATTERNS, O200K_PATTERN

__all__ = [
    "CHATML",
    "CL100K_PATTERN",
    "GPT2_PATTERN",
    "LLAMA3",
    "NAMED_PATTERNS",
    "O200K_PATTERN",
    "PLAIN",
    "ZEPHYR",
    "BPETokenizer",
    "ChatFormat",
    "ChatTemplate",
    "SpecialTokenError",
    "TokenIdTypeError",
    "TokenizerFileError",
    "UnknownTokenError",
    "bytes_to_unicode",
    "template_from_jinja",
]
