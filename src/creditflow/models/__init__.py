"""The model layer: a locally trained tokenizer, a tiny Qwen2 builder and the policy loader.

Shape symbols: ``B`` sequences, ``T`` tokens, ``V`` vocabulary.
"""

from creditflow.models.builders import (
    ATTN_IMPLEMENTATIONS,
    DTYPES,
    build_tiny_qwen2,
    load_policy,
)
from creditflow.models.tokenizer import (
    CONTROL_TOKENS,
    DEFAULT_CHAT_TEMPLATE,
    IM_END_TOKEN,
    IM_START_TOKEN,
    PAD_TOKEN,
    load_tokenizer,
    train_bpe_tokenizer,
)

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "CONTROL_TOKENS",
    "DEFAULT_CHAT_TEMPLATE",
    "DTYPES",
    "IM_END_TOKEN",
    "IM_START_TOKEN",
    "PAD_TOKEN",
    "build_tiny_qwen2",
    "load_policy",
    "load_tokenizer",
    "train_bpe_tokenizer",
]
