"""GRPO entry points: the glue between Kedro nodes and ``GRPOTrainer`` for a language,
vision-language or reranker policy.

A node passes its inputs and ``params:`` dict; an entry point validates the parameters first
(``build_grpo_config``), then builds the policy, runs GRPO on a copy of the model with
resumable checkpoints, and returns plain results (model, ``GRPOResult``).
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from creditflow.config.grpo import (
    DEFAULT_ROLLOUT_BACKEND,
    GRPOConfig,
    check_importance_sampling,
    check_process_layout,
)
from creditflow.config.plugins import source_digests
from creditflow.config.supervised import SFTConfig
from creditflow.errors import ConfigError
from creditflow.rewards import check_reward_options
from creditflow.rewards.plugins import is_builtin_reward
from creditflow.rollout import LanguagePolicy, SamplingSettings, VisionLanguagePolicy
from creditflow.rollout.backends import FALLBACK_BACKEND, backend_class, check_rollout_spec
from creditflow.training.checkpoint import CheckpointStore, run_store
from creditflow.training.fsdp import unsharded_copy
from creditflow.training.grpo import GRPOResult, GRPOTrainer
from creditflow.training.launch import run_data_parallel
from creditflow.training.memory import check_rollout_fits, device_memory_bytes
from creditflow.training.policy_kinds import build_policy, policy_kind
from creditflow.training.rewards import BoundRewards, Reward
from creditflow.training.strategies import (
    ADVANTAGE_STRATEGIES,
    TOKEN_WEIGHT_STRATEGIES,
    RewardMetric,
    advantage_strategy,
    check_image_pass,
    validate_strategies,
)

logger = logging.getLogger(__name__)


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``base`` with ``overrides`` applied key by key (one level deep for mapping values)."""
    merged = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key != "rewards":
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# The configs checked whole, by their content and the rewards they were checked against: the
# parameter hook checks every comparison strategy's config before the first node, and the
# node that trains it (and ``api.train_grpo`` after it) parse the same parameters into a config
# of the same content, which is not checked again. The check is a function of that content
# alone. Bounded: the oldest entries go first.
_CHECKED: OrderedDict[tuple[str, tuple[str, ...]], None] = OrderedDict()
_CHECKED_MAX = 1024


def build_grpo_config(grpo_params: dict[str, Any], reward_names: Sequence[str]) -> GRPOConfig:
    """A validated ``GRPOConfig`` whose rewards, weighted, read by the advantage strategy
    (TAPO's ``translation_reward`` / ``reasoning_reward``) or given options, all exist in
    ``reward_names``, and whose ``reward_options`` those rewards take."""
    config = GRPOConfig.from_params(dict(grpo_params))
    check_grpo_config(config, reward_names)
    return config


def check_grpo_config(config: GRPOConfig, reward_names: Sequence[str] | None = None) -> None:
    """``config`` checked as ``build_grpo_config`` checks it: its fields, its strategies and
    its rollout backend; with ``reward_names`` (the rewards a run computes) also that every
    reward it weights, its advantage strategy reads or it gives options to is among them.

    A config of the same content checked against the same rewards before is not checked again
    (the parameter hook checks a comparison's configs before the first node; the node and
    ``api.train_grpo`` then meet the same content).

    Raises:
        ConfigError: naming the key to fix.
    """
    checked_as = (config.model_dump_json(), tuple(sorted(str(r) for r in reward_names or ())))
    if reward_names is not None and checked_as in _CHECKED:
        _CHECKED.move_to_end(checked_as)
        return
    validate_strategies(config)  # its own fields were checked when it was built
    try:
        check_rollout_spec(config.rollout)
    except ConfigError as error:
        raise ConfigError(f"rollout: {error}") from error
    # GRPOTrainer checks it again on the policy it gets; this fails before any node runs.
    rollout_name = config.rollout.get("name", FALLBACK_BACKEND)
    check_importance_sampling(config, backend_class(rollout_name).samples_module)
    if reward_names is None:
        return
    unknown = sorted(set(config.rewards) - set(reward_names))
    if unknown:
        raise ConfigError(
            f"rewards {unknown} are weighted but not computed; computed rewards are "
            f"{sorted(reward_names)} (add them to 'reward_functions' or drop the weight)"
        )
    advantage = advantage_strategy(config)
    unread = sorted(advantage.reward_names(config.advantage) - set(reward_names))
    if unread:
        raise ConfigError(
            f"advantage {config.advantage['name']!r} reads rewards {unread} that are not "
            f"computed; computed rewards are {sorted(reward_names)} (add them to "
            f"'reward_functions' or fix the advantage's *_reward options)"
        )
    _check_dapo_rewards(config, reward_names, advantage.reward_names(config.advantage))
    for name, options in config.reward_options.items():
        if name not in set(reward_names):
            raise ConfigError(
                f"reward_options names reward {name!r}, which is not computed; computed "
                f"rewards are {sorted(reward_names)}"
            )
        if not is_builtin_reward(name):
            raise ConfigError(
                f"reward_options.{name}: a reward of your own takes no options here; bind "
                "them in its module (e.g. a def that calls your function with them)"
            )
        try:
            check_reward_options(name, options)
        except ValueError as error:
            raise ConfigError(f"reward_options.{name}: {error}") from error
    if reward_names is not None:
        _CHECKED[checked_as] = None
        while len(_CHECKED) > _CHECKED_MAX:
            _CHECKED.popitem(last=False)


