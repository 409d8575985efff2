"""Credit-assignment strategies, chosen by name from two small tables.

Advantage strategies turn per-completion rewards into (B, T) token advantages; token-weight
strategies give the (B, T) weights ``w`` of the loss (SPEC section 0). Adding a method means
adding a row here, not a branch in the training loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from creditflow.algorithms import (
    group_zscore,
    segment_token_advantages,
    sign_conflict_rate,
    tapo_advantages,
)
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.config import ConfigError, GRPOConfig
from creditflow.training.segments import REASONING, translation_segment_ids
from creditflow.training.tor import TOR_PRESETS, tor_weights, validate_tor

Metrics = dict[str, float]


@dataclass(frozen=True)
class Strategy:
    """A named strategy: ``compute`` does the work, ``validate`` checks its options up front,
    ``reward_names`` lists the rewards it reads beyond ``config.rewards`` (checked against the
    computed ones before training)."""

    compute: Callable[..., tuple[torch.Tensor, Metrics]]
    validate: Callable[[dict[str, Any], GRPOConfig], None]
    reward_names: Callable[[dict[str, Any]], set[str]] = lambda spec: set()
    # What the rollout must compute for this strategy (each costs a pass over (B, T, V) logits).
    needs_entropy: bool = False
    needs_rollout_logprobs: bool = False


def _reject_unknown_options(spec: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(spec) - allowed)
    if extra:
        options = sorted(allowed - {"name"}) or "no options"
        raise ConfigError(f"strategy {spec['name']!r} takes {options}, got unknown {extra}")


def _no_options(spec: dict[str, Any], config: GRPOConfig) -> None:
    _reject_unknown_options(spec, {"name"})


def weighted_reward(rewards: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """(B,) sum of weight * reward over the configured rewards."""
    return sum(weight * rewards[name] for name, weight in weights.items())


# ---------------------------------------------------------------- advantages
def grpo_advantages(
    spec: dict[str, Any],
    rewards: dict[str, torch.Tensor],
    batch: RolloutBatch,
    policy: Any,
    config: GRPOConfig,
) -> tuple[torch.Tensor, Metrics]:
    """Trajectory-level GRPO: zscore of the weighted reward sum on every token (centred only
    with ``scale_by_std: false``). -> (B, T)"""
    total = weighted_reward(rewards, config.rewards)  # (B,)
    adv = group_zscore(total, batch.group_size, scale_by_std=spec.get("scale_by_std", True))
    token_adv = adv.unsqueeze(1) * batch.completion_mask  # (B, T)
    return token_adv, {"adv/abs_mean": adv.abs().mean().item()}


def _check_scale_by_std(spec: dict[str, Any]) -> None:
    scale = spec.get("scale_by_std", True)
    if not isinstance(scale, bool):
        raise ConfigError(f"advantage.scale_by_std must be true or false, got {scale!r}")


def _validate_grpo(spec: dict[str, Any], config: GRPOConfig) -> None:
    _reject_unknown_options(spec, {"name", "scale_by_std"})
    _check_scale_by_std(spec)


def _validate_tapo(spec: dict[str, Any], config: GRPOConfig) -> None:
    allowed = {"name", "alpha", "translation_reward", "reasoning_reward", "scale_by_std"}
    _reject_unknown_options(spec, allowed)
    _check_scale_by_std(spec)
    alpha = spec.get("alpha", 0.5)
    if not 0.0 <= float(alpha) <= 1.0:
        raise ConfigError(f"advantage.alpha must be in [0, 1], got {alpha}")


def _tapo_reward_names(spec: dict[str, Any]) -> set[str]:
    return {
        spec.get("translation_reward", "translation"),
        spec.get("reasoning_reward", "reasoning"),
    }


def tapo_token_advantages(
    spec: dict[str, Any],
    rewards: dict[str, torch.Tensor],
    batch: RolloutBatch,
    policy: Any,
    config: GRPOConfig,
) -> tuple[torch.Tensor, Metrics]:
    """TAPO step-level advantages (SPEC section 1): translation tokens get
    alpha*A_trans + (1-alpha)*A_reason, reasoning tokens A_reason. -> (B, T)"""
    r_trans = rewards[spec.get("translation_reward", "translation")]  # (B,)
    r_reason = rewards[spec.get("reasoning_reward", "reasoning")]  # (B,)
    adv_trans, adv_reason = tapo_advantages(
        r_trans,
        r_reason,
        batch.group_size,
        float(spec.get("alpha", 0.5)),
        scale_by_std=spec.get("scale_by_std", True),
    )
    # Column order follows the segment ids: TRANSLATION = 0, REASONING = 1.
    segment_adv = torch.stack([adv_trans, adv_reason], dim=1)  # (B, 2)
    segment_ids = translation_segment_ids(
        batch.completion_ids, batch.completion_mask, batch.completion_texts, policy.tokenizer
    )  # (B, T)
    token_adv = segment_token_advantages(segment_adv, segment_ids)  # (B, T)
    reasoning_tokens = (segment_ids == REASONING).float().sum()
    return token_adv, {
        "adv/abs_mean": token_adv.abs().sum().item()
        / batch.completion_mask.sum().clamp(min=1).item(),
        "adv/reasoning_token_frac": (
            reasoning_tokens / batch.completion_mask.sum().clamp(min=1)
        ).item(),
    }


ADVANTAGE_STRATEGIES: dict[str, Strategy] = {
    "grpo": Strategy(grpo_advantages, _validate_grpo),
    "tapo": Strategy(tapo_token_advantages, _validate_tapo, _tapo_reward_names),
}


# ---------------------------------------------------------------- token weights
# A token-weight strategy is called as compute(spec, batch, policy, context). ``context`` holds
# "generator" (a torch.Generator seeded per step, identically on every process, for tie-breaking)
# and "accelerator" (None in a single process). With several processes ``batch`` is this
# process's share only: a strategy that needs batch-global statistics, such as ToR's top
# fraction of all valid tokens of the rollout batch (SPEC section 2), must gather its scores
# with context["accelerator"].gather(...) before choosing the threshold.
def uniform_weights(
    spec: dict[str, Any], batch: RolloutBatch, policy: Any, context: dict[str, Any]
) -> tuple[torch.Tensor, Metrics]:
    """Plain GRPO: every valid token weighs 1. -> (B, T)"""
    return batch.completion_mask.clone(), {}


TOKEN_WEIGHT_STRATEGIES: dict[str, Strategy] = {
    "uniform": Strategy(uniform_weights, _no_options),
    # ToR (SPEC section 2) and its ablations "tor_reasoning_only" (gamma_p = 0) and
    # "tor_perception_only" (gamma_r = 0); options and presets in training.tor.
    **{
        name: Strategy(tor_weights, validate_tor, needs_entropy=True, needs_rollout_logprobs=True)
        for name in TOR_PRESETS
    },
}


def sign_conflict_metric(
    rewards: dict[str, torch.Tensor], group_size: int, translation: str, reasoning: str
) -> Metrics:
    """``adv/sign_conflict_rate`` (SPEC section 1) when both TAPO rewards are present."""
    if translation not in rewards or reasoning not in rewards:
        return {}
    rate = sign_conflict_rate(rewards[translation], rewards[reasoning], group_size)
    return {"adv/sign_conflict_rate": float(rate)}
