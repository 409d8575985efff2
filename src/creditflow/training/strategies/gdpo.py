"""GDPO (docs/methods/gdpo.md): each named reward normalised within its group before the
weighted sum, then the sum normalised over the batch; one advantage per completion on every
token. The rival of TAPO's segment-wise z-scores where several rewards train one policy."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from creditflow.algorithms import decoupled_group_advantages
from creditflow.config.grpo import GRPOConfig
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.strategies.base import (
    AdvantageStrategy,
    Metrics,
    Spec,
    StrategyOptions,
    parse_options,
)


class GDPOOptions(StrategyOptions):
    """The options of ``gdpo``."""

    batch_scale: bool = Field(
        True,
        description="z-score the weighted sum of the per-reward group z-scores over the batch "
        "(the paper's and TRL's normalize_then_sum); false keeps the sum as it is",
    )


def gdpo_options(spec: Spec) -> GDPOOptions:
    return parse_options(spec, GDPOOptions, "advantage")


def gdpo_advantages(
    spec: Spec,
    rewards: dict[str, torch.Tensor],
    batch: RolloutBatch,
    policy: Any,
    config: GRPOConfig,
) -> tuple[torch.Tensor, Metrics]:
    """GDPO's advantage of each completion on its every token. -> (B, T)"""
    names = list(config.rewards)
    stacked = torch.stack([rewards[name].float() for name in names], dim=1)  # (B, K)
    weights = torch.tensor([config.rewards[name] for name in names])  # (K,)
    adv = decoupled_group_advantages(
        stacked, weights, batch.group_size, batch_scale=gdpo_options(spec).batch_scale
    )  # (B,)
    token_adv = adv.to(batch.completion_mask.device)[:, None] * batch.completion_mask  # (B, T)
    return token_adv, {"adv/abs_mean": adv.abs().mean().item()}


def validate_gdpo(spec: Spec, config: GRPOConfig) -> None:
    gdpo_options(spec)


GDPO = AdvantageStrategy(
    gdpo_advantages,
    validate_gdpo,
    batch_statistics=lambda spec: gdpo_options(spec).batch_scale,
)
