"""The loss types GRPO users know from TRL (``GRPOConfig.loss_type``), each a preset of the
engine's own knobs: the one table of what each sets (docs/methods/loss_types.md explains it).

A preset has two kinds of settings:

- *defining* ones (``agg``, ``importance_level``, ``surrogate`` and, where set,
  ``advantage.scale_by_std`` and ``covariance.name``): what makes the loss type what it is. An explicit knob that
  agrees is fine; one that contradicts it is a ConfigError naming the key to drop.
- *defaults* (``clip_low``, ``clip_high``, ``cispo_max_ratio``, ``sapo_temperature_pos``,
  ``sapo_temperature_neg``): the papers' values, used where the knob is unset (null); an
  explicit value wins.

Without a loss type every unset knob takes the engine's default (``ENGINE_DEFAULTS``): the
clipped token-level GRPO loss. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from creditflow.errors import ConfigError


@dataclass(frozen=True)
class LossType:
    """One row of ``LOSS_TYPES``; ``None`` means the preset leaves that setting alone."""

    agg: str
    importance_level: str = "token"
    surrogate: str = "clip"
    scale_by_std: bool | None = None
    clip_low: float | None = None
    clip_high: float | None = None
    cispo_max_ratio: float | None = None
    sapo_temperature_pos: float | None = None
    sapo_temperature_neg: float | None = None
    covariance: str | None = None
    source: str = ""


LOSS_TYPES: dict[str, LossType] = {
    "grpo": LossType(
        agg="seq-mean-token-mean",
        source="GRPO, DeepSeekMath (arXiv 2402.03300); TRL loss_type='grpo'",
    ),
    "bnpo": LossType(
        agg="token-mean",
        source="TRL loss_type='bnpo' (token mean over the local batch)",
    ),
    "dr_grpo": LossType(
        agg="seq-mean-token-sum-norm",
        scale_by_std=False,
        source="Dr. GRPO (arXiv 2503.20783); TRL loss_type='dr_grpo' with scale_rewards='none'",
    ),
    "dapo": LossType(
        agg="token-mean",
        clip_low=0.2,
        clip_high=0.28,  # "clip-higher", DAPO section 3.1
        source="DAPO (arXiv 2503.14476); TRL loss_type='dapo'",
    ),
    "cispo": LossType(
        agg="token-mean",
        surrogate="cispo",
        cispo_max_ratio=5.0,  # TRL's recommended epsilon_high for cispo (ScaleRL)
        source="CISPO, MiniMax-M1 (arXiv 2506.13585); TRL loss_type='cispo'",
    ),
    "sapo": LossType(
        agg="seq-mean-token-mean",
        surrogate="sapo",
        sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05,  # TRL's defaults (its sapo_temperature_pos / _neg)
        source="SAPO (arXiv 2511.20347); TRL loss_type='sapo'",
    ),
    "gspo": LossType(
        agg="seq-mean-token-mean",
        importance_level="sequence",
        clip_low=3e-4,
        clip_high=4e-4,  # GSPO section 5.1
        source="GSPO (arXiv 2507.18071); TRL importance_sampling_level='sequence'",
    ),
    # GSPO's sequence ratio, each sequence's loss counted once per token (summed, not averaged,
    # over its tokens). The clip range is left to the knobs (TRL's default epsilon 0.2).
    "luspo": LossType(
        agg="seq-mean-token-sum",
        importance_level="sequence",
        source="LUSPO (arXiv 2602.05261); TRL loss_type='luspo', importance_sampling_level='sequence'",
    ),
    # The entropy mechanism's two controls, with verl's token-mean aggregation and clip range.
    "clip_cov": LossType(
        agg="token-mean",
        covariance="clip_cov",
        source="Clip-Cov (arXiv 2505.22617); verl policy_loss.loss_mode='clip_cov'",
    ),
    "kl_cov": LossType(
        agg="token-mean",
        surrogate="unclipped",
        covariance="kl_cov",
        source="KL-Cov (arXiv 2505.22617); verl policy_loss.loss_mode='kl_cov'",
    ),
}

DEFINING = ("agg", "importance_level", "surrogate")
DEFAULTED = (
    "clip_low",
    "clip_high",
    "cispo_max_ratio",
    "sapo_temperature_pos",
    "sapo_temperature_neg",
)
# What an unset knob means without a loss type: the clipped token-level GRPO loss.
ENGINE_DEFAULTS: dict[str, Any] = {
    "agg": "seq-mean-token-mean",
    "importance_level": "token",
    "surrogate": "clip",
    "clip_low": 0.2,
    "clip_high": 0.2,
    "cispo_max_ratio": 5.0,
    "sapo_temperature_pos": 1.0,
    "sapo_temperature_neg": 1.05,
}
# The knobs only one surrogate reads: set under the other, they would be ignored.
SURROGATE_KNOBS = {
    "clip": ("clip_low", "clip_high"),
    "cispo": ("cispo_max_ratio",),
    "sapo": ("sapo_temperature_pos", "sapo_temperature_neg"),
    "unclipped": (),
}


def resolve_loss_knobs(
    loss_type: str | None, knobs: Mapping[str, Any], advantage: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The loss knobs and the advantage spec a config means.

    Args:
        loss_type: a key of ``LOSS_TYPES``, or None (the knobs alone).
        knobs: ``DEFINING`` and ``DEFAULTED`` knob -> value as configured, None where unset.
        advantage: the advantage spec (``{"name": ..., **options}``).

    Returns:
        ``(knobs, advantage)``: every knob set (a knob the surrogate does not read stays None),
        and the advantage spec with ``scale_by_std`` written in when the loss type sets it.

    Raises:
        ConfigError: an unknown loss type, an explicit knob the loss type contradicts, or a
            knob the surrogate does not read; the message names the key to drop.

    >>> knobs = dict.fromkeys([*DEFINING, *DEFAULTED])
    >>> resolved, advantage = resolve_loss_knobs("dr_grpo", knobs, {"name": "grpo"})
    >>> resolved["agg"], resolved["clip_low"], advantage
    ('seq-mean-token-sum-norm', 0.2, {'name': 'grpo', 'scale_by_std': False})
    """
    if loss_type is not None and loss_type not in LOSS_TYPES:
        raise ConfigError(f"unknown loss_type {loss_type!r}; valid: {sorted(LOSS_TYPES)} or null")
    preset = LOSS_TYPES.get(loss_type)
    resolved = dict(knobs)
    advantage = dict(advantage)
    for key in DEFINING:
        wanted = ENGINE_DEFAULTS[key] if preset is None else getattr(preset, key)
        if resolved[key] is None:
            resolved[key] = wanted
        elif preset is not None and resolved[key] != wanted:
            raise ConfigError(
                f"loss_type {loss_type!r} sets {key} to {wanted!r}, but {key} is "
                f"{resolved[key]!r}: drop {key} (or drop loss_type and set the knobs yourself)"
            )
    if preset is not None and preset.scale_by_std is not None:
        given = advantage.get("scale_by_std")
        if given is not None and given != preset.scale_by_std:
            raise ConfigError(
                f"loss_type {loss_type!r} sets advantage.scale_by_std to "
                f"{preset.scale_by_std}, but it is {given}: drop advantage.scale_by_std"
            )
        advantage["scale_by_std"] = preset.scale_by_std
    if "covariance" in resolved:
        resolved["covariance"] = _preset_covariance(loss_type, preset, resolved["covariance"])
    _surrogate_knobs(resolved, preset)
    return resolved, advantage


