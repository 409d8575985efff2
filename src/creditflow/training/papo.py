"""PAPO's implicit perception loss in the GRPO loop (docs/methods/papo.md;
``algorithms.papo``): the update's forward is repeated with part of each prompt's picture
hidden, and the divergence between the two is rewarded. The loop calls ``masked_logprobs``
beside its own forward and ``with_perception`` after ``policy_loss``; both do nothing when
``GRPOConfig.perception`` is off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from creditflow.algorithms.papo import masked_pixels, perception_loss
from creditflow.config.grpo import GRPOConfig
from creditflow.rollout.batch import RolloutBatch


def masked_logprobs(policy: Any, batch: RolloutBatch, config: GRPOConfig) -> torch.Tensor | None:
    """(b, T) the completion's log-probs (with grad) under the same prompts with each pixel
    value zeroed with probability ``perception.mask_ratio`` (torch's global stream, which the
    loop seeds every step), or None when the perception loss is off."""
    spec = config.perception_loss()
    if spec is None:
        return None
    pixels = batch.extras["pixel_values"]
    masked = replace(
        batch, extras={**batch.extras, "pixel_values": masked_pixels(pixels, spec.mask_ratio)}
    )
    logp, _ = policy.completion_logprobs(masked)
    return logp


def with_perception(
    loss: torch.Tensor,
    metrics: dict[str, float],
    logp: torch.Tensor,
    masked_logp: torch.Tensor | None,
    batch: RolloutBatch,
    config: GRPOConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``loss`` and ``metrics`` with the perception term added (unchanged when it is off)."""
    spec = config.perception_loss()
    if spec is None or masked_logp is None:
        return loss, metrics
    term, found = perception_loss(logp, masked_logp, batch.completion_mask, spec.weight, spec.clip)
    return loss + term, {**metrics, **found}
