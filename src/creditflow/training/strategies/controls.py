"""Control strategies (docs/methods/controls.md): what a credit-assignment result must beat.

- ``shuffled_advantages`` (advantage): GRPO's advantages, each group's moved to another group
  (``algorithms.shuffle_group_advantages``). A completion's credit is then unrelated to its own
  reward, so a policy trained on it should not improve: the testbed's positive control (if it
  cannot tell GRPO from this, it cannot tell anything).
- ``random_tokens`` (token weights): weight 1 on ``k = ceil(fraction * n_valid)`` valid tokens of
  the rollout batch drawn uniformly at random without replacement (every process's rows
  together, as ToR selects), 0 elsewhere. ``fraction`` defaults to 0.46, the share of tokens
  ToR selects at its paper defaults on the synthetic tor testbed (it leaves 54 % unselected;
  docs/results.md), so the control keeps ToR's token budget and drops its choice of tokens.
- ``high_entropy_20`` / ``low_entropy_80`` (token weights): weight 1 on the 20 % highest- or the
  80 % lowest-entropy valid tokens of the rollout batch, 0 elsewhere: the "high-entropy
  minority tokens" study (Wang et al. 2025, "Beyond the 80/20 rule"), which found the top 20 %
  learn as well as all tokens and the bottom 80 % clearly worse. The entropy is the rollout's
  top-p entropy at ``entropy_top_p`` (1.0: the whole distribution's, as the study uses).

Shape symbols: ``B`` sequences (this process's share under DDP), ``G`` group size, ``T``
completion tokens. Masks are 1 where a token counts.
"""

from __future__ import annotations

from typing import Any

import torch

from creditflow.algorithms import masked_mean, shuffle_group_advantages
from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.strategies.base import (
    AdvantageStrategy,
    Metrics,
    Spec,
    TokenWeightStrategy,
    WeightContext,
    check_scale_by_std,
    no_options,
    reject_unknown_options,
)
from creditflow.training.strategies.grpo import completion_advantages
from creditflow.training.strategies.tor import batch_top_fraction_mask

# ToR's selected share at its paper defaults on the synthetic tor testbed (docs/results.md).
RANDOM_TOKENS_FRACTION = 0.46
# (which end of the entropy order, share of the valid tokens) of each entropy-selection preset.
ENTROPY_PRESETS: dict[str, tuple[str, float]] = {
    "high_entropy_20": ("top", 0.2),
    "low_entropy_80": ("bottom", 0.8),
}


# ---------------------------------------------------------------- shuffled advantages
def shuffled_advantages(
    spec: Spec,
    rewards: dict[str, torch.Tensor],
    batch: RolloutBatch,
    policy: Any,
    config: GRPOConfig,
) -> tuple[torch.Tensor, Metrics]:
    """GRPO's per-completion advantages (zscore of the weighted reward sum), each group's given
    to another group, on every valid token. -> (B, T)

    The group order is drawn from torch's global generator, which the trainer seeds at the
    start of every step (``grpo.step_seed``), so a run draws the same shuffles each time.
    """
    adv = completion_advantages(spec, rewards, batch, config)  # (B,)
    shuffled = shuffle_group_advantages(adv, batch.group_size)  # (B,)
    token_adv = shuffled.unsqueeze(1) * batch.completion_mask  # (B, T)
    # How much of the credit still points the right way: the correlation of the shuffled
    # advantages with the completions' own (0 in expectation).
    own = torch.corrcoef(torch.stack([adv, shuffled]))[0, 1] if adv.std() > 0 else adv.new_zeros(())
    return token_adv, {
        "adv/abs_mean": shuffled.abs().mean().item(),
        "control/own_advantage_corr": float(torch.nan_to_num(own)),
    }


def validate_shuffled(spec: Spec, config: GRPOConfig) -> None:
    reject_unknown_options(spec, {"name", "scale_by_std"})
    check_scale_by_std(spec)
    if config.prompts_per_step < 2:
        raise ConfigError(
            f"advantage 'shuffled_advantages' moves advantages between groups and needs "
            f"prompts_per_step >= 2 (per process), got {config.prompts_per_step}"
        )


# ---------------------------------------------------------------- random tokens
def random_fraction(spec: Spec) -> float:
    return spec.get("fraction", RANDOM_TOKENS_FRACTION)


def random_token_weights(
    spec: Spec, batch: RolloutBatch, policy: Any, context: WeightContext
) -> tuple[torch.Tensor, Metrics]:
    """1 on ``ceil(fraction * n_valid)`` valid tokens of the whole rollout batch chosen uniformly
    at random, 0 elsewhere. -> (B, T)

    Every valid token scores the same, so ``batch_top_fraction_mask`` picks exactly its ``k``
    tokens by its random tie-breaking keys alone (drawn from the step's seeded generator over
    the batch of every process).
    """
    mask = batch.completion_mask
    selected = batch_top_fraction_mask(
        torch.zeros_like(mask, dtype=torch.float32),
        mask,
        float(random_fraction(spec)),
        context.generator,
        context.accelerator,
    )  # (B, T) bool
    n_valid = mask.sum().clamp(min=1)
    return selected.to(mask.dtype), {"control/selected_frac": (selected.sum() / n_valid).item()}


def validate_random(spec: Spec, config: GRPOConfig) -> None:
    reject_unknown_options(spec, {"name", "fraction"})
    fraction = random_fraction(spec)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ConfigError(f"token_weights.fraction must be a number in [0, 1], got {fraction!r}")
    if not 0.0 <= float(fraction) <= 1.0:
        raise ConfigError(f"token_weights.fraction must be in [0, 1], got {fraction}")


# ---------------------------------------------------------------- entropy selection
def entropy_fraction_weights(
    spec: Spec, batch: RolloutBatch, policy: Any, context: WeightContext
) -> tuple[torch.Tensor, Metrics]:
    """1 on the top (``high_entropy_20``) or bottom (``low_entropy_80``) share of the valid
    tokens of the whole rollout batch by the rollout's top-p entropy, 0 elsewhere; exactly
    ``ceil(fraction * n_valid)`` tokens, ties broken at random. -> (B, T)"""
    if batch.entropy is None:
        raise ValueError(
            f"{spec['name']} needs the rollout's per-token entropy: sample with with_entropy=True"
        )
    end, fraction = ENTROPY_PRESETS[spec["name"]]
    entropy = batch.entropy.float()  # (B, T)
    scores = entropy if end == "top" else -entropy
    mask = batch.completion_mask
    selected = batch_top_fraction_mask(
        scores, mask, fraction, context.generator, context.accelerator
    )  # (B, T) bool
    unselected = mask.bool() & ~selected
    return selected.to(mask.dtype), {
        "entropy/selected_frac": (selected.sum() / mask.sum().clamp(min=1)).item(),
        "entropy/entropy_selected": float(masked_mean(entropy, selected)),
        "entropy/entropy_unselected": float(masked_mean(entropy, unselected)),
    }


SHUFFLED_ADVANTAGES = AdvantageStrategy(shuffled_advantages, validate_shuffled)
CONTROL_TOKEN_WEIGHTS: dict[str, TokenWeightStrategy] = {
    "random_tokens": TokenWeightStrategy(random_token_weights, validate_random),
    **{
        name: TokenWeightStrategy(entropy_fraction_weights, no_options, needs_entropy=True)
        for name in ENTROPY_PRESETS
    },
}
