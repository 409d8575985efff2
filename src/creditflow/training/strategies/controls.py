"""Control strategies (docs/methods/controls.md): what a credit-assignment result must beat.

- ``shuffled_advantages`` (advantage): GRPO's advantages, each group's moved to another group
  (``algorithms.shuffle_group_advantages``). A completion's credit is then unrelated to its own
  reward, so a policy trained on it should not improve: the testbed's positive control (if it
  cannot tell GRPO from this, it cannot tell anything).
- ``random_tokens`` (token weights): weight 1 on valid tokens drawn uniformly at random, 0
  elsewhere: by default, in each completion as many as ToR (``tor`` at its paper defaults)
  selects in it on the same batch, so the control keeps ToR's token budget, spread over the
  completions as ToR spreads it, and drops its choice of tokens. It computes ToR's selection
  to count it, so it needs what ToR needs (a vision-language policy's no-image pass). With
  ``fraction`` (for a policy without that pass, e.g. a text-only one): ``k = ceil(fraction *
  n_valid)`` tokens of the rollout batch (every process's rows together).
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
from pydantic import Field, field_validator

from creditflow.algorithms import masked_mean, shuffle_group_advantages
from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.strategies.base import (
    AdvantageStrategy,
    GroupScaleOptions,
    Metrics,
    Spec,
    StrategyOptions,
    TokenWeightStrategy,
    WeightContext,
    no_options,
    parse_options,
)
from creditflow.training.strategies.grpo import completion_advantages
from creditflow.training.strategies.tor import (
    batch_top_fraction_mask,
    tor_weights,
    uniform_draw_over_processes,
)

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
    parse_options(spec, GroupScaleOptions, "advantage")
    if config.prompts_per_step < 2:
        raise ConfigError(
            f"advantage 'shuffled_advantages' moves advantages between groups and needs "
            f"prompts_per_step >= 2 (per process), got {config.prompts_per_step}"
        )


# ---------------------------------------------------------------- random tokens
# The ToR whose selection random_tokens matches by default: ``tor`` at its paper defaults.
TOR_SPEC: Spec = {"name": "tor"}
RANDOM_TOKENS_FALLBACK = (
    "give token_weights.fraction to draw a fixed share of the valid tokens instead (0.46 is "
    "ToR's share at its paper defaults on the synthetic tor testbed)"
)


def random_token_weights(
    spec: Spec, batch: RolloutBatch, policy: Any, context: WeightContext
) -> tuple[torch.Tensor, Metrics]:
    """1 on valid tokens chosen uniformly at random, 0 elsewhere. -> (B, T)

    Without ``fraction`` (the default): in every completion, as many tokens as ToR (``tor``
    at its paper defaults, ``tor.tor_weights``) weighs non-zero in it on this same batch, so it
    needs what ToR needs (the rollout's entropy and log-probs, ``policy.no_image_logprobs``).
    With ``fraction``: ``ceil(fraction * n_valid)`` tokens of the whole rollout batch (every
    process's rows). Both draw from the step's seeded generator (``context.generator``).
    """
    if "fraction" in spec:
        return _fraction_weights(float(spec["fraction"]), batch, context)
    return _tor_count_weights(batch, policy, context)


def _tor_count_weights(
    batch: RolloutBatch, policy: Any, context: WeightContext
) -> tuple[torch.Tensor, Metrics]:
    """ToR's per-completion token count, spent on tokens drawn at random. -> (B, T)

    Per completion rather than ToR's batch total spread at random: ToR's global threshold
    gives long or uncertain completions more of the budget, and how a completion's share of
    the tokens sets its share of the loss is part of ToR's update, not of its choice of
    tokens. Matching each completion's count keeps that and changes only which tokens within
    it, so a gap to ToR measures the choice alone.
    """
    tor_w, tor_metrics = tor_weights(TOR_SPEC, batch, policy, context)  # (B, T)
    mask = batch.completion_mask
    valid = mask.detach().bool().cpu()  # (B, T)
    by_tor = (tor_w.detach() != 0).cpu() & valid  # (B, T)
    counts = by_tor.sum(1)  # (B,) tokens ToR weighs in each completion
    # Drawn after ToR's tie-breaking keys, from the same generator: seeded per step.
    draw, offset, _ = uniform_draw_over_processes(
        mask.numel(), context.generator, context.accelerator
    )
    keys = draw[offset : offset + mask.numel()].view(mask.shape)  # (B, T)
    selected = random_per_row(counts, valid, keys)  # (B, T) bool
    n_selected = int(selected.sum())
    return selected.to(mask.device, mask.dtype), {
        "control/selected_frac": n_selected / max(1, int(valid.sum())),
        # share of the drawn tokens that ToR chose too: about ToR's own share, not 1
        "control/tor_overlap_frac": int((selected & by_tor).sum()) / max(1, n_selected),
        "time/no_image_pass_s": tor_metrics["time/no_image_pass_s"],
    }


def random_per_row(counts: torch.Tensor, valid: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The ``counts[i]`` valid tokens of row ``i`` with the smallest ``keys``.

    Args:
        counts: ``(B,)`` tokens to select per row, each at most the row's valid tokens.
        valid: ``(B, T)`` bool, True where a token counts; padding is never selected.
        keys: ``(B, T)`` distinct random keys (uniform keys make the choice uniform).

    Returns:
        ``(B, T)`` bool with exactly ``counts[i]`` True in row ``i``, all on valid tokens.
    """
    keys = keys.masked_fill(~valid, float("inf"))  # padding sorts last in its row
    rank = keys.argsort(dim=1).argsort(dim=1)  # (B, T) place of each token in its row's order
    return valid & (rank < counts[:, None])


def _fraction_weights(
    fraction: float, batch: RolloutBatch, context: WeightContext
) -> tuple[torch.Tensor, Metrics]:
    """1 on ``ceil(fraction * n_valid)`` valid tokens of the whole rollout batch. -> (B, T)

    Every valid token scores the same, so ``batch_top_fraction_mask`` picks exactly its ``k``
    tokens by its random tie-breaking keys alone (drawn from the step's seeded generator over
    the batch of every process).
    """
    mask = batch.completion_mask
    selected = batch_top_fraction_mask(
        torch.zeros_like(mask, dtype=torch.float32),
        mask,
        fraction,
        context.generator,
        context.accelerator,
    )  # (B, T) bool
    n_valid = mask.sum().clamp(min=1)
    return selected.to(mask.dtype), {"control/selected_frac": (selected.sum() / n_valid).item()}


class RandomTokensOptions(StrategyOptions):
    fraction: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="share of the valid tokens drawn at random; unset: as many as ToR selects",
    )

    @field_validator("fraction", mode="before")
    @classmethod
    def _set_means_a_number(cls, value: Any) -> Any:
        # A written `fraction: null` is a typo more likely than a wish for ToR's count.
        if value is None:
            raise ValueError("fraction must be a number")
        return value


def validate_random(spec: Spec, config: GRPOConfig) -> None:
    parse_options(spec, RandomTokensOptions, "token_weights")


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


def _random_tokens_variant(spec: Spec) -> TokenWeightStrategy:
    """A fixed ``fraction`` needs nothing of the rollout or the policy; ToR's count needs
    ToR's signals."""
    return RANDOM_FRACTION if "fraction" in spec else RANDOM_TOKENS


SHUFFLED_ADVANTAGES = AdvantageStrategy(shuffled_advantages, validate_shuffled)
RANDOM_FRACTION = TokenWeightStrategy(random_token_weights, validate_random)
# The default (no fraction): the registered one, so whoever reads its flags without the spec
# asks the rollout for too much rather than too little.
RANDOM_TOKENS = TokenWeightStrategy(
    random_token_weights,
    validate_random,
    needs_entropy=True,
    needs_rollout_logprobs=True,
    needs_image_pass=True,
    image_pass_fallback=RANDOM_TOKENS_FALLBACK,
    variant=_random_tokens_variant,
)
CONTROL_TOKEN_WEIGHTS: dict[str, TokenWeightStrategy] = {
    "random_tokens": RANDOM_TOKENS,
    **{
        name: TokenWeightStrategy(entropy_fraction_weights, no_options, needs_entropy=True)
        for name in ENTROPY_PRESETS
    },
}
