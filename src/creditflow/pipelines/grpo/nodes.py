"""Thin nodes of the ``grpo`` pipeline; the work happens in creditflow.tasks/ingest/api/training."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from creditflow import api
from creditflow.ingest.source_rows import prompt_rows
from creditflow.models import to_policy_device
from creditflow.pipelines.comparison import labelled_tables
from creditflow.pipelines.grpo.report import grpo_intervals, summarise_grpo_evaluations
from creditflow.reporting.tables import (
    comparison_text,
    plot_reward_curves,
    summarise_over_seeds,
    summarise_per_seed,
)
from creditflow.tasks.prompts import PROMPT, prompt_texts, reward_dataset, synthetic_prompt_split
from creditflow.tasks.prompts import sft_targets as prompt_sft_targets
from creditflow.tasks.splits import SYNTHETIC, split_by_problem_id, split_options
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.grpo_runs import strategy_config
from creditflow.training.threads import torch_threads

logger = logging.getLogger(__name__)


def build_grpo_tasks(
    grpo_source_prompts: pd.DataFrame | None, params: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Training and held-out prompts from ``tasks.source``: the synthetic questions
    (``tasks.prompts.synthetic_prompt_split``), or a catalog dataset (put under
    ``grpo_source_prompts`` by ``hooks.task_source.TaskSourceHook``) checked against the
    prompts schema (``ingest.source_rows.prompt_rows``) and split by id. Before anything
    trains, checks that the rewards find their columns and SFT its target."""
    tasks = params["tasks"]
    if tasks["source"] == SYNTHETIC:
        options = {k: tasks[k] for k in ("kinds", "max_operand", "word_length")}
        train, heldout = synthetic_prompt_split(
            tasks["n_train"], tasks["n_eval"], seed=params["seed"], **options
        )
        prompts = train
    else:
        prompts = prompt_rows(grpo_source_prompts, tasks["source"])
        train, heldout = split_by_problem_id(prompts, **split_options(tasks))
    # On the whole set, so an error names the row as the source has it.
    api.as_dataset(reward_dataset(prompts), params["reward_functions"])
    if params["sft"]["steps"] > 0:
        _sft_targets(prompts, params)
    return train, heldout


def train_grpo_tokenizer(grpo_train_tasks: pd.DataFrame, params: dict[str, Any]):
    """A byte-level BPE tokenizer trained on the prompts and SFT targets (tiny policy), or the
    checkpoint's own."""
    if params["policy"]["source"] != "tiny":  # a checkpoint's own: no task text, no options
        return api.build_tokenizer(params["policy"])
    texts = prompt_texts(grpo_train_tasks[PROMPT])
    if params["tasks"]["sft_target"] in grpo_train_tasks:
        texts += _sft_targets(grpo_train_tasks, params)
    return api.build_tokenizer(params["policy"], texts, **params["tokenizer"])


def build_grpo_policy(grpo_tokenizer, params: dict[str, Any]):
    """The initial policy: a tiny Qwen2 from its config, or a pretrained checkpoint."""
    model, _ = api.build_policy(params["policy"], grpo_tokenizer)
    return model


def warm_start_grpo_policy(
    grpo_initial_policy,
    grpo_tokenizer,
    grpo_train_tasks: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
):
    """SFT on the ``tasks.sft_target`` column after each prompt (``sft.steps: 0`` passes the
    policy through); resumes from ``checkpoints``."""
    dataset = pd.DataFrame({PROMPT: [], "target": []})
    if params["sft"]["steps"] > 0:
        dataset = pd.DataFrame(
            {PROMPT: grpo_train_tasks[PROMPT], "target": _sft_targets(grpo_train_tasks, params)}
        )
    with torch_threads(params["torch_threads"]):
        return api.warm_start(
            to_policy_device(grpo_initial_policy, params["policy"]),
            grpo_tokenizer,
            dataset,
            params["sft"],
            checkpoints,
        )


