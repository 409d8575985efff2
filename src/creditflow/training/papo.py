"""PAPO's implicit perception loss in the GRPO loop (docs/methods/papo.md;
``algorithms.papo``): the update's forward is repeated with part of each prompt's picture
hidden, and the divergence between the two is rewarded. The loop calls ``perception_term``
beside its own forward (inside the same DDP forward) and ``with_perception`` after
``policy_loss``; both do nothing when ``GRPOConfig.perception`` is off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from creditflow.algorithms.papo import masked_pixels, perception_loss
from creditflow.config.grpo import GRPOConfig
from creditflow.rollout.batch import RolloutBatch

Term = tuple[torch.Tensor, dict[str, float]]


def perception_term(
    policy: Any, batch: RolloutBatch, logp: torch.Tensor, config: GRPOConfig
) -> Term | None:
    """The perception loss of ``batch`` and its metrics, or None when it is off. ``logp``
    (b, T): the update's own log-probs; the masked ones come from the same prompts with each
    pixel value zeroed with probability ``perception.mask_ratio`` (torch's global stream,
    which the loop seeds every step), with grad."""
    spec = config.perception_loss()
    if spec is None:
        return None
    pixels = batch.extras["pixel_values"]
    masked = replace(
        batch, extras={**batch.extras, "pixel_values": masked_pixels(pixels, spec.mask_ratio)}
    )
    masked_logp, _ = policy.completion_logprobs(masked)
    return perception_loss(logp, masked_logp, batch.completion_mask, spec.weight, spec.clip)


def with_perception(
    loss: torch.Tensor, metrics: dict[str, float], term: Term | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """``loss`` and ``metrics`` with the perception ``term`` added (unchanged without one)."""
    if term is None:
        return loss, metrics
    return loss + term[0], {**metrics, **term[1]}
