"""The parameter blocks several groups share: a tapo / tor policy, the SFT warm start, the
GRPO budget of a comparison and a strategy's overrides of it, LoRA, the supervised trainer's
config. Standard library, pydantic and the torch-free configs of :mod:`creditflow.config`
only, so the groups built from them are checked before torch loads
(``hooks.parameter_check``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import partial
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationInfo, create_model, model_validator

from creditflow.config.grpo import GRPOConfig
from creditflow.config.policy import (
    LoraSpec,
    PolicySpec,
    TinyQwen2,
    TinyQwen2_5VL,
    checked_policy_spec,
    without_other_source,
)
from creditflow.config.schema import Block, Count, dataclass_block
from creditflow.config.supervised import SFTConfig, SupervisedConfig
from creditflow.rewards.plugins import check_reward_name


def one_of(names: Collection[str], what: str) -> Any:
    """A string that must be one of ``names`` (the error lists them)."""

    def check(value: str) -> str:
        if value not in names:
            raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(sorted(names))}")
        return value

    return Annotated[str, AfterValidator(check)]


Threads = Annotated[int, Field(ge=1)] | None
# A built-in reward, or the import path / entry point of one's own (rewards.plugins: it is
# imported and its signature checked here).
RewardName = Annotated[str, AfterValidator(check_reward_name)]


# --- blocks shared by several groups ---------------------------------------------------------


Lora = dataclass_block(LoraSpec, check=LoraSpec.from_params, name="Lora")


def policy_block(
    name: str, tiny_options: type[TinyQwen2] | type[TinyQwen2_5VL], without: Collection[str] = ()
) -> type[Block]:
    """The ``PolicySpec`` block, less the keys in ``without``, with ``tiny_options`` (a
    ``config.policy`` dataclass) as its ``tiny`` block. The keys of the source not chosen
    (base's ``tiny:`` beside an override's ``source: pretrained``) are dropped before
    validation, as ``PolicySpec`` ignores them. Whether this machine has the ``device`` is
    asked only when the validation context names a ``check_device`` (``check_parameters``
    before a run's first node: it needs torch)."""
    tiny = dataclass_block(tiny_options, name=f"{name}Tiny")
    extra = {"tiny": (tiny | None, None), "lora": (Lora | None, None)}
    block = dataclass_block(
        PolicySpec,
        check=partial(checked_policy_spec, tiny=tiny_options),
        exclude=("tiny", "lora", *without),
        extra_fields={key: spec for key, spec in extra.items() if key not in without},
        name=f"{name}Keys",
    )

    def drop_other_source(data: Any) -> Any:
        return without_other_source(data) if isinstance(data, Mapping) else data

    def device_available(model: Block, info: ValidationInfo) -> Block:
        check_device = (info.context or {}).get("check_device")
        device = getattr(model, "device", None)
        if check_device is not None and device is not None:
            check_device(device)
        return model

    validators = {
        "drop_other_source": model_validator(mode="before")(drop_other_source),
        "device_available": model_validator(mode="after")(device_available),
    }
    return create_model(name, __base__=block, __validators__=validators)


TextPolicy = policy_block("TextPolicy", TinyQwen2)
VisionPolicy = policy_block("VisionPolicy", TinyQwen2_5VL)


class Distributed(Block):
    """Data-parallel training (``training.launch.run_data_parallel``, docs/scale_out.md)."""

    num_processes: Count = Field(
        1,
        description="training processes (gloo on CPU, NCCL on GPUs); prompts_per_step is the "
        "global count",
    )
    accelerate: dict[str, Any] | None = Field(
        None,
        description="Accelerator options, e.g. {mixed_precision: bf16}; {fsdp: {fsdp_version: "
        "2}} shards the model across the processes instead of copying it (needs rollout: "
        "{name: hf})",
    )


_DISTRIBUTED = {
    "distributed": (
        Distributed | None,
        Field(None, description="data-parallel training; null: one process"),
    )
}
# The shared GRPO budget of a comparison; each strategy's merged config is checked whole by
# comparison.check_strategies.
ComparisonGRPO = dataclass_block(GRPOConfig, extra_fields=_DISTRIBUTED, name="ComparisonGRPO")
StrategyOverrides = dataclass_block(
    GRPOConfig, partial=True, extra_fields=_DISTRIBUTED, name="StrategyOverrides"
)
SFT = dataclass_block(SFTConfig, check=SFTConfig.from_params, name="SFT")


class StrategyComparison(Block):
    """How a comparison's strategies are compared (``<group>.comparison``): GRPO runs per
    strategy (seeds ``grpo.seed + k``, ``pipelines.comparison.seed_overrides``) and the
    strategy the others are compared with."""

    n_seeds: Count
    baseline: Annotated[str, Field(min_length=1)]


def check_baseline(group: str, comparison: StrategyComparison, strategies: Any) -> None:
    # A strategy set to null does not run (pipelines.comparison.active_strategies).
    strategies = [name for name, spec in strategies.items() if spec is not None]
    if not strategies:
        raise ValueError(f"every one of the {group}.strategies is null: leave at least one")
    if comparison.baseline not in strategies:
        raise ValueError(
            f"comparison.baseline {comparison.baseline!r} is not a strategy; valid: "
            f"{', '.join(sorted(strategies))} (the {group}.strategies)"
        )


def supervised_block(name: str, defaults: Mapping[str, Any]) -> type[Block]:
    return dataclass_block(
        SupervisedConfig,
        check=lambda values: SupervisedConfig.from_params(values, **defaults),
        name=name,
    )
