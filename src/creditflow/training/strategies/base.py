"""The two kinds of credit-assignment strategy and what they share.

An *advantage strategy* turns the named per-completion rewards of a rollout batch into
``(B, T)`` token advantages; a *token-weight strategy* gives the ``(B, T)`` weights ``w`` of
the loss (docs/methods/grpo.md). Each kind has its own call signature (``AdvantageFn``,
``TokenWeightFn``) and is registered by name in ``training.strategies``; the GRPO loop calls
them through these types and names no method.

Shape symbols: ``B`` sequences (prompts x G), ``G`` group size, ``T`` completion tokens.
Masks are 1 where a token counts.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError
from creditflow.rollout.batch import RolloutBatch

Metrics = dict[str, float]
Spec = Mapping[str, Any]  # {"name": strategy, ...its options}, as written in the parameters


class AdvantageFn(Protocol):
    def __call__(
        self,
        spec: Spec,
        rewards: dict[str, torch.Tensor],
        batch: RolloutBatch,
        policy: Any,
        config: GRPOConfig,
    ) -> tuple[torch.Tensor, Metrics]:
        """rewards: name -> (B,); returns ``(advantages (B, T), metrics)``, 0 on padding."""
        ...


@dataclass(frozen=True)
class WeightContext:
    """What a token-weight strategy may need beyond the batch.

    generator: seeded per step, identically on every process (tie-breaking).
    accelerator: an ``accelerate.Accelerator`` (None in a single process). With several
        processes the batch is this process's share only: a strategy that needs batch-global
        statistics (ToR's top fraction of all valid tokens, docs/methods/tor.md) gathers them
        through it before choosing a threshold.
    """

    generator: torch.Generator
    accelerator: Any = None


class TokenWeightFn(Protocol):
    def __call__(
        self, spec: Spec, batch: RolloutBatch, policy: Any, context: WeightContext
    ) -> tuple[torch.Tensor, Metrics]:
        """Returns ``(weights (B, T), metrics)``, 0 on padding."""
        ...


# (rewards of the whole rollout batch: name -> (B,), group size G) -> metrics. A diagnostic of
# the rewards themselves, such as TAPO's sign-conflict rate; computed once per step on the
# rewards of every process.
RewardMetric = Callable[[dict[str, torch.Tensor], int], Metrics]


def _no_reward_names(spec: Spec) -> set[str]:
    return set()


def _no_reward_metrics(spec: Spec) -> list[RewardMetric]:
    return []


@dataclass(frozen=True)
class AdvantageStrategy:
    """compute: the advantages; validate: checks the spec before any model is built;
    reward_names: the rewards it reads beyond ``config.rewards`` (checked against the
    computed ones before training); reward_metrics: the per-step diagnostics it reports."""

    compute: AdvantageFn
    validate: Callable[[Spec, GRPOConfig], None]
    reward_names: Callable[[Spec], set[str]] = _no_reward_names
    reward_metrics: Callable[[Spec], list[RewardMetric]] = field(default=_no_reward_metrics)


@dataclass(frozen=True)
class TokenWeightStrategy:
    """compute: the weights; validate: checks the spec up front; needs_entropy /
    needs_rollout_logprobs: what the rollout must compute for it (each costs a pass over the
    (B, T, V) logits); needs_image_pass: it calls ``policy.no_image_logprobs`` (ToR's
    perception score), which only a vision-language policy has: any other fails with a
    ConfigError before training, ``image_pass_fallback`` saying what to set instead.

    variant: for a strategy whose needs depend on its options, ``variant(spec)`` is the
    strategy with the flags of that spec (``for_spec``); the trainer and the contract checks
    read the flags of that one. Without it the flags hold for every spec.
    """

    compute: TokenWeightFn
    validate: Callable[[Spec, GRPOConfig], None]
    needs_entropy: bool = False
    needs_rollout_logprobs: bool = False
    needs_image_pass: bool = False
    image_pass_fallback: str = ""
    variant: Callable[[Spec], TokenWeightStrategy] | None = None

    def for_spec(self, spec: Spec) -> TokenWeightStrategy:
        """The strategy that runs ``spec``: ``variant(spec)``, or this one when it has none."""
        return self if self.variant is None else self.variant(spec)


def reject_unknown_options(spec: Spec, allowed: set[str]) -> None:
    """ConfigError naming the options of ``spec`` outside ``allowed`` (``name`` included)."""
    extra = sorted(set(spec) - allowed)
    if extra:
        options = sorted(allowed - {"name"}) or "no options"
        guesses = {key: difflib.get_close_matches(key, allowed - {"name"}, n=1) for key in extra}
        hint = "; ".join(f"did you mean {g[0]!r} for {k!r}?" for k, g in guesses.items() if g)
        raise ConfigError(
            f"strategy {spec['name']!r} takes {options}, got unknown {extra}"
            + (f" ({hint})" if hint else "")
        )


def no_options(spec: Spec, config: GRPOConfig) -> None:
    reject_unknown_options(spec, {"name"})


def spec_scale_by_std(spec: Spec) -> bool:
    """Whether an advantage spec divides each group's centred rewards by their std: GRPO's
    default, unless the spec says ``scale_by_std: false`` (Dr. GRPO)."""
    return spec.get("scale_by_std", True)


def check_scale_by_std(spec: Spec) -> None:
    scale = spec_scale_by_std(spec)
    if not isinstance(scale, bool):
        raise ConfigError(f"advantage.scale_by_std must be true or false, got {scale!r}")


def weighted_reward(rewards: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """(B,) sum of weight * reward over the configured rewards."""
    return sum(weight * rewards[name] for name, weight in weights.items())
