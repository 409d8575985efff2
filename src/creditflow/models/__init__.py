"""The model layer: a locally trained tokenizer, tiny Qwen2 / Qwen2.5-VL builders, policy loaders.

Shape symbols: ``B`` sequences, ``T`` tokens, ``V`` vocabulary.
"""

from creditflow.models.builders import (
    ATTN_IMPLEMENTATIONS,
    DTYPES,
    build_tiny_qwen2,
    explain_missing_checkpoint,
    to_policy_device,
)
from creditflow.models.loading import POLICY_KINDS, load_policy, policy_kind
from creditflow.models.tokenizer import (
    CONTROL_TOKENS,
    DEFAULT_CHAT_TEMPLATE,
    IM_END_TOKEN,
    IM_START_TOKEN,
    PAD_TOKEN,
    Prompt,
    chat_messages,
    load_tokenizer,
    train_bpe_tokenizer,
)
from creditflow.models.vision import (
    IMAGE_PAD_TOKEN,
    VISION_TOKENS,
    VL_CHAT_TEMPLATE,
    ImageOnlyQwen2_5_VLProcessor,
    build_tiny_processor,
    build_tiny_qwen2_5_vl,
    freeze_vision_encoder,
    sequence_forward_inputs,
    text_only_prompt_inputs,
    train_vl_tokenizer,
    vision_token_ids,
    vl_prompt_inputs,
)

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "CONTROL_TOKENS",
    "DEFAULT_CHAT_TEMPLATE",
    "DTYPES",
    "IM_END_TOKEN",
    "IM_START_TOKEN",
    "PAD_TOKEN",
    "Prompt",
    "build_tiny_qwen2",
    "chat_messages",
    "explain_missing_checkpoint",
    "load_policy",
    "policy_kind",
    "POLICY_KINDS",
    "load_tokenizer",
    "to_policy_device",
    "train_bpe_tokenizer",
    "IMAGE_PAD_TOKEN",
    "VISION_TOKENS",
    "VL_CHAT_TEMPLATE",
    "ImageOnlyQwen2_5_VLProcessor",
    "build_tiny_processor",
    "build_tiny_qwen2_5_vl",
    "sequence_forward_inputs",
    "text_only_prompt_inputs",
    "train_vl_tokenizer",
    "freeze_vision_encoder",
    "vision_token_ids",
    "vl_prompt_inputs",
]
