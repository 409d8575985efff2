"""Recipes: the glue between Kedro nodes and the engine for a language policy.

A node passes its inputs and ``params:`` dict; a recipe validates the parameters first,
then builds the policy, runs SFT or GRPO, and returns plain results (model, tables).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

import pandas as pd

from creditflow.rollout import LanguagePolicy, SamplingSettings
from creditflow.training.checkpoint import CheckpointStore, state_fingerprint
from creditflow.training.config import ConfigError, GRPOConfig
from creditflow.training.evaluation import TextRewards
from creditflow.training.grpo import GRPOResult, GRPOTrainer
from creditflow.training.sft import SFTConfig, train_sft
from creditflow.training.strategies import ADVANTAGE_STRATEGIES

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


def build_grpo_config(grpo_params: dict[str, Any], reward_names: Sequence[str]) -> GRPOConfig:
    """A validated ``GRPOConfig`` whose rewards, weighted or read by the advantage strategy
    (TAPO's ``translation_reward`` / ``reasoning_reward``), all exist in ``reward_names``."""
    config = GRPOConfig.from_params(dict(grpo_params))
    unknown = sorted(set(config.rewards) - set(reward_names))
    if unknown:
        raise ConfigError(
            f"rewards {unknown} are weighted but not computed; computed rewards are "
            f"{sorted(reward_names)} (add them to 'reward_functions' or drop the weight)"
        )
    advantage = ADVANTAGE_STRATEGIES[config.advantage["name"]]
    unread = sorted(advantage.reward_names(config.advantage) - set(reward_names))
    if unread:
        raise ConfigError(
            f"advantage {config.advantage['name']!r} reads rewards {unread} that are not "
            f"computed; computed rewards are {sorted(reward_names)} (add them to "
            f"'reward_functions' or fix the advantage's *_reward options)"
        )
    return config


def language_policy(model, tokenizer, config: GRPOConfig) -> LanguagePolicy:
    sampling = SamplingSettings(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        entropy_top_p=config.entropy_top_p,
    )
    return LanguagePolicy(model, tokenizer, sampling)


def run_sft(
    model, tokenizer, prompts: Sequence[str], targets: Sequence[str], sft_params: dict
) -> tuple[Any, pd.DataFrame]:
    """SFT a copy of ``model``; returns it and the per-step metrics table."""
    config = SFTConfig.from_params(dict(sft_params))
    model = copy.deepcopy(model)
    history = train_sft(model, tokenizer, list(prompts), list(targets), config)
    return model.eval(), pd.DataFrame(history)


def run_grpo(
    model,
    tokenizer,
    prompts: Sequence[str],
    references: Sequence[str],
    answers: Sequence[str],
    config: GRPOConfig,
    reward_names: Sequence[str],
    checkpoints: CheckpointStore | None,
) -> tuple[Any, GRPOResult]:
    """GRPO on a copy of ``model``; resumes from ``checkpoints`` when a run with the same
    starting weights, prompts and config left one there."""
    model = copy.deepcopy(model)
    if checkpoints is not None:
        run_id = state_fingerprint(model, config.to_dict(), list(prompts), list(answers))
        checkpoints = checkpoints.subdirectory(run_id)
        logger.info("GRPO checkpoints in %s", checkpoints.directory)
    rewards = TextRewards(reward_names, references, answers)
    trainer = GRPOTrainer(
        language_policy(model, tokenizer, config), prompts, rewards, config, checkpoints
    )
    result = trainer.train()
    return model.eval(), result
