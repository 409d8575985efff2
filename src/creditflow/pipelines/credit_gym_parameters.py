"""The schema of ``params:credit_gym`` (conf/base/parameters_credit_gym.yml; its comments
document each key). Standard library and pydantic only: the ``--params`` check runs it
before torch is imported."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from creditflow.config.grpo import GRPOConfig
from creditflow.config.schema import Block, Count, Fraction, dataclass_block
from creditflow.pipelines.parameter_blocks import Threads

Knob = Annotated[float, Field(ge=0.0)]
KNOB_RANGES = {
    "decisive_fraction": (0.0, 1.0),
    "conflict": (0.0, 0.5),
    "perception": (0.0, 1.0),
    "fork_entropy": (0.0, 1.0),
    "noise": (0.0, 10.0),
}
GymGRPO = dataclass_block(GRPOConfig, partial=True, name="GymGRPO")


class GymKnobValues(Block):
    decisive_fraction: Annotated[float, Field(gt=0.0, le=1.0)]
    conflict: Annotated[float, Field(ge=0.0, le=0.5)]
    perception: Fraction
    fork_entropy: Fraction
    noise: Knob


class GymSweeps(Block):
    decisive_fraction: list[float] | None = None
    conflict: list[float] | None = None
    perception: list[float] | None = None
    fork_entropy: list[float] | None = None
    noise: list[float] | None = None


class GymWorldShape(Block):
    n_families: Count
    length: Annotated[int, Field(ge=2)]
    vocab_size: Annotated[int, Field(ge=2, le=26)]
    n_images: Count


# The GRPOConfig fields a gym strategy sets itself (its advantage and token weights) or the gym
# sets for every run (rewards, token budget, seed): not among a strategy's own ``grpo`` fields.
GYM_OWNED_FIELDS = ("advantage", "token_weights", "rewards", "max_new_tokens", "seed")


class GymStrategy(Block):
    advantage: dict[str, Any] | None = None
    token_weights: dict[str, Any] | None = None
    oracle: bool = False
    grpo: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _grpo_fields(self) -> GymStrategy:
        owned = sorted(set(self.grpo or {}) & set(GYM_OWNED_FIELDS))
        if owned:
            raise ValueError(
                f"a strategy's grpo fields may not set {owned}: the strategy sets advantage "
                f"and token_weights beside grpo, the gym the rest"
            )
        if self.grpo:
            GRPOConfig(**self.grpo)  # a ConfigError naming the bad field, before the sweep
        return self


class CreditGymParams(Block):
    seed: int
    n_seeds: Count
    torch_threads: Threads = None
    baseline: Annotated[str, Field(min_length=1)]
    defaults: GymKnobValues
    sweeps: GymSweeps
    world: GymWorldShape
    hidden: Count
    probe_prompts: Count
    target_share: Annotated[float, Field(gt=0.0, le=1.0)]
    grpo: GymGRPO
    strategies: dict[str, GymStrategy | None] = Field(min_length=1)

    @model_validator(mode="after")
    def _sweeps_and_baseline(self) -> CreditGymParams:
        sweeps = {k: v for k, v in self.sweeps.model_dump().items() if v is not None}
        if not sweeps:
            raise ValueError(f"sweeps must list the doses of at least one of {list(KNOB_RANGES)}")
        for knob, doses in sweeps.items():
            low, high = KNOB_RANGES[knob]
            bad = [
                d for d in doses if not low <= d <= high or (knob == "decisive_fraction" and d == 0)
            ]
            if bad or not doses:
                raise ValueError(f"sweeps.{knob} must list doses in [{low}, {high}], got {doses}")
        active = [name for name, spec in self.strategies.items() if spec is not None]
        if self.baseline not in active:
            raise ValueError(
                f"baseline {self.baseline!r} is not a strategy; valid: {sorted(active)}"
            )
        return self