def _check_dapo_rewards(config: GRPOConfig, computed: Sequence[str], read: set[str]) -> None:
    """The rewards ``overlong`` shapes and ``dynamic_sampling`` filters on are computed, and
    the shaped one counts: weighted in ``rewards`` or read by the advantage strategy."""
    overlong, sampling = config.overlong_shaping(), config.dynamic_sampling_spec()
    for label, spec in (("overlong", overlong), ("dynamic_sampling", sampling)):
        if spec is not None and spec.reward not in set(computed):
            raise ConfigError(
                f"{label}.reward {spec.reward!r} is not computed; computed rewards are "
                f"{sorted(computed)}"
            )
    if overlong is not None and overlong.reward not in {*config.rewards, *read}:
        raise ConfigError(
            f"overlong.reward {overlong.reward!r} is neither weighted in rewards nor read by "
            f"advantage {config.advantage['name']!r}, so the penalty would reach no advantage; "
            f"name one of {sorted({*config.rewards, *read})}"
        )


def strategy_config(
    params: dict[str, Any], strategy: dict[str, Any]
) -> tuple[GRPOConfig, dict[str, Any] | None]:
    """``(GRPOConfig, distributed)`` of one strategy of a comparison: ``params['grpo']`` with
    the strategy's overrides merged in (``merge_overrides``), checked against
    ``params['reward_functions']``; ``distributed`` is the process layout (``grpo.distributed``,
    not a GRPOConfig field), None when unset."""
    grpo_params = merge_overrides(params["grpo"], strategy)
    distributed = grpo_params.pop("distributed", None)
    config = build_grpo_config(grpo_params, params["reward_functions"])
    return config, (None if distributed is None else check_distributed(distributed, config))


def check_distributed(distributed: dict[str, Any] | None, config: GRPOConfig) -> dict[str, Any]:
    """``distributed`` (``{"num_processes": N, "accelerate": {...}}``, or None) checked
    against ``config`` before any process starts; returns it as a dict.

    Raises:
        ConfigError: an unknown key, a bad process count, a batch the processes cannot
            share (``config.check_process_layout``), or FSDP with the ``lean`` rollout
            (it reads whole parameters; under FSDP each process holds shards).
    """
    distributed = dict(distributed or {})
    unknown = sorted(set(distributed) - {"num_processes", "accelerate"})
    if unknown:
        raise ConfigError(
            f"unknown 'distributed' key(s) {unknown}; valid: ['accelerate', 'num_processes']"
        )
    num_processes = distributed.get("num_processes", 1)
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ConfigError(
            f"distributed.num_processes must be an integer >= 1, got {num_processes!r}"
        )
    check_process_layout(config, num_processes)
    accelerate = distributed.get("accelerate") or {}
    if not isinstance(accelerate, dict):
        raise ConfigError(f"distributed.accelerate must be a mapping, got {accelerate!r}")
    if num_processes > 1 and advantage_strategy(config).batch_statistics(config.advantage):
        raise ConfigError(
            f"advantage {config.advantage['name']!r} normalises over the whole batch, which "
            f"each of {num_processes} processes sees only a part of: train it in one process "
            "(distributed.num_processes: 1), or turn its batch normalisation off"
        )
    rollout = config.rollout.get("name", DEFAULT_ROLLOUT_BACKEND)
    if "fsdp" in accelerate and rollout == "lean":
        raise ConfigError(
            "distributed.accelerate.fsdp shards every parameter, and rollout 'lean' (the "
            "default) reads whole ones: set grpo.rollout: {name: hf} with fsdp"
        )
    return distributed


