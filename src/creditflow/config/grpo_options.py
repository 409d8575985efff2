"""The mapping options of ``GRPOConfig`` (``config.grpo``), each a typed, strict model: DAPO's
overlong shaping and dynamic sampling, the covariance control of Clip-Cov / KL-Cov, PAPO's
perception loss. ``parse_option`` builds one from its mapping with a message naming the bad
key. Pydantic and the standard library only."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from creditflow.config.schema import shown, validation_message
from creditflow.errors import ConfigError


class GRPOOption(BaseModel):
    """A mapping option of GRPOConfig, typed (strict, as GRPOConfig is)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class OverlongShaping(GRPOOption):
    """``GRPOConfig.overlong``: DAPO's soft overlong punishment (``algorithms.overlong_penalty``)
    of the last ``buffer`` tokens before ``max_new_tokens``, added to reward ``reward``."""

    buffer: int = Field(description="L: the tokens before max_new_tokens that are penalised")
    penalty_factor: float = Field(1.0, description="the penalty at max_new_tokens (negated)")
    reward: str = Field("reasoning", description="the reward the penalty is added to")


class CovarianceControl(GRPOOption):
    """``GRPOConfig.covariance``: Clip-Cov or KL-Cov (``algorithms.covariance``) and its
    settings (verl's defaults); ``lower`` / ``upper`` are read by Clip-Cov, ``coef`` by KL-Cov."""

    name: str = Field(description="clip_cov or kl_cov")
    ratio: float = Field(2e-4, description="the share of valid tokens selected (at least one)")
    lower: float = Field(1.0, description="Clip-Cov: the covariance band's lower end")
    upper: float = Field(5.0, description="Clip-Cov: the covariance band's upper end")
    coef: float = Field(1.0, description="KL-Cov: the penalty's coefficient")


class PerceptionLoss(GRPOOption):
    """``GRPOConfig.perception``: PAPO's implicit perception loss (``algorithms.papo``), with
    the settings of TRL's PAPO example (weight 0.1, mask ratio 0.3) and its clip (0.2)."""

    weight: float = Field(0.1, ge=0, description="the loss's weight (gamma)")
    mask_ratio: float = Field(0.3, gt=0, le=1, description="the share of pixel values zeroed")
    clip: float = Field(0.2, gt=0, description="the divergence's clip per token")


class DynamicSampling(GRPOOption):
    """``GRPOConfig.dynamic_sampling``: a completion succeeds when its ``reward`` is at least
    ``success``; groups of one success value are dropped; at most ``max_extra_rollouts`` more
    completions per step (None: one more rollout batch)."""

    reward: str = Field("reasoning", description="the reward that decides success")
    success: float = Field(1.0, description="a completion succeeds when reward >= success")
    max_extra_rollouts: int | None = Field(
        None, description="more completions sampled per step at most; null: one rollout batch"
    )


def parse_option(cls: type[GRPOOption], label: str, spec: Any) -> Any:
    """``cls`` built from the mapping ``spec``, or a ConfigError naming the bad key."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{label} must be a mapping or null, got {shown(spec)}")
    unknown = sorted(set(spec) - set(cls.model_fields))
    if unknown:
        raise ConfigError(f"unknown {label} option(s) {unknown}; valid: {sorted(cls.model_fields)}")
    try:
        return cls(**spec)
    except ValidationError as error:
        raise ConfigError(validation_message(error, cls, prefix=f"{label}.")) from None
