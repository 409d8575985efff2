"""Thin nodes of the ``tapo`` pipeline; the work happens in creditflow.tasks/models/training."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from creditflow import api
from creditflow.ingest.source_rows import math_text_problems
from creditflow.models import to_policy_device
from creditflow.pipelines.comparison import labelled_tables
from creditflow.reporting.tables import (
    comparison_text,
    plot_reward_curves,
    summarise_over_seeds,
    summarise_per_seed,
    summarise_tapo_by_language,
    summarise_tapo_evaluations,
    tapo_intervals,
)
from creditflow.tasks.splits import (
    SYNTHETIC,
    evaluation_label,
    split_by_problem_id,
    split_options,
)
from creditflow.tasks.tapo import (
    format_tapo_target,
    generate_tapo_problems,
    split_by_language,
    tapo_evaluation_problems,
    tapo_prompt,
)
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.grpo_runs import strategy_config
from creditflow.training.strategies import SignConflictRate
from creditflow.training.threads import torch_threads

logger = logging.getLogger(__name__)

# The real evaluation set the evaluation node reads, by its label in the result tables: with
# that table as tapo.tasks.source, its held-out rows are the set's evaluation.
BENCHMARKS = {"mgsm": "mgsm_problems"}


def build_tapo_tasks(
    tapo_source_problems: pd.DataFrame | None, params: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Training and evaluation problems from ``tasks.source``. ``synthetic``: seeded
    multilingual problems, training rows without the held-out language(s), and an evaluation
    set (a different seed) over every language. A catalog dataset (``tapo_source_problems``,
    put there by ``hooks.task_source.TaskSourceHook``): its rows checked against the math-text
    schema and split by problem id, the held-out ids being the evaluation set."""
    tasks = params["tasks"]
    if tasks["source"] == SYNTHETIC:
        return _synthetic_tasks(params)
    problems = math_text_problems(tapo_source_problems, tasks["source"])
    return split_by_problem_id(problems, **split_options(tasks))


def train_tapo_tokenizer(tapo_train_tasks: pd.DataFrame, params: dict[str, Any]):
    """A byte-level BPE tokenizer trained on the task text, prompts and SFT targets (tiny
    policy), or the checkpoint's own (``api.build_tokenizer`` reads neither texts nor
    ``params['tokenizer']`` then)."""
    if params["policy"]["source"] != "tiny":  # a checkpoint's own: no task text, no options
        return api.build_tokenizer(params["policy"])
    texts = [tapo_prompt(q) for q in tapo_train_tasks["question"]]
    texts += _sft_targets(tapo_train_tasks)
    return api.build_tokenizer(params["policy"], texts, **params["tokenizer"])


def build_tapo_policy(tapo_tokenizer, params: dict[str, Any]):
    """The initial policy: a tiny Qwen2 from its config, or a pretrained checkpoint."""
    model, _ = api.build_policy(params["policy"], tapo_tokenizer)
    return model


def warm_start_tapo_policy(
    tapo_initial_policy,
    tapo_tokenizer,
    tapo_train_tasks: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
):
    """SFT on gold TAPO completions so the policy can produce the format before RL; resumes
    from ``checkpoints`` (a finished run with the same inputs is loaded, not retrained)."""
    dataset = _tapo_dataset(tapo_train_tasks).assign(target=_sft_targets(tapo_train_tasks))
    with torch_threads(params["torch_threads"]):
        return api.warm_start(
            to_policy_device(tapo_initial_policy, params["policy"]),
            tapo_tokenizer,
            dataset,
            params["sft"],
            checkpoints,
        )


def train_tapo_policy(
    tapo_sft_policy,
    tapo_tokenizer,
    tapo_train_tasks: pd.DataFrame,
    checkpoints: CheckpointStore | None,
    params: dict[str, Any],
    strategy: dict[str, Any],
):
    """One GRPO run from the warm start under one strategy (``strategy``: its overrides of
    ``params['grpo']``, seed included). Every strategy reports the sign-conflict rate of its
    rewards."""
    config, distributed = strategy_config(params, strategy)
    with torch_threads(params["torch_threads"]):
        trained = api.train_grpo(
            to_policy_device(tapo_sft_policy, params["policy"]),
            tapo_tokenizer,
            _tapo_dataset(tapo_train_tasks),
            params["reward_functions"],
            config,
            checkpoints=checkpoints,
            distributed=distributed,
            reward_metrics=[SignConflictRate()],
        )
    return trained.model, trained.metrics, trained.samples, trained.credit