def check_comparison_params(
    group: str,
    params: dict[str, Any],
    strategies: Sequence[str] | None = None,
    has_image_pass: bool = False,
) -> None:
    """Every config a comparison will build, built now: the SFT warm start's and the GRPO
    config of each of ``strategies`` (default: all of ``params['strategies']``), so a typo
    fails before the first node (not after SFT); a token-weight strategy that needs the
    no-image pass fails unless the comparison's policy has one (``has_image_pass``, a
    vision-language policy; ``check_image_pass``). ``group`` names the parameters in messages.

    Raises:
        ConfigError: naming the group, the strategy and the key.
    """
    try:
        SFTConfig.from_params(dict(params["sft"]))
    except ConfigError as error:
        raise ConfigError(f"{group}.sft: {error}") from error
    # A strategy set to null is left out of the run (pipelines.comparison.active_strategies).
    configured = {k: v for k, v in (params.get("strategies") or {}).items() if v is not None}
    for name in [n for n in configured if strategies is None or n in set(strategies)]:
        try:
            config, _ = strategy_config(params, configured[name])
            check_image_pass(config, has_image_pass, f"the {group} pipeline's policy")
            # Before SFT trains: the floor without the model's vocabulary (the trainer checks
            # it again with it), against this machine's memory for a CPU policy.
            if (params.get("policy") or {}).get("device", "cpu") == "cpu":
                check_rollout_fits(config, 1, device_memory_bytes(torch.device("cpu")))
        except ConfigError as error:
            raise ConfigError(f"{group}.strategies.{name} (over {group}.grpo): {error}") from error


def sampling_settings(config: GRPOConfig) -> SamplingSettings:
    return SamplingSettings(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        entropy_top_p=config.entropy_top_p,
        logprob_chunk_size=config.logprob_chunk_size,
        shared_prefix=config.shared_prefix,
    )


def grpo_policy(
    model, processing, config: GRPOConfig, cache_bytes: Mapping[str, int] | None = None
) -> LanguagePolicy | VisionLanguagePolicy:
    """The policy GRPO trains: ``model`` with its tokenizer or processor ``processing``
    (``policy_kinds.policy_kind``), sampling as ``config`` says with the backend
    ``config.rollout`` names (``hf`` where that backend does not support the model, with a log
    line). ``cache_bytes``: a vision-language policy's ``prompt_cache_bytes`` /
    ``vision_cache_bytes``."""
    return build_policy(model, processing, sampling_settings(config), config.rollout, cache_bytes)


def _plugin_sources(config: GRPOConfig, rewards: Sequence[Reward]) -> dict[str, Any]:
    """``{"plugins": {name: source digest}}`` of the strategies and rewards of one's own a run
    names (``config.plugins.source_digests``), for its checkpoint key; empty when it names
    none, so the key of a run of built-ins stays what it was."""
    strategies = [
        spec["name"]
        for spec, table in (
            (config.advantage, ADVANTAGE_STRATEGIES),
            (config.token_weights, TOKEN_WEIGHT_STRATEGIES),
        )
        if spec["name"] not in table
    ]
    own_rewards = [r for r in rewards if isinstance(r, str) and not is_builtin_reward(r)]
    digests = {**source_digests(strategies, "strategy"), **source_digests(own_rewards, "reward")}
    return {"plugins": digests} if digests else {}


