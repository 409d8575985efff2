"""One loader for every policy: ``load_policy`` builds a tiny model or loads a checkpoint,
a causal language model or a vision-language one, from a ``params:`` dict.

What differs by kind is one row of ``POLICY_KINDS`` (the tiny configuration, its builder, the
``transformers`` auto class, how the checkpoint's processing class is loaded and where its
tokenizer is); the loading itself is one body. The kind is read from the processing class
passed (a processor with an image processor is vision-language, as TRL reads its
``processing_class``) or, for a checkpoint loaded without one, from its configuration (a
``vision_config``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    PreTrainedModel,
)

from creditflow.config.policy import TinyQwen2, TinyQwen2_5VL, checked_policy_spec
from creditflow.models.builders import (
    build_tiny_qwen2,
    explain_missing_checkpoint,
    from_pretrained_kwargs,
    prepare_policy,
    ready_for_rollouts,
    resolve_device,
)
from creditflow.models.tokenizer import load_tokenizer
from creditflow.models.vision import build_tiny_qwen2_5_vl, load_processor


@dataclass(frozen=True)
class PolicyKind:
    """What a kind of policy loads with. ``load_processing``: (name_or_path, model,
    trust_remote_code) -> the checkpoint's own processing class."""

    name: str
    tiny: type
    build_tiny: Callable[..., PreTrainedModel]
    auto_class: type
    load_processing: Callable[[str, PreTrainedModel, bool], Any]
    tokenizer_of: Callable[[Any], Any]
    own: str  # what the message asks to pass instead of a processing class that does not fit


POLICY_KINDS = {
    "text": PolicyKind(
        "text",
        TinyQwen2,
        build_tiny_qwen2,
        AutoModelForCausalLM,
        lambda name, model, trust: load_tokenizer(name, trust_remote_code=trust),
        lambda processing: processing,
        "tokenizer",
    ),
    "vision_language": PolicyKind(
        "vision_language",
        TinyQwen2_5VL,
        build_tiny_qwen2_5_vl,
        AutoModelForImageTextToText,
        load_processor,
        lambda processing: processing.tokenizer,
        "processor",
    ),
}


def policy_kind(spec: Mapping[str, Any], processing_class: Any = None) -> PolicyKind:
    """The kind of policy ``spec`` loads: vision-language when ``processing_class`` has an
    image processor, or (none given) when the checkpoint's configuration has a vision tower;
    a tiny spec without a processing class is text (and fails for want of one)."""
    if processing_class is not None:
        vision = getattr(processing_class, "image_processor", None) is not None
    elif spec.get("source") == "pretrained" and spec.get("name_or_path"):
        name_or_path = str(spec["name_or_path"])
        with explain_missing_checkpoint(name_or_path):
            config = AutoConfig.from_pretrained(
                name_or_path, trust_remote_code=bool(spec.get("trust_remote_code", False))
            )
        vision = getattr(config, "vision_config", None) is not None
    else:
        vision = False
    return POLICY_KINDS["vision_language" if vision else "text"]


def load_policy(
    spec: Mapping[str, Any], processing_class: Any = None
) -> tuple[PreTrainedModel, Any]:
    """Build or load the policy and its processing class from a ``params:`` dict.

    Args:
        spec: a ``config.policy.PolicySpec`` dict, validated before anything is built or
            loaded; ``tiny`` holds the tiny builder's kwargs (``build_tiny_qwen2`` or
            ``build_tiny_qwen2_5_vl``), ``pretrained`` names a checkpoint such as
            ``Qwen/Qwen2.5-0.5B-Instruct`` or ``Qwen/Qwen2.5-VL-3B-Instruct``.
        processing_class: a tokenizer or a processor. Required for ``tiny`` (the vocabulary,
            and a vision-language model's patching, come from it). For ``pretrained`` it
            replaces the checkpoint's own (e.g. one versioned in the catalog); its tokenizer
            must fit the model's embedding table. Without it the checkpoint's own is loaded
            (a Qwen2.5-VL processor as ``ImageOnlyQwen2_5_VLProcessor`` when torchvision is
            missing).

    Returns:
        ``(model, processing_class)``: the model in eval mode on the spec's device (a
        ``peft`` model with fresh adapters when the spec has ``lora``), the tokenizer padding
        on the left.

    Raises:
        ValueError: an invalid spec, with what to set in ``parameters_*.yml``.
        OSError: a pretrained checkpoint that is neither a local directory nor cached while
            offline (``HF_HUB_OFFLINE=1``).
    """
    kind = policy_kind(spec, processing_class)
    policy = checked_policy_spec(spec, kind.tiny, check_device=resolve_device)
    if policy.source == "tiny":
        if processing_class is None:
            raise ValueError(
                "policy source 'tiny' sizes its model from its processing class: pass "
                "load_policy(spec, processing_class=...), a tokenizer for a text policy (e.g. "
                "train_bpe_tokenizer(...)) or a processor for a vision-language one (e.g. "
                "build_tiny_processor(train_vl_tokenizer(...)))"
            )
        model = kind.build_tiny(processing_class, **policy.tiny)
        return prepare_policy(policy, model), processing_class
    name_or_path = policy.name_or_path
    with explain_missing_checkpoint(name_or_path):
        model = kind.auto_class.from_pretrained(name_or_path, **from_pretrained_kwargs(policy))
        if processing_class is None:
            processing_class = kind.load_processing(name_or_path, model, policy.trust_remote_code)
    model = ready_for_rollouts(
        model, kind.tokenizer_of(processing_class), name_or_path, own=kind.own
    )
    return prepare_policy(policy, model), processing_class