def evaluate_tapo_policy(
    model,
    tapo_tokenizer,
    tapo_eval_tasks: pd.DataFrame,
    mgsm_problems: pd.DataFrame,
    params: dict[str, Any],
) -> pd.DataFrame:
    """Greedy completions on the evaluation problems of ``tasks.source`` (``dataset``: its
    label, ``_task_label``) and (capped) MGSM, scored with the training rewards, one row per
    problem; the source's rows also get ``sampled/reward/<name>``
    (``evaluation.samples_per_problem`` completions sampled as in training, from a seed every
    policy shares). With ``mgsm_problems`` as the source its held-out rows are the MGSM
    evaluation: no other MGSM row is evaluated (the rest were trained on)."""
    evaluation, sampling = params["evaluation"], params["grpo"]
    label = _task_label(params)
    problems = tapo_evaluation_problems(
        tapo_eval_tasks, mgsm_problems, evaluation["mgsm_max_per_language"], label
    )
    with torch_threads(params["torch_threads"]):
        table = api.evaluate(
            to_policy_device(model, params["policy"]),
            tapo_tokenizer,
            _tapo_dataset(problems),
            params["reward_functions"],
            max_new_tokens=evaluation["max_new_tokens"],
            batch_size=evaluation["batch_size"],
            samples_per_problem=evaluation.get("samples_per_problem", 0),
            sampled_rows=problems["dataset"] == label,
            temperature=sampling.get("temperature", 1.0),
            top_p=sampling.get("top_p", 1.0),
            seed=params["seed"],
        )
    return table.drop(columns="prompt")  # derived from `question`: the table does not keep it


def compare_tapo_strategies(
    params: dict[str, Any], tapo_results_sft: pd.DataFrame, **tables: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, Figure]:
    """The comparison table over seeds, the per-seed table and the reward curves (mean over
    seeds and a +-1 s.e. band). ``tables``: ``results/<strategy>`` and ``metrics/<strategy>``
    of every strategy.

    Per seed (``reporting.summarise_per_seed``): accuracy on seen/unseen languages and MGSM,
    chrF++, format rate, sampled evaluation reward and its gain over the warm start,
    sign-conflict rate in training. Over seeds (``reporting.summarise_over_seeds``): their
    means, and 95 % intervals of the sampled evaluation reward's gain over the warm start and
    difference to ``comparison.baseline`` (``reporting.tapo_intervals``). With a catalog source
    every language is seen, and a multilingual source adds one row per (policy, language)
    (``reporting.summarise_tapo_by_language``)."""
    evaluations, metrics = labelled_tables(params["strategies"], tapo_results_sft, tables)
    baseline = params["comparison"]["baseline"]
    if params["tasks"]["source"] == SYNTHETIC:
        holdout = params["tasks"]["holdout_languages"]
        summarise = partial(summarise_tapo_evaluations, holdout_languages=holdout)
        intervals = tapo_intervals(evaluations, holdout, SYNTHETIC, baseline)
    else:
        label = _task_label(params)
        summarise = partial(summarise_tapo_by_language, task_dataset=label)
        intervals = tapo_intervals(evaluations, [], label, baseline, by_language=True)
    per_seed = summarise_per_seed(evaluations, metrics, summarise)
    table = summarise_over_seeds(per_seed, intervals)
    logger.info(
        "TAPO comparison (every column: tapo_comparison.csv):\n%s",
        comparison_text(table, params["comparison"]["baseline"]),
    )
    curves = ["reward/total", "reward/reasoning", "reward/translation", "reward/format"]
    return table, per_seed, plot_reward_curves(metrics, curves)


def _synthetic_tasks(params: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    tasks = params["tasks"]
    common = {
        "max_operand": tasks["max_operand"],
        "operations": tasks["operations"],
        "variant": tasks["variant"],
    }
    train_all = generate_tapo_problems(
        tasks["n_train_per_language"], tasks["languages"], seed=params["seed"], **common
    )
    train, _ = split_by_language(train_all, tasks["holdout_languages"])
    evaluation = generate_tapo_problems(
        tasks["n_eval_per_language"], tasks["languages"], seed=params["seed"] + 10_000, **common
    )
    return train.reset_index(drop=True), evaluation


def _task_label(params: dict[str, Any]) -> str:
    """The ``dataset`` value of the task source's rows in the evaluation tables."""
    return evaluation_label(params["tasks"]["source"], BENCHMARKS)


def _tapo_dataset(problems: pd.DataFrame) -> pd.DataFrame:
    """``problems`` as an ``api`` dataset: each question's TAPO prompt added (the references
    are ``question_en``, the answers ``answer``)."""
    return problems.assign(prompt=[tapo_prompt(q) for q in problems["question"]])


def _sft_targets(tasks: pd.DataFrame) -> list[str]:
    return [
        format_tapo_target(q, a, r)
        for q, a, r in zip(
            tasks["question_en"], tasks["answer"], tasks["reasoning_en"], strict=True
        )
    ]