def train_grpo_process(
    accelerator,
    model,
    processing,
    prompts: list[Any],
    references: list[str],
    answers: list[str],
    config: GRPOConfig,
    reward_names: list[Reward],
    checkpoints: CheckpointStore | None,
    reward_metrics: Sequence[RewardMetric] = (),
    reward_columns: dict[str, list[Any]] | None = None,
    cache_bytes: dict[str, int] | None = None,
) -> tuple[Any, GRPOResult]:
    """One process of ``run_grpo`` (module level: spawned workers import it by name)."""
    rewards = BoundRewards(
        reward_names, references, answers, config.reward_options, columns=reward_columns
    )
    trainer = GRPOTrainer(
        grpo_policy(model, processing, config, cache_bytes),
        prompts,
        rewards,
        config,
        checkpoints,
        accelerator=accelerator,
        reward_metrics=reward_metrics,
    )
    result = trainer.train()
    if accelerator is not None and accelerator.is_fsdp2:
        return unsharded_copy(model).eval(), result  # rank 0's shards alone are not a model
    if accelerator is not None:
        model = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    return model.eval(), result


def run_grpo(
    model,
    processing,
    prompts: Sequence[Any],
    references: Sequence[str],
    answers: Sequence[str],
    config: GRPOConfig,
    reward_names: Sequence[Reward],
    checkpoints: CheckpointStore | None,
    distributed: dict[str, Any] | None = None,
    reward_metrics: Sequence[RewardMetric] = (),
    reward_columns: Mapping[str, Sequence[Any]] | None = None,
    cache_bytes: Mapping[str, int] | None = None,
) -> tuple[Any, GRPOResult]:
    """GRPO on a copy of ``model``, a text or a vision-language policy alike (ToR when
    ``config.token_weights`` names a ``tor*`` strategy).

    Resumes from ``checkpoints`` when a run with the same starting weights, prompts (a
    picture by its pixels' digest), references, answers, config, tokenizer (and image
    processor) and process count left one there (with the source of the modules of the
    strategies and rewards named by import path or entry point; the code of a callable reward
    and the columns it reads are not part of that key).

    Args:
        model: a causal LM or a vision-language model.
        processing: its tokenizer, or its processor (``policy_kinds.policy_kind``).
        prompts: texts or chat conversations; for a vision-language model, what
            ``rollout.as_visual_prompt`` accepts.
        reward_names: built-in reward names and TRL-style callables (``BoundRewards``),
            which get ``reward_columns`` (one value per prompt; ``rewards.reward_columns``).
        distributed: ``{"num_processes": N, "accelerate": {...Accelerator options...}}``
            runs the training data-parallel in N processes (``creditflow.training.launch``; a
            callable reward must then be importable by name, as the workers are spawned);
            None or N = 1 trains in this process. A text policy only, for now.
        reward_metrics: see ``GRPOTrainer``.
        cache_bytes: a vision-language policy's cache budgets (``grpo_policy``); they change
            no result, so they are not part of the checkpoint key.

    Raises:
        ConfigError: ``distributed`` asks for several processes for a kind of policy that
            does not run data-parallel yet.
    """
    distributed = check_distributed(distributed, config)
    num_processes = int(distributed.get("num_processes", 1))
    kind = policy_kind(processing)
    if (num_processes > 1 or distributed.get("accelerate")) and not kind.data_parallel:
        raise ConfigError(
            f"distributed: a {kind.name} policy trains in one process for now; drop "
            "grpo.distributed (or set num_processes: 1 without accelerate options)"
        )
    model = copy.deepcopy(model)
    prompts = kind.prompts(prompts)  # a picture is decoded once, here
    if checkpoints is not None:
        # Several processes sample differently, so their runs must not resume each other; a
        # sharded run's optimizer state is kept in another layout (training.fsdp).
        extra = {"num_processes": num_processes} if num_processes > 1 else {}
        if "fsdp" in (distributed.get("accelerate") or {}):
            extra["fsdp"] = True
        extra.update(_plugin_sources(config, reward_names))
        checkpoints = run_store(
            checkpoints,
            model,
            config.run_key(),
            kind.prompt_keys(prompts),
            list(references),
            list(answers),
            *kind.processing_keys(processing),
            *[extra] if extra else [],
        )
    return run_data_parallel(
        train_grpo_process,
        num_processes,
        args=(
            model,
            processing,
            prompts,
            list(references),
            list(answers),
            config,
            list(reward_names),
            checkpoints,
            list(reward_metrics),
            None if reward_columns is None else {k: list(v) for k, v in reward_columns.items()},
            None if cache_bytes is None else dict(cache_bytes),
        ),
        accelerate_config=distributed.get("accelerate"),
    )
