"""Thin nodes of the ``tapo`` pipeline; the work happens in creditflow.tasks/models/training."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from creditflow.models import load_policy, load_tokenizer, train_bpe_tokenizer
from creditflow.reporting import plot_reward_curves, summarise_tapo_evaluations
from creditflow.tasks.tapo import (
    format_tapo_target,
    generate_tapo_problems,
    split_by_language,
    tapo_prompt,
)
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.evaluation import evaluate_text_policy, evaluate_text_policy_sampled
from creditflow.training.grpo_runs import (
    build_grpo_config,
    merge_overrides,
    run_grpo,
)
from creditflow.training.sft import run_sft
from creditflow.training.threads import torch_threads

logger = logging.getLogger(__name__)


def build_tapo_tasks(params: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seeded multilingual problems: training rows without the held-out language(s), and an
    evaluation set (a different seed) over every language, held-out ones included."""
    tasks = params["tasks"]
    common = {"max_operand": tasks["max_operand"], "operations": tasks["operations"]}
    train_all = generate_tapo_problems(
        tasks["n_train_per_language"], tasks["languages"], seed=params["seed"], **common
    )
    train, _ = split_by_language(train_all, tasks["holdout_languages"])
    evaluation = generate_tapo_problems(
        tasks["n_eval_per_language"], tasks["languages"], seed=params["seed"] + 10_000, **common
    )
    return train.reset_index(drop=True), evaluation


def train_tapo_tokenizer(tapo_train_tasks: pd.DataFrame, params: dict[str, Any]):
    """A byte-level BPE tokenizer trained on the task text (tiny policy), or the checkpoint's own."""
    if params["policy"]["source"] != "tiny":
        return load_tokenizer(params["policy"]["name_or_path"])
    texts = [tapo_prompt(q) for q in tapo_train_tasks["question"]]
    texts += _sft_targets(tapo_train_tasks)
    settings = params["tokenizer"]
    return train_bpe_tokenizer(
        texts,
        settings["vocab_size"],
        special_tokens=settings["special_tokens"],
        model_max_length=settings["model_max_length"],
    )


def build_tapo_policy(tapo_tokenizer, params: dict[str, Any]):
    """The initial policy: a tiny Qwen2 from its config, or a pretrained checkpoint."""
    model, _ = load_policy(params["policy"], tokenizer=tapo_tokenizer)
    return model


def warm_start_tapo_policy(
    tapo_initial_policy, tapo_tokenizer, tapo_train_tasks: pd.DataFrame, params: dict[str, Any]
):
    """SFT on gold TAPO completions so the policy can produce the format before RL."""
    prompts = [tapo_prompt(q) for q in tapo_train_tasks["question"]]
    with torch_threads(params["torch_threads"]):
        return run_sft(
            tapo_initial_policy,
            tapo_tokenizer,
            prompts,
            _sft_targets(tapo_train_tasks),
            params["sft"],
        )


def train_tapo_policy(
    tapo_sft_policy,
    tapo_tokenizer,
    tapo_train_tasks: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
    strategy: str,
):
    """GRPO from the warm start under one credit-assignment strategy of ``params['strategies']``."""
    grpo_params = strategy_params(params, strategy)
    distributed = grpo_params.pop("distributed", None)  # process layout, not a GRPOConfig field
    config = build_grpo_config(grpo_params, params["reward_functions"])
    with torch_threads(params["torch_threads"]):
        model, result = run_grpo(
            tapo_sft_policy,
            tapo_tokenizer,
            [tapo_prompt(q) for q in tapo_train_tasks["question"]],
            list(tapo_train_tasks["question_en"]),
            list(tapo_train_tasks["answer"]),
            config,
            params["reward_functions"],
            checkpoints,
            distributed,
        )
    metrics = pd.DataFrame(result.history).assign(strategy=strategy)
    samples = pd.DataFrame(result.samples).assign(strategy=strategy)
    return model, metrics, samples


