"""Plain GRPO (docs/methods/grpo.md): one group-normalised advantage per completion on every token,
and uniform token weights."""

from __future__ import annotations

from typing import Any

import torch

from creditflow.algorithms import group_zscore
from creditflow.config.grpo import GRPOConfig
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.strategies.base import (
    AdvantageStrategy,
    GroupScaleOptions,
    Metrics,
    Spec,
    TokenWeightStrategy,
    WeightContext,
    no_options,
    parse_options,
    spec_scale_by_std,
    weighted_reward,
)


def grpo_advantages(
    spec: Spec,
    rewards: dict[str, torch.Tensor],
    batch: RolloutBatch,
    policy: Any,
    config: GRPOConfig,
) -> tuple[torch.Tensor, Metrics]:
    """Trajectory-level GRPO: zscore of the weighted reward sum on every token (centred only
    with ``scale_by_std: false``). -> (B, T)"""
    adv = completion_advantages(spec, rewards, batch, config)  # (B,)
    token_adv = adv.unsqueeze(1) * batch.completion_mask  # (B, T)
    return token_adv, {"adv/abs_mean": adv.abs().mean().item()}


def completion_advantages(
    spec: Spec, rewards: dict[str, torch.Tensor], batch: RolloutBatch, config: GRPOConfig
) -> torch.Tensor:
    """GRPO's advantage of each completion: the group zscore of the weighted reward sum
    (centred only with ``scale_by_std: false``). -> (B,)"""
    total = weighted_reward(rewards, config.rewards)  # (B,)
    return group_zscore(total, batch.group_size, scale_by_std=spec_scale_by_std(spec))


def validate_grpo(spec: Spec, config: GRPOConfig) -> None:
    parse_options(spec, GroupScaleOptions, "advantage")


def uniform_weights(
    spec: Spec, batch: RolloutBatch, policy: Any, context: WeightContext
) -> tuple[torch.Tensor, Metrics]:
    """Plain GRPO: every valid token weighs 1. -> (B, T)"""
    return batch.completion_mask.clone(), {}


GRPO = AdvantageStrategy(grpo_advantages, validate_grpo)
UNIFORM = TokenWeightStrategy(uniform_weights, no_options)
