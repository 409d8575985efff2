"""Build or load the policy: a tiny Qwen2 for CPU runs, or any causal-LM checkpoint.

Shape symbols: ``B`` sequences, ``T`` tokens, ``V`` vocabulary (= ``len(tokenizer)``).
"""

import inspect
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from creditflow.models.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

# Both run the same speed for the tiny model on CPU and both are deterministic there
# (measured: identical logits across runs and across batch compositions). "eager" is the
# default because it is plain matmul + softmax with no shape-dependent kernel choice and it
# is the only one that can return attention maps; pass "sdpa" for real models on GPU.
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")

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


_SPEC_KEYS = {
    "tiny": {"source", "tiny"},
    "pretrained": {"source", "name_or_path", "dtype", "trust_remote_code", "attn_implementation"},
}
_TINY_KWARGS = set(inspect.signature(build_tiny_qwen2).parameters) - {"tokenizer"}


def load_policy(
    spec: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Build or load the policy model and its tokenizer from a ``params:`` dict.

    ``spec`` is one of::

        {"source": "tiny", "tiny": {...build_tiny_qwen2 kwargs...}}   # needs tokenizer=
        {"source": "pretrained",
         "name_or_path": "Qwen/Qwen2.5-0.5B-Instruct",   # hub id or local directory
         "dtype": "float32",                             # or "bfloat16", "float16", "auto"
         "trust_remote_code": False,
         "attn_implementation": "sdpa"}                  # optional

    Args:
        spec: the configuration above; validated before anything is built or loaded.
        tokenizer: required for ``tiny`` (the model's vocabulary is sized from it). For
            ``pretrained`` it replaces the checkpoint's own tokenizer, e.g. one versioned
            separately in the catalog; it must fit the model's embedding table.

    Returns:
        ``(model, tokenizer)``, the model in eval mode and the tokenizer padding on the left.

    Raises:
        ValueError: an invalid spec, with what to set in ``parameters_*.yml``.
        OSError: a pretrained checkpoint that is neither a local directory nor cached while
            offline (``HF_HUB_OFFLINE=1``).
    """
    source = spec.get("source")
    if source not in _SPEC_KEYS:
        raise ValueError(f"unknown policy source {source!r}; valid: {sorted(_SPEC_KEYS)}")
    unknown = set(spec) - _SPEC_KEYS[source]
    if unknown:
        raise ValueError(
            f"unknown keys {sorted(unknown)} for policy source {source!r}; "
            f"valid: {sorted(_SPEC_KEYS[source])}"
        )
    if source == "tiny":
        return _build_tiny(spec.get("tiny") or {}, tokenizer)
    return _load_pretrained(spec, tokenizer)


def _build_tiny(
    kwargs: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    unknown = set(kwargs) - _TINY_KWARGS
    if unknown:
        raise ValueError(
            f"unknown keys {sorted(unknown)} under 'tiny'; valid: {sorted(_TINY_KWARGS)}"
        )
    if tokenizer is None:
        raise ValueError(
            "policy source 'tiny' sizes its vocabulary from a tokenizer: pass "
            "load_policy(spec, tokenizer=...) (e.g. one from train_bpe_tokenizer)"
        )
    return build_tiny_qwen2(tokenizer, **kwargs), tokenizer


def pretrained_model_kwargs(spec: Mapping[str, Any], example_id: str) -> tuple[str, dict[str, Any]]:
    """Validate a ``{"source": "pretrained", ...}`` spec; returns ``(name_or_path, kwargs of
    from_pretrained)``. Shared by text and vision-language policies; ``example_id`` only
    appears in the error message for a missing ``name_or_path``."""
    name_or_path = spec.get("name_or_path")
    if not name_or_path:
        raise ValueError(
            "policy source 'pretrained' needs 'name_or_path': set it in parameters to a "
            f"Hugging Face id (e.g. '{example_id}') or a local checkpoint directory"
        )
    dtype_name = spec.get("dtype", "auto")
    if dtype_name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype_name!r}; valid: {list(DTYPES)}")
    attn = spec.get("attn_implementation")
    if attn is not None and attn not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"unknown attn_implementation {attn!r}; valid: {list(ATTN_IMPLEMENTATIONS)}"
        )
    trust_remote_code = spec.get("trust_remote_code", False)
    if not isinstance(trust_remote_code, bool):
        # A YAML string such as "false" would be truthy and silently run hub code.
        raise ValueError(f"trust_remote_code must be true or false, got {trust_remote_code!r}")
    model_kwargs: dict[str, Any] = {
        "dtype": DTYPES[dtype_name],
        "trust_remote_code": trust_remote_code,
    }
    if attn is not None:
        model_kwargs["attn_implementation"] = attn
    return os.fspath(name_or_path), model_kwargs


def _load_pretrained(
    spec: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    name_or_path, model_kwargs = pretrained_model_kwargs(spec, "Qwen/Qwen2.5-0.5B-Instruct")
    trust_remote_code = model_kwargs["trust_remote_code"]
    with _explain_missing_checkpoint(name_or_path):
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **model_kwargs)
        if tokenizer is None:
            tokenizer = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)

    # Rollouts generate a batch of prompts; right padding would put pad tokens between a
    # prompt and its completion.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        logger.warning("tokenizer of %s has no pad token; padding with eos", name_or_path)
        tokenizer.pad_token = tokenizer.eos_token
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens but {name_or_path} embeds only "
            f"{model.get_input_embeddings().num_embeddings}; pass the checkpoint's own tokenizer"
        )
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


@contextmanager
def _explain_missing_checkpoint(name_or_path: str) -> Iterator[None]:
    """Re-raise transformers' OSError for a missing checkpoint with what to do about it."""
    try:
        yield
    except OSError as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes", "on"}
        where = " and is not in the Hugging Face cache (HF_HUB_OFFLINE=1)" if offline else ""
        raise OSError(
            f"could not load the policy checkpoint {name_or_path!r}: it is not a local "
            f"directory with config.json and weights{where}. Download it first "
            f"(`hf download {name_or_path}` on a machine with network access) or set "
            "'name_or_path' in parameters to a local checkpoint directory. "
            f"Original error: {exc}"
        ) from exc
