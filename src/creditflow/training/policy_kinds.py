"""The two kinds of language policy the entries train and evaluate: a text model with its
tokenizer, and a vision-language model with its processor.

The kind is read once, from the processing class a caller passes (``policy_kind``: a processor
with an image processor is vision-language, anything else a tokenizer), as TRL reads its
``processing_class``. GRPO (``grpo_runs.run_grpo``), the SFT warm start (``sft.run_sft``) and
evaluation (``evaluation.evaluate_problems``) then ask the kind what differs and never branch
on it: how prompts are prepared and keyed for a checkpoint, which policy samples and scores
them, and how a (prompt, target) pair becomes a supervised batch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from creditflow.algorithms import masked_mean
from creditflow.config.supervised import SFTConfig
from creditflow.rollout import (
    LanguagePolicy,
    SamplingSettings,
    VisionLanguagePolicy,
    as_visual_prompt,
)
from creditflow.rollout.backends import FALLBACK_BACKEND, rollout_backend
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.checkpoint import content_digest, tokenizer_digest
from creditflow.training.supervised import BatchFn, LossFn
from creditflow.training.teacher_forcing import (
    build_sft_examples,
    collate_right_padded,
    completion_nll,
    target_batch,
)

logger = logging.getLogger(__name__)


class TextKind:
    """A causal LM and its tokenizer; prompts are texts or chat conversations."""

    name = "text"
    data_parallel = True  # training.launch spawns workers with the model and tokenizer

    def prompts(self, prompts: Sequence[Any]) -> list[Any]:
        """``prompts`` as the policy reads them."""
        return list(prompts)

    def prompt_keys(self, prompts: Sequence[Any]) -> list[Any]:
        """What identifies each prepared prompt in a checkpoint key."""
        return list(prompts)

    def processing_keys(self, tokenizer: Any) -> list[Any]:
        """What identifies the processing class in a checkpoint key."""
        return [tokenizer_digest(tokenizer)]

    def policy(
        self,
        model: Any,
        tokenizer: Any,
        sampling: SamplingSettings,
        rollout: Mapping[str, Any],
        cache_bytes: Mapping[str, int] | None = None,
    ) -> LanguagePolicy:
        """The policy sampling with the backend ``rollout`` names (``hf`` when that backend
        does not support the model, with a log line). A text policy keeps no caches, so
        ``cache_bytes`` must be empty."""
        if cache_bytes:
            raise ValueError(
                f"cache budgets {sorted(cache_bytes)} belong to a vision-language policy; a "
                "text policy keeps no prompt or picture cache"
            )
        return LanguagePolicy(model, tokenizer, sampling, backend=rollout_backend(rollout, model))

    def supervised(
        self,
        model: Any,
        tokenizer: Any,
        prompts: Sequence[Any],
        targets: Sequence[str],
        config: SFTConfig,
        use_chat_template: bool = True,
        cache_bytes: Mapping[str, int] | None = None,
    ) -> tuple[BatchFn, LossFn]:
        """``batch_fn`` and ``loss_fn`` of ``training.supervised.SupervisedTrainer`` for the
        pairs: right-padded prompt + target sequences, mean NLL of the target tokens (EOS
        included) under the model's plain forward."""
        del cache_bytes  # no cache to budget
        examples = build_sft_examples(
            tokenizer, prompts, targets, config.max_length, use_chat_template
        )
        device = next(model.parameters()).device

        def batch_fn(rows: list[int]) -> dict[str, torch.Tensor]:
            batch = collate_right_padded([examples[i] for i in rows], tokenizer.pad_token_id)
            return {k: v.to(device) for k, v in batch.items()}

        def loss_fn(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
            loss = completion_nll(model, batch)
            return loss, {"sft/loss": loss.item()}

        return batch_fn, loss_fn


class VisionLanguageKind:
    """A Qwen2.5-VL-style model and its processor; prompts are (image, text) pairs, anything
    ``rollout.as_visual_prompt`` accepts."""

    name = "vision-language"
    # Not yet run data-parallel: its policy's caches and the ViT's frozen features are kept
    # per process, and no test has trained one in several processes.
    data_parallel = False

    def prompts(self, prompts: Sequence[Any]) -> list[Any]:
        """Every image decoded once, as ``VisualPrompt``s."""
        return [as_visual_prompt(p) for p in prompts]

    def prompt_keys(self, prompts: Sequence[Any]) -> list[Any]:
        """Each prompt's text and the digest of its pixels."""
        return [[p.text, content_digest(p.image.tobytes())] for p in prompts]

    def processing_keys(self, processor: Any) -> list[Any]:
        """The tokenizer's digest and the image processor's settings: image size and patching
        decide the pixels the model sees."""
        return [tokenizer_digest(processor.tokenizer), processor.image_processor.to_dict()]

    def policy(
        self,
        model: Any,
        processor: Any,
        sampling: SamplingSettings,
        rollout: Mapping[str, Any],
        cache_bytes: Mapping[str, int] | None = None,
    ) -> VisionLanguagePolicy:
        """The policy sampling with ``lean`` (Qwen2.5-VL) or ``hf`` as ``rollout`` names; a
        text-only backend (vLLM), or ``lean`` on a model it does not support, falls back to
        ``hf`` with a log line. ``cache_bytes``: ``prompt_cache_bytes`` /
        ``vision_cache_bytes`` of ``VisionLanguagePolicy`` (they change no result)."""
        name = rollout.get("name", FALLBACK_BACKEND)
        if name not in (FALLBACK_BACKEND, "lean"):
            logger.info(
                "rollout backend %r is text-only: the vision-language policy samples with %r",
                name,
                FALLBACK_BACKEND,
            )
            name = FALLBACK_BACKEND
        backend = rollout_backend({**rollout, "name": name}, model)
        return VisionLanguagePolicy(
            model, processor, sampling, backend=backend, **(cache_bytes or {})
        )

    def supervised(
        self,
        model: Any,
        processor: Any,
        prompts: Sequence[Any],
        targets: Sequence[str],
        config: SFTConfig,
        use_chat_template: bool = True,
        cache_bytes: Mapping[str, int] | None = None,
    ) -> tuple[BatchFn, LossFn]:
        """``batch_fn`` and ``loss_fn`` for (image prompt, target) pairs: mean NLL of the target
        tokens (EOS included) given the image and the prompt, through the policy's scoring
        forward at temperature 1. Examples longer than ``config.max_length`` tokens (image
        prompt + target) lose the end of their target. The processor's chat template always
        applies (``use_chat_template`` is a text policy's choice)."""
        del use_chat_template
        # The plain forward: SFT rows never share a prompt, so the shared-prefix path (a
        # group's prompt encoded once, its completions run on that cache) has nothing to share
        # and would only split each row's forward in two.
        policy = VisionLanguagePolicy(
            model, processor, SamplingSettings(shared_prefix=False), **(cache_bytes or {})
        )
        eos = policy.tokenizer.eos_token_id
        target_ids = [
            policy.tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in targets
        ]

        def batch_fn(rows: list[int]) -> RolloutBatch:
            return target_batch(
                policy, [prompts[i] for i in rows], [target_ids[i] for i in rows], config.max_length
            )

        def loss_fn(batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
            logp, _ = policy.completion_logprobs(batch)  # (b, T)
            loss = -masked_mean(logp, batch.completion_mask)
            return loss, {"sft/loss": loss.item()}

        return batch_fn, loss_fn


PolicyKind = TextKind | VisionLanguageKind
TEXT = TextKind()
VISION_LANGUAGE = VisionLanguageKind()


def policy_kind(processing: Any) -> PolicyKind:
    """The kind of policy ``processing`` (a tokenizer, or a processor with an image processor)
    belongs to."""
    return VISION_LANGUAGE if hasattr(processing, "image_processor") else TEXT


def build_policy(
    model: Any,
    processing: Any,
    sampling: SamplingSettings,
    rollout: Mapping[str, Any],
    cache_bytes: Mapping[str, int] | None = None,
) -> LanguagePolicy | VisionLanguagePolicy:
    """The policy of ``model`` with its tokenizer or processor ``processing``, sampling with
    the backend ``rollout`` names (``policy_kind(processing).policy``)."""
    return policy_kind(processing).policy(model, processing, sampling, rollout, cache_bytes)
