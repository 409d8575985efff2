"""Build or load the policy: a tiny Qwen2 for CPU runs, or any causal-LM checkpoint.

Shape symbols: ``B`` sequences, ``T`` tokens, ``V`` vocabulary (= ``len(tokenizer)``).
"""

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from huggingface_hub import constants as hf_constants
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from creditflow.config.policy import (
    ATTN_IMPLEMENTATIONS,
    PolicySpec,
)
from creditflow.models.lora import add_lora

logger = logging.getLogger(__name__)

# The dtypes by config.policy.DTYPE_NAMES (a test holds the names equal).
DTYPES: dict[str, torch.dtype | str] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "auto": "auto",  # whatever the checkpoint's config.json says
}


def build_tiny_qwen2(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    attn_implementation: str = "eager",
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM sized for CPU tests and smoke runs.

    The architecture is the real ``Qwen2Config``/``Qwen2ForCausalLM``, so every code path
    (GQA, RoPE, left-padded generation, ``save_pretrained``) is the one a real Qwen2.5
    checkpoint takes; only the sizes shrink.

    Args:
        tokenizer: sets ``V = len(tokenizer)`` and the pad/eos/bos ids.
        hidden_size: must be divisible by ``num_attention_heads``.
        num_attention_heads: must be divisible by ``num_key_value_heads`` (GQA groups).
        seed: weights depend only on it; the global torch RNG is left untouched.
        attn_implementation: one of ``ATTN_IMPLEMENTATIONS``.

    Returns:
        The model in eval mode; ``model(input_ids).logits`` is ``(B, T, V)``.
    """
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"unknown attn_implementation {attn_implementation!r}; "
            f"valid: {list(ATTN_IMPLEMENTATIONS)}"
        )
    if hidden_size % num_attention_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_attention_heads "
            f"({num_attention_heads})"
        )
    if num_attention_heads % num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({num_attention_heads}) must be divisible by "
            f"num_key_value_heads ({num_key_value_heads})"
        )
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError(
            "the tokenizer needs a pad and an eos token (train_bpe_tokenizer sets both)"
        )

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        attn_implementation=attn_implementation,
    )
    # fork_rng restores the global CPU generator afterwards, so building a model never
    # shifts the random stream of the caller (data shuffling, sampling).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    # generate() reads these, not the model config; without them it warns and pads with eos.
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()


DEVICE_TYPES = ("cpu", "cuda", "mps")


def resolve_device(name: str) -> torch.device:
    """The device a policy spec's ``device`` names: ``"cpu"``, ``"cuda"``, ``"cuda:<index>"``,
    ``"mps"``, or ``"auto"`` (CUDA when this machine has it, else the CPU).

    Raises:
        ValueError: a malformed name, or a device this machine does not have, with what to set.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name) if isinstance(name, str) else None
    except RuntimeError:
        device = None
    if device is None or device.type not in DEVICE_TYPES:
        raise ValueError(
            f"unknown device {name!r}; valid: 'auto', 'cpu', 'cuda', 'cuda:<index>', 'mps'"
        )
    fix = "set the policy's device to 'cpu', or to 'auto' (CUDA when present, else the CPU)"
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = (
                "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            )
            raise ValueError(
                f"device {name!r} is not available: this machine has no CUDA device (torch "
                f"{torch.__version__}, {build}); {fix}"
            )
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"device {name!r} is not available: this machine has {count} CUDA device(s), "
                f"cuda:0 to cuda:{count - 1}; pick one of them or 'auto'"
            )
        if device.index is None:  # the current one, named, so loading and .to() agree
            device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} is not available: no Apple MPS device; {fix}")
    return device


def from_pretrained_kwargs(policy: PolicySpec) -> dict[str, Any]:
    """Keyword arguments of ``from_pretrained`` for a ``pretrained`` ``policy``."""
    kwargs: dict[str, Any] = {
        "dtype": DTYPES[policy.dtype],
        "trust_remote_code": policy.trust_remote_code,
    }
    if policy.attn_implementation is not None:
        kwargs["attn_implementation"] = policy.attn_implementation
    device = resolve_device(policy.device)
    if device.type != "cpu":
        # Straight onto the device, without a copy of the weights in CPU memory first.
        kwargs["device_map"] = str(device)
    return kwargs


def prepare_policy(policy: PolicySpec, model: PreTrainedModel) -> PreTrainedModel:
    """A built or loaded ``model`` as ``policy`` asks for it: a tiny one cast to ``dtype``,
    on ``device``, wrapped with fresh LoRA adapters when ``lora`` is set."""
    if policy.source == "tiny" and policy.dtype != "auto":
        model = model.to(DTYPES[policy.dtype])
    model = model.to(resolve_device(policy.device))
    return (model if policy.lora is None else add_lora(model, policy.lora)).eval()


def to_policy_device(model: torch.nn.Module, spec: Mapping[str, Any]) -> torch.nn.Module:
    """``model`` moved (in place) to the device policy spec ``spec`` names (``device``, default
    ``"cpu"``). The catalog loads a saved policy on the CPU: a node that takes one from the
    catalog puts it here first.

    Raises:
        ValueError: a device this machine does not have (``resolve_device``).
    """
    return model.to(resolve_device(spec.get("device", "cpu")))


def ready_for_rollouts(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name_or_path: str, own: str
) -> PreTrainedModel:
    """A loaded checkpoint set up for batched rollouts, in eval mode: ``tokenizer`` pads on the
    left (with eos when it has no pad token) and fits the embedding table, and ``generate``
    knows the pad id. ``own`` names what to pass instead of a tokenizer that does not fit
    (``"tokenizer"``, or ``"processor"`` for a vision-language policy)."""
    # Rollouts generate a batch of prompts; right padding would put pad tokens between a
    # prompt and its completion.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        logger.warning("tokenizer of %s has no pad token; padding with eos", name_or_path)
        tokenizer.pad_token = tokenizer.eos_token
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens but {name_or_path} embeds only "
            f"{model.get_input_embeddings().num_embeddings}; pass the checkpoint's own {own}"
        )
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


@contextmanager
def explain_missing_checkpoint(name_or_path: str) -> Iterator[None]:
    """Re-raise transformers' OSError for a missing checkpoint with what to do about it."""
    try:
        yield
    except OSError as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes", "on"}
        where = (
            f" and is not in the local Hugging Face cache ({hf_constants.HF_HUB_CACHE}; "
            "HF_HUB_OFFLINE=1 forbids downloading it)"
            if offline
            else ""
        )
        raise OSError(
            f"could not load the policy checkpoint {name_or_path!r}: it is not a local "
            f"directory with config.json and weights{where}. Download it first "
            f"(`hf download {name_or_path}` on a machine with network access, into that "
            "cache: HF_HOME or HF_HUB_CACHE choose where it is) or set 'name_or_path' in "
            f"parameters to a local checkpoint directory. Original error: {exc}"
        ) from exc