def _preset_covariance(loss_type: str | None, preset: LossType | None, given: Any) -> Any:
    """The ``covariance`` spec with the loss type's control named (given without a name, or
    not given); a given spec naming another control is a ConfigError."""
    if preset is None or preset.covariance is None:
        return given
    if given is None:
        return {"name": preset.covariance}
    if isinstance(given, Mapping) and given.get("name", preset.covariance) == preset.covariance:
        return {**given, "name": preset.covariance}
    raise ConfigError(
        f"loss_type {loss_type!r} sets covariance.name to {preset.covariance!r}, but covariance "
        f"is {given!r}: drop covariance.name (or drop loss_type)"
    )


def _surrogate_knobs(resolved: dict[str, Any], preset: LossType | None) -> None:
    """Refuses the knobs of the other surrogate; sets this one's unset knobs (in place)."""
    surrogate = resolved["surrogate"]
    if surrogate not in SURROGATE_KNOBS:
        raise ConfigError(f"surrogate must be one of {list(SURROGATE_KNOBS)}, got {surrogate!r}")
    for other, keys in SURROGATE_KNOBS.items():
        for key in keys if other != surrogate else ():
            if resolved[key] is not None:
                raise ConfigError(
                    f"{key} is not read by surrogate {surrogate!r} (it belongs to {other!r}): "
                    f"drop {key}"
                )
    for key in SURROGATE_KNOBS[surrogate]:
        if resolved[key] is None:
            default = None if preset is None else getattr(preset, key)
            resolved[key] = ENGINE_DEFAULTS[key] if default is None else default
