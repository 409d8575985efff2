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
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from creditflow.config.grpo import GRPOConfig
from creditflow.config.schema import readable, shown
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
    computed ones before training); reward_metrics: the per-step diagnostics it reports;
    batch_statistics: whether the spec's advantages read statistics of the whole batch (not
    only of each group), which one process of several does not see: such a run is refused
    with more than one process rather than normalised on a part of the batch; needs_entropy:
    whether the spec's advantages read the rollout's per-token entropy (``batch.entropy``,
    HICRA's), which the rollout then computes as it does for a token-weight strategy that
    asks."""

    compute: AdvantageFn
    validate: Callable[[Spec, GRPOConfig], None]
    reward_names: Callable[[Spec], set[str]] = _no_reward_names
    reward_metrics: Callable[[Spec], list[RewardMetric]] = field(default=_no_reward_metrics)
    batch_statistics: Callable[[Spec], bool] = field(default=lambda spec: False)
    needs_entropy: Callable[[Spec], bool] = field(default=lambda spec: False)


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


class StrategyOptions(BaseModel):
    """The options of a strategy spec, typed: each strategy declares its own subclass, whose
    fields (type, default, range, description) are the one description of its options. Strict
    as the parameter blocks are: YAML's ``true`` is no number, ``.inf`` no finite one, and an
    unknown key fails with the closest valid one."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
    name: str = Field(description="the strategy's name in its table (or an import path)")


def parse_options(
    spec: Spec, options: type[StrategyOptions], label: str, fixed: Mapping[str, Any] | None = None
) -> StrategyOptions:
    """``spec`` parsed as ``options``, or a ConfigError naming every bad key of it.

    Args:
        label: how the parameters name the spec (``advantage``, ``token_weights``).
        fixed: options the strategy's name already sets (an ablation's), refused in the spec.
    """
    fixed = dict(fixed or {})
    taken = sorted(set(spec) & set(fixed))
    if taken:
        allowed = sorted(set(options.model_fields) - set(fixed) - {"name"})
        raise ConfigError(
            f"{label} {spec['name']!r} takes {allowed}; got unknown {taken} ({taken} fixed by "
            f"the {spec['name']!r} ablation)"
        )
    try:
        return options.model_validate({**dict(spec), **fixed})
    except ValidationError as error:
        raise ConfigError(_options_problems(spec, options, label, error)) from None


def _options_problems(
    spec: Spec, options: type[StrategyOptions], label: str, error: ValidationError
) -> str:
    valid = set(options.model_fields) - {"name"}
    unknown = sorted(str(e["loc"][0]) for e in error.errors() if e["type"] == "extra_forbidden")
    lines = []
    if unknown:
        guesses = {key: difflib.get_close_matches(key, valid, n=1) for key in unknown}
        hint = "; ".join(f"did you mean {g[0]!r} for {k!r}?" for k, g in guesses.items() if g)
        lines.append(
            f"strategy {spec['name']!r} takes {sorted(valid) or 'no options'}, got unknown "
            f"{unknown}" + (f" ({hint})" if hint else "")
        )
    for e in error.errors():
        if e["type"] == "extra_forbidden":
            continue
        key = ".".join(str(part) for part in e["loc"])
        field = options.model_fields.get(str(e["loc"][0]))
        wanted = _field_wording(field) if field is not None else e["msg"]
        lines.append(f"{label}.{key} must be {wanted}, got {shown(e.get('input'))}")
    return readable("; ".join(lines))


def _field_wording(field: FieldInfo) -> str:
    """``a number in [0, 1]``, ``a number >= 0``, ``true or false``, ``one of ['sum', ...]``."""
    hint = field.annotation
    members = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(members) == 1:
        hint = members[0]
    if hint is bool:
        return "true or false"
    if typing.get_origin(hint) is typing.Literal:
        return f"one of {list(typing.get_args(hint))}"
    bounds = {
        kind: f"{getattr(m, kind):g}"
        for m in field.metadata
        for kind in ("ge", "gt", "le", "lt")
        if getattr(m, kind, None) is not None
    }
    low = ("[", bounds["ge"]) if "ge" in bounds else ("(", bounds["gt"]) if "gt" in bounds else None
    high = (
        (bounds["le"], "]") if "le" in bounds else (bounds["lt"], ")") if "lt" in bounds else None
    )
    if low and high:
        return f"in {low[0]}{low[1]}, {high[0]}{high[1]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1]}"
    if high:
        return f"{'<=' if high[1] == ']' else '<'} {high[0]}"
    return "an integer" if hint is int else "a finite number" if hint is float else "a string"


def no_options(spec: Spec, config: GRPOConfig) -> None:
    """The validation of a strategy that takes no options beyond its name."""
    parse_options(spec, StrategyOptions, "strategy")


class GroupScaleOptions(StrategyOptions):
    """The options of an advantage that z-scores rewards within each group."""

    scale_by_std: bool = Field(
        True,
        description="divide each group's centred rewards by their std (GRPO); false leaves "
        "them centred only (Dr. GRPO)",
    )


def spec_scale_by_std(spec: Spec) -> bool:
    """Whether an advantage spec divides each group's centred rewards by their std: GRPO's
    default, unless the spec says ``scale_by_std: false`` (Dr. GRPO)."""
    return spec.get("scale_by_std", True)


def weighted_reward(rewards: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """(B,) sum of weight * reward over the configured rewards."""
    return sum(weight * rewards[name] for name, weight in weights.items())