def evaluate_tapo_policy(
    model,
    tapo_tokenizer,
    tapo_eval_tasks: pd.DataFrame,
    mgsm_problems: pd.DataFrame,
    params: dict[str, Any],
    label: str,
) -> pd.DataFrame:
    """Greedy completions on the synthetic evaluation set and (capped) MGSM, scored with the
    training rewards; one row per problem. With ``evaluation.samples_per_problem`` > 0 the
    synthetic rows also get ``sampled/reward/<name>``: the mean reward of that many completions
    sampled as in training (the quantity GRPO maximises), from a seed shared by every policy."""
    evaluation = params["evaluation"]
    mgsm = mgsm_problems.groupby("language", sort=True).head(evaluation["mgsm_max_per_language"])
    frames = [tapo_eval_tasks.assign(dataset="synthetic"), mgsm.assign(dataset="mgsm")]
    problems = pd.concat(frames, ignore_index=True)[
        ["dataset", "id", "language", "question", "question_en", "answer"]
    ]
    prompts = [tapo_prompt(q) for q in problems["question"]]
    with torch_threads(params["torch_threads"]):
        scored = evaluate_text_policy(
            model,
            tapo_tokenizer,
            prompts,
            list(problems["question_en"]),
            list(problems["answer"]),
            params["reward_functions"],
            max_new_tokens=evaluation["max_new_tokens"],
            batch_size=evaluation["batch_size"],
        )
    table = pd.concat([problems, scored], axis=1).assign(policy=label)
    k = evaluation.get("samples_per_problem", 0)
    if k:
        synthetic = table["dataset"] == "synthetic"
        sampling = params["grpo"]
        with torch_threads(params["torch_threads"]):
            sampled = evaluate_text_policy_sampled(
                model,
                tapo_tokenizer,
                [prompt for prompt, keep in zip(prompts, synthetic, strict=True) if keep],
                list(table.loc[synthetic, "question_en"]),
                list(table.loc[synthetic, "answer"]),
                params["reward_functions"],
                max_new_tokens=evaluation["max_new_tokens"],
                samples_per_prompt=k,
                temperature=sampling.get("temperature", 1.0),
                top_p=sampling.get("top_p", 1.0),
                batch_size=evaluation["batch_size"],
                seed=params["seed"],
            )
        sampled.index = table.index[synthetic]
        table = table.join(sampled.add_prefix("sampled/"))
    return table


def compare_tapo_strategies(
    params: dict[str, Any], *tables: pd.DataFrame, n_evaluations: int
) -> tuple[pd.DataFrame, Figure]:
    """The comparison table (accuracy on seen/unseen languages and MGSM, chrF++, format rate,
    sign-conflict rate in training) and the reward curves per strategy. ``tables`` holds
    ``n_evaluations`` evaluation tables, then the training-metrics tables."""
    evaluations = pd.concat(tables[:n_evaluations], ignore_index=True)
    metrics = pd.concat(tables[n_evaluations:], ignore_index=True)
    table = summarise_tapo_evaluations(evaluations, metrics, params["tasks"]["holdout_languages"])
    logger.info("TAPO comparison:\n%s", table.to_string(index=False))
    return table, plot_reward_curves(
        metrics, ["reward/total", "reward/reasoning", "reward/translation", "reward/format"]
    )


def strategy_params(params: dict[str, Any], strategy: str) -> dict[str, Any]:
    if strategy not in params["strategies"]:
        raise ValueError(
            f"unknown strategy {strategy!r}; parameters define {sorted(params['strategies'])}"
        )
    return merge_overrides(params["grpo"], params["strategies"][strategy])


def _sft_targets(tasks: pd.DataFrame) -> list[str]:
    return [
        format_tapo_target(q, a, r)
        for q, a, r in zip(
            tasks["question_en"], tasks["answer"], tasks["reasoning_en"], strict=True
        )
    ]
