"""HICRA (docs/methods/hicra.md): GRPO's advantages, amplified on the tokens that plan a
solution (``algorithms.hicra_advantages``): high-entropy tokens of the correct, longer
completions, and the tokens of any "strategic gram" the spec lists."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from creditflow.algorithms import hicra_advantages, strategic_gram_mask
from creditflow.config.grpo import GRPOConfig
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.strategies.base import (
    AdvantageStrategy,
    GroupScaleOptions,
    Metrics,
    Spec,
    parse_options,
)
from creditflow.training.strategies.grpo import completion_advantages


class HICRAOptions(GroupScaleOptions):
    """The options of ``hicra`` (with GRPO's ``scale_by_std`` for the advantages it
    amplifies)."""

    alpha: float = Field(0.2, ge=0, description="the amplification: A <- A (1 + alpha sign A)")
    entropy_top: float = Field(
        0.3,
        gt=0,
        le=1,
        description="a token is high-entropy above the value at this top share of its "
        "completion's entropies (the authors' top-k threshold, 0.3)",
    )
    longer_only: bool = Field(
        True,
        description="amplify high-entropy tokens only in the correct completions longer than "
        "their group's mean (the authors' code); false: in every correct completion (a world "
        "of fixed-length completions has none longer)",
    )
    strategic_grams: list[str] | None = Field(
        None,
        description="phrases that mark planning (e.g. 'First, I need to'), encoded with the "
        "policy's tokenizer; their tokens are amplified in every completion of a group with a "
        "correct one. null: high-entropy tokens only",
    )


def hicra_options(spec: Spec) -> HICRAOptions:
    return parse_options(spec, HICRAOptions, "advantage")


def hicra_token_advantages(
    spec: Spec,
    rewards: dict[str, torch.Tensor],
    batch: RolloutBatch,
    policy: Any,
    config: GRPOConfig,
) -> tuple[torch.Tensor, Metrics]:
    """GRPO's advantage of each completion on its tokens, amplified by HICRA. -> (B, T)"""
    options = hicra_options(spec)
    if batch.entropy is None:
        raise ValueError("hicra reads the rollout's entropy: sample with with_entropy=True")
    mask = batch.completion_mask
    adv = completion_advantages(spec, rewards, batch, config)  # (B,)
    token_adv = adv.to(mask.device)[:, None] * mask  # (B, T)
    planning = None
    if options.strategic_grams:
        grams = [
            policy.tokenizer.encode(gram, add_special_tokens=False)
            for gram in options.strategic_grams
        ]
        planning = strategic_gram_mask(batch.completion_ids, grams) & mask.bool()
    amplified_adv, amplified = hicra_advantages(
        token_adv,
        batch.entropy.to(mask.device),
        mask,
        batch.group_size,
        alpha=options.alpha,
        entropy_top=options.entropy_top,
        planning=planning,
        longer_only=options.longer_only,
    )
    valid = mask.sum().clamp(min=1)
    return amplified_adv, {
        "adv/abs_mean": adv.abs().mean().item(),
        "adv/hicra_amplified": float(amplified.sum() / valid),
    }


def validate_hicra(spec: Spec, config: GRPOConfig) -> None:
    hicra_options(spec)


HICRA = AdvantageStrategy(hicra_token_advantages, validate_hicra, needs_entropy=lambda spec: True)
