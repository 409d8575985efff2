"""The typed configs of the one supervised trainer (``training.supervised.SupervisedTrainer``)
and of the SFT warm start (``training.sft``), torch-free so a run's parameters are checked
before torch loads (``hooks.parameter_check``). Every field is documented once, here."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from creditflow.config.values import typed_value
from creditflow.errors import ConfigError

# The learning-rate schedules by name; training.supervised.SCHEDULES builds each (a test holds
# the two equal). "cosine": linear warm-up, then cosine decay to 0; "constant": warm-up, then
# the learning rate (with 0 warm-up steps, AdamW at a fixed lr).
SCHEDULE_NAMES = ("constant", "cosine")


@dataclass(frozen=True)
class SupervisedConfig:
    """steps: optimizer steps; batch_size: examples per step (a batch may straddle two epochs);
    learning_rate, weight_decay: AdamW; schedule: a ``SCHEDULE_NAMES`` name, "cosine" (linear warm-up
    over ``warmup_steps``, then cosine decay to 0 at ``steps``) or "constant" (warm-up, then
    ``learning_rate``); max_grad_norm: clip the gradient norm to this, None for no clipping;
    seed: example order (``EpochSampler``); checkpoint_every: save every N steps (0: only at the
    end; without a store nothing is saved)."""

    steps: int
    batch_size: int
    learning_rate: float
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: str = "cosine"
    max_grad_norm: float | None = 1.0
    seed: int = 0
    checkpoint_every: int = 0

    # Keys the trainers once took as keyword arguments, and the field each one became.
    RENAMED: typing.ClassVar[dict[str, str]] = {"lr": "learning_rate"}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], **defaults: Any) -> SupervisedConfig:
        """A config from a ``parameters_*.yml`` block: ``params`` over the caller's
        ``defaults`` (e.g. ``schedule="constant"``) over the field defaults, checked before
        anything is built.

        >>> SupervisedConfig.from_params(
        ...     {"steps": 3, "batch_size": 2, "learning_rate": 0.1}, schedule="constant"
        ... ).schedule
        'constant'

        Raises:
            ConfigError: an unknown or renamed key (listing the valid ones), a value of the
                wrong type (naming the field), a missing required field or a bad value.
        """
        names = [f.name for f in fields(cls)]
        for key in sorted(set(params) | set(defaults)):
            if key in cls.RENAMED:
                raise ConfigError(f"`{key}` is now `{cls.RENAMED[key]}`: rename it in parameters")
            if key not in names:
                raise ConfigError(f"unknown supervised key `{key}`; valid keys are {names}")
        values = {**defaults, **params}
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in values]
        if missing:
            raise ConfigError(f"supervised training needs {missing}; set them in parameters")
        hints = typing.get_type_hints(cls)
        return cls(**{key: typed_value(key, value, hints[key]) for key, value in values.items()})

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        for name in ("weight_decay", "warmup_steps", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.schedule not in SCHEDULE_NAMES:
            raise ConfigError(
                f"unknown schedule {self.schedule!r}; valid: {', '.join(SCHEDULE_NAMES)}"
            )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ConfigError(
                f"max_grad_norm must be > 0 or None (no clipping), got {self.max_grad_norm}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def run_key(self) -> dict[str, Any]:
        """The fields that change what is trained (``checkpoint_every`` only changes what is
        saved): a checkpoint resumes a run with the same ``run_key``."""
        return {k: v for k, v in asdict(self).items() if k != "checkpoint_every"}


@dataclass
class SFTConfig:
    """steps: optimizer steps, 0 to skip the warm start (a real checkpoint that already
    follows the format: the initial policy passes through unchanged); batch_size: examples per
    step; learning_rate, weight_decay,
    warmup_steps, max_grad_norm: AdamW with warm-up then cosine decay (``SupervisedConfig``);
    max_length: tokens per example (longer ones are truncated from the right); seed: example
    order; checkpoint_every: steps between checkpoints when a store is given (0: at the end)."""

    steps: int = 200
    batch_size: int = 16
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    max_grad_norm: float | None = 1.0
    max_length: int = 256
    seed: int = 0
    checkpoint_every: int = 0

    @classmethod
    def from_params(cls, params: dict) -> SFTConfig:
        known = set(asdict(cls()))
        unknown = sorted(set(params) - known)
        if unknown:
            raise ConfigError(f"unknown SFT parameter(s) {unknown}; valid keys are {sorted(known)}")
        hints = typing.get_type_hints(cls)
        config = cls(**{key: typed_value(key, value, hints[key]) for key, value in params.items()})
        if config.max_length < 1:
            raise ConfigError(f"sft max_length must be >= 1, got {config.max_length}")
        if config.steps < 0:
            raise ConfigError(f"sft steps must be >= 0 (0 skips SFT), got {config.steps}")
        if config.steps > 0:
            config.supervised()  # the trainer's checks of the rest (learning_rate, ...)
        return config

    @property
    def skipped(self) -> bool:
        """``steps: 0``: no warm start."""
        return self.steps == 0

    def supervised(self) -> SupervisedConfig:
        """The trainer's config: warm-up then cosine, clipped to ``max_grad_norm``."""
        return SupervisedConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            weight_decay=self.weight_decay,
            warmup_steps=self.warmup_steps,
            schedule="cosine",
            max_grad_norm=self.max_grad_norm,
            seed=self.seed,
            checkpoint_every=self.checkpoint_every,
        )
