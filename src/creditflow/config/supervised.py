"""The typed configs of the one supervised trainer (``training.supervised.SupervisedTrainer``)
and of the SFT warm start (``training.sft``), torch-free so a run's parameters are checked
before torch loads (``hooks.parameter_check``).

Both are pydantic models, strict as ``GRPOConfig`` is (YAML's ``true`` is no int, ``2.5`` no
int, ``.inf`` no finite float; an int is taken for a float): every field has its type,
default and one description here, and building one checks it whole, so an object of these
types is a valid config.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from creditflow.config.schema import unknown_keys_message, validation_message
from creditflow.errors import ConfigError

# The learning-rate schedules by name; training.supervised.SCHEDULES builds each (a test holds
# the two equal). "cosine": linear warm-up, then cosine decay to 0; "constant": warm-up, then
# the learning rate (with 0 warm-up steps, AdamW at a fixed lr).
SCHEDULE_NAMES = ("constant", "cosine")


class _Checked(BaseModel):
    """A config that turns pydantic's errors into ConfigErrors naming the key."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise ConfigError(validation_message(error, type(self))) from None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


class SupervisedConfig(_Checked):
    """The supervised trainer's settings (AdamW, a warm-up schedule, example order)."""

    model_config = ConfigDict(frozen=True)

    steps: int = Field(description="optimizer steps")
    batch_size: int = Field(description="examples per step (a batch may straddle two epochs)")
    learning_rate: float = Field(description="AdamW's learning rate (the peak of the schedule)")
    weight_decay: float = Field(0.0, description="AdamW's decoupled weight decay")
    warmup_steps: int = Field(0, description="steps of linear warm-up from 0 to learning_rate")
    schedule: str = Field(
        "cosine",
        description="one of SCHEDULE_NAMES: 'cosine' (warm-up, then cosine decay to 0 at "
        "`steps`) or 'constant' (warm-up, then learning_rate)",
    )
    max_grad_norm: float | None = Field(
        1.0, description="clip the gradient norm to this; null: no clipping"
    )
    seed: int = Field(0, description="the example order (training.supervised.EpochSampler)")
    checkpoint_every: int = Field(
        0, description="save every N steps (0: only at the end; without a store nothing is saved)"
    )

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
        names = list(cls.model_fields)
        for key in sorted(set(params) | set(defaults)):
            if key in cls.RENAMED:
                raise ConfigError(f"`{key}` is now `{cls.RENAMED[key]}`: rename it in parameters")
            if key not in names:
                raise ConfigError(f"unknown supervised key `{key}`; valid keys are {names}")
        values = {**defaults, **params}
        missing = [
            name
            for name, info in cls.model_fields.items()
            if info.is_required() and name not in values
        ]
        if missing:
            raise ConfigError(f"supervised training needs {missing}; set them in parameters")
        return cls(**values)

    @model_validator(mode="after")
    def _check(self) -> SupervisedConfig:
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
        return self

    def run_key(self) -> dict[str, Any]:
        """The fields that change what is trained (``checkpoint_every`` only changes what is
        saved): a checkpoint resumes a run with the same ``run_key``."""
        return {k: v for k, v in self.model_dump().items() if k != "checkpoint_every"}


class SFTConfig(_Checked):
    """The SFT warm start: the supervised trainer with warm-up then cosine decay, on the
    task's demonstrations."""

    steps: int = Field(
        200,
        description="optimizer steps; 0 skips the warm start (a real checkpoint that already "
        "follows the format: the initial policy passes through unchanged)",
    )
    batch_size: int = Field(16, description="examples per step")
    learning_rate: float = Field(1e-3, description="AdamW's peak learning rate")
    weight_decay: float = Field(0.0, description="AdamW's decoupled weight decay")
    warmup_steps: int = Field(10, description="steps of linear warm-up before the cosine decay")
    max_grad_norm: float | None = Field(
        1.0, description="clip the gradient norm to this; null: no clipping"
    )
    max_length: int = Field(
        256, description="tokens per example (longer ones are truncated from the right)"
    )
    seed: int = Field(0, description="the example order")
    checkpoint_every: int = Field(
        0, description="steps between checkpoints when a store is given (0: at the end)"
    )

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SFTConfig:
        """The config of the ``sft`` parameters ``params``; ConfigError naming each unknown key
        with the closest valid one, or the first bad value."""
        unknown = sorted(set(params) - set(cls.model_fields))
        if unknown:
            raise ConfigError(
                "SFT: " + unknown_keys_message(unknown, cls.model_fields, noun="parameter")
            )
        return cls(**params)

    @model_validator(mode="after")
    def _check(self) -> SFTConfig:
        if self.max_length < 1:
            raise ConfigError(f"sft max_length must be >= 1, got {self.max_length}")
        if self.steps < 0:
            raise ConfigError(f"sft steps must be >= 0 (0 skips SFT), got {self.steps}")
        if self.steps > 0:
            self.supervised()  # the trainer's checks of the rest (learning_rate, ...)
        return self

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
