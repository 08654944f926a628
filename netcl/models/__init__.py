"""Models built from netcl's layers: GPT (Llama-style and GPT-2 style decoders) with generation and Hugging
Face weights."""

from netcl.io.huggingface import PretrainedError
from netcl.models.config import GPTConfig
from netcl.models.gpt import GPT

__all__ = ["GPT", "GPTConfig", "PretrainedError"]
