"""The ``grpo`` comparison table: evaluation rewards on the held-out prompts and training
statistics, per policy (pure functions of the evaluation and metrics tables)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from creditflow.reporting.stats import comparison_intervals
from creditflow.reporting.tables import SEED, WARM_START, training_reward_ends

SPLIT = "heldout"  # the interval columns' suffix: eval_reward_gain_heldout, ...
# Per-step training metrics reported as their mean over the run.
TRAINING_COLUMNS = {
    "completion/length": "completion_length",
    "actor/entropy": "entropy_mean",
    "time/step_s": "step_s",
}


def eval_rewards(evaluations: pd.DataFrame, weights: Mapping[str, float]) -> pd.Series:
    """Per row (one held-out prompt of one policy and seed) the evaluation reward: the
    ``weights``-weighted sum of the sampled rewards (``sampled/reward/<name>``, the mean over
    the prompt's sampled completions) where the evaluation drew samples, else of the greedy
    completion's (``reward/<name>``).

    >>> rows = pd.DataFrame({"reward/a": [1.0, 0.0], "sampled/reward/a": [0.5, 0.25]})
    >>> eval_rewards(rows, {"a": 2.0}).tolist()
    [1.0, 0.5]
    """
    prefix = "sampled/reward/" if _sampled(evaluations, weights) else "reward/"
    total = pd.Series(0.0, index=evaluations.index)
    for name, weight in weights.items():
        total = total + weight * evaluations[f"{prefix}{name}"].astype(float)
    return total


def summarise_grpo_evaluations(
    evaluations: pd.DataFrame, training_metrics: pd.DataFrame, weights: Mapping[str, float]
) -> pd.DataFrame:
    """One row per policy (the warm start, then each strategy): ``n_eval`` held-out prompts,
    ``eval_reward`` (``eval_rewards``' mean), per reward ``greedy_<name>`` and, with samples,
    ``sampled_<name>``; for GRPO-trained policies the training reward over the first / last
    5 steps (``training_reward_ends``) and the means of ``TRAINING_COLUMNS`` (NaN where the
    metrics lack one)."""
    sampled = _sampled(evaluations, weights)
    rows = []
    for policy in evaluations["policy"].drop_duplicates():
        evaluated = evaluations[evaluations["policy"] == policy]
        row: dict[str, object] = {
            "policy": policy,
            "n_eval": len(evaluated),
            "eval_reward": eval_rewards(evaluated, weights).mean(),
        }
        for name in weights:
            row[f"greedy_{name}"] = evaluated[f"reward/{name}"].mean()
            if sampled:
                row[f"sampled_{name}"] = evaluated[f"sampled/reward/{name}"].mean()
        trained = training_metrics[training_metrics["strategy"] == policy].sort_values("step")
        if len(trained):
            row.update(training_reward_ends(trained))
            for metric, column in TRAINING_COLUMNS.items():
                row[column] = trained[metric].mean() if metric in trained else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def grpo_intervals(
    evaluations: pd.DataFrame, weights: Mapping[str, float], baseline: str | None
) -> pd.DataFrame:
    """``reporting.stats.comparison_intervals`` of ``eval_reward``, paired by prompt ``id``
    and seed: ``eval_reward_gain_heldout`` over the warm start and
    ``eval_reward_vs_baseline_heldout`` to ``baseline``, each with ``_se_``, ``_ci_low_``,
    ``_ci_high_`` and ``_mde_`` columns. Indexed by policy."""
    scores = evaluations[["policy", SEED, "id"]].assign(value=eval_rewards(evaluations, weights))
    return comparison_intervals(scores, ["id"], WARM_START, baseline, "eval_reward", SPLIT)


def _sampled(evaluations: pd.DataFrame, weights: Mapping[str, float]) -> bool:
    columns = [f"sampled/reward/{name}" for name in weights]
    return all(c in evaluations for c in columns) and evaluations[columns].notna().all().all()