def train_grpo_policy(
    grpo_sft_policy,
    grpo_tokenizer,
    grpo_train_tasks: pd.DataFrame,
    checkpoints: CheckpointStore | None,
    params: dict[str, Any],
    strategy: dict[str, Any],
):
    """One GRPO run from the warm start under one strategy (its overrides of
    ``params['grpo']``, seed included), on the training prompts with ``reward_functions``."""
    config, distributed = strategy_config(params, strategy)
    with torch_threads(params["torch_threads"]):
        trained = api.train_grpo(
            to_policy_device(grpo_sft_policy, params["policy"]),
            grpo_tokenizer,
            reward_dataset(grpo_train_tasks),
            params["reward_functions"],
            config,
            checkpoints=checkpoints,
            distributed=distributed,
        )
    return trained.model, trained.metrics, trained.samples, trained.credit


def evaluate_grpo_policy(
    model, grpo_tokenizer, grpo_eval_tasks: pd.DataFrame, params: dict[str, Any]
) -> pd.DataFrame:
    """The held-out prompts scored by the training rewards: one row per prompt with ``id``,
    the greedy ``completion``, its ``reward/<name>`` and, with
    ``evaluation.samples_per_problem`` > 0, ``sampled/reward/<name>`` (the mean over that many
    completions sampled as in training, from a seed every policy shares). The prompt set's
    other columns are not kept (any types, which the rewards read but Parquet need not hold)."""
    evaluation, sampling = params["evaluation"], params["grpo"]
    with torch_threads(params["torch_threads"]):
        table = api.evaluate(
            to_policy_device(model, params["policy"]),
            grpo_tokenizer,
            reward_dataset(grpo_eval_tasks),
            params["reward_functions"],
            max_new_tokens=evaluation["max_new_tokens"],
            batch_size=evaluation["batch_size"],
            samples_per_problem=evaluation["samples_per_problem"],
            temperature=sampling.get("temperature", 1.0),
            top_p=sampling.get("top_p", 1.0),
            seed=params["seed"],
        )
    scores = [c for c in table.columns if c.startswith(("reward/", "sampled/reward/"))]
    return table[["id", "completion", *scores]]


def compare_grpo_strategies(
    params: dict[str, Any], grpo_results_sft: pd.DataFrame, **tables: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, Figure]:
    """The comparison table over seeds, the per-seed table and the reward curves. ``tables``:
    ``results/<strategy>`` and ``metrics/<strategy>`` of every strategy.

    Per seed (``report.summarise_grpo_evaluations``): the held-out evaluation reward and each
    reward's greedy and sampled means, the training reward's first and last steps. Over seeds:
    their means, and 95 % intervals (with minimum detectable effects) of the evaluation
    reward's gain over the warm start and difference to ``comparison.baseline``, paired by
    prompt (``report.grpo_intervals``)."""
    evaluations, metrics = labelled_tables(params["strategies"], grpo_results_sft, tables)
    weights = evaluation_weights(params)
    summarise = partial(summarise_grpo_evaluations, weights=weights)
    per_seed = summarise_per_seed(evaluations, metrics, summarise)
    intervals = grpo_intervals(evaluations, weights, params["comparison"]["baseline"])
    table = summarise_over_seeds(per_seed, intervals)
    logger.info(
        "GRPO comparison (every column: grpo_comparison.csv):\n%s",
        comparison_text(table, params["comparison"]["baseline"]),
    )
    curves = ["reward/total", *(f"reward/{name}" for name in weights)]
    return table, per_seed, plot_reward_curves(metrics, list(dict.fromkeys(curves)))


def evaluation_weights(params: dict[str, Any]) -> dict[str, float]:
    """Reward name -> weight in ``eval_reward``: ``evaluation.reward_weights``, else 1 for
    each of ``reward_functions``."""
    weights = params["evaluation"].get("reward_weights")
    return dict(weights) if weights else dict.fromkeys(params["reward_functions"], 1.0)


def _sft_targets(tasks: pd.DataFrame, params: dict[str, Any]) -> list[str]:
    """The SFT target after each prompt: the ``tasks.sft_target`` column as text
    (``tasks.prompts.sft_targets``, which names what is wrong and the keys that fix it)."""
    return prompt_sft_targets(
        tasks, params["tasks"]["sft_target"], params["tasks"]["source"], params["sft"]["steps"]
    )
