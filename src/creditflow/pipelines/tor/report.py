"""The ``tor`` comparison table (08_reporting): accuracy per evaluation set and strategy, the
token-selection statistics seen in training and the step time."""

from __future__ import annotations

import pandas as pd

from creditflow.reporting.stats import comparison_intervals
from creditflow.reporting.tables import SEED, WARM_START, training_reward_ends

EVALUATION_SETS = ("synthetic", "tabmwp", "mathvision")
# Per problem: the mean accuracy of the completions sampled as in training
# (``evaluate_tor_policy`` with ``evaluation.samples_per_problem`` > 0).
SAMPLED_ACCURACY = "sampled/reward/reasoning"
# Training metrics averaged over the steps of each run, and their column in the table.
TRAINING_COLUMNS = {
    "tor/reasoning_frac": "reasoning_frac",
    "tor/perception_frac": "perception_frac",
    "tor/selected_frac": "selected_frac",
    "tor/overlap_frac": "overlap_frac",
    "tor/entropy_selected": "entropy_selected",
    "tor/entropy_unselected": "entropy_unselected",
    "tor/sensitivity_selected": "sensitivity_selected",
    "tor/sensitivity_unselected": "sensitivity_unselected",
    "actor/entropy": "entropy_mean",
    "completion/length": "completion_length",
    "time/step_s": "step_s",
    "time/rollout_s": "rollout_s",
    "time/update_s": "update_s",
    "time/no_image_pass_s": "no_image_pass_s",
    "time/tor_weights_s": "tor_weights_s",
}


def summarise_tor_runs(
    evaluations: pd.DataFrame, training_metrics: pd.DataFrame, baseline: str = "uniform"
) -> pd.DataFrame:
    """One row per policy (the warm start, then each strategy).

    Columns: ``accuracy_<set>`` (mean ``reward/reasoning`` of the greedy answers) and
    ``n_<set>`` per evaluation set (``EVALUATION_SETS``, then any other ``dataset`` of the
    evaluations: a catalog task source's held-out rows, by its name), and
    ``sampled_accuracy_<set>`` for a set evaluated with samples too (``SAMPLED_ACCURACY``, the
    mean accuracy of the completions sampled as in training); for GRPO-trained policies the
    training reward over the first / last 5 steps and the per-step means of ``TRAINING_COLUMNS`` (NaN where a strategy
    does not report one, e.g. selection statistics for ``uniform``), and
    ``step_overhead_vs_uniform``: the mean step time relative to the ``baseline`` run's, minus 1.
    """
    others = sorted(set(evaluations["dataset"]) - set(EVALUATION_SETS))
    rows = []
    for policy in evaluations["policy"].drop_duplicates():
        evaluated = evaluations[evaluations["policy"] == policy]
        row: dict[str, object] = {"policy": policy}
        for name in (*EVALUATION_SETS, *others):
            scores = evaluated.loc[evaluated["dataset"] == name, "reward/reasoning"]
            row[f"accuracy_{name}"] = scores.mean()
            row[f"n_{name}"] = len(scores)
            if SAMPLED_ACCURACY in evaluated:
                sampled = evaluated.loc[evaluated["dataset"] == name, SAMPLED_ACCURACY].dropna()
                if len(sampled):
                    row[f"sampled_accuracy_{name}"] = sampled.mean()
        trained = training_metrics[training_metrics["strategy"] == policy].sort_values("step")
        if len(trained):
            row.update(training_reward_ends(trained))
            row["train_reward_mean"] = trained["reward/total"].mean()
            for metric, column in TRAINING_COLUMNS.items():
                row[column] = trained[metric].mean() if metric in trained else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows)
    if "step_s" in table and (table["policy"] == baseline).any():
        base = table.loc[table["policy"] == baseline, "step_s"].iloc[0]
        table["step_overhead_vs_uniform"] = table["step_s"] / base - 1.0
    return table


def tor_intervals(
    evaluations: pd.DataFrame, task_dataset: str, baseline: str | None
) -> pd.DataFrame:
    """``reporting.stats.comparison_intervals`` of the tor table on the held-out problems of
    the task source (``dataset == task_dataset``), paired by problem ``id`` and seed:
    ``accuracy_gain_<set>`` over the warm start and ``accuracy_vs_baseline_<set>`` to
    ``baseline`` for the greedy accuracy (``reward/reasoning``), the same
    ``sampled_accuracy_*`` columns for the sampled accuracy where the evaluation has it
    (``SAMPLED_ACCURACY``), each with ``_se_``, ``_ci_low_``, ``_ci_high_`` and ``_mde_`` columns.
    Indexed by policy."""
    tasks = evaluations[evaluations["dataset"] == task_dataset]
    metrics = {"accuracy": "reward/reasoning"}
    if SAMPLED_ACCURACY in tasks and tasks[SAMPLED_ACCURACY].notna().all():
        metrics["sampled_accuracy"] = SAMPLED_ACCURACY
    parts = []
    for metric, column in metrics.items():
        scores = tasks[["policy", SEED, "id"]].assign(value=tasks[column])
        parts.append(
            comparison_intervals(scores, ["id"], WARM_START, baseline, metric, task_dataset)
        )
    return pd.concat(parts, axis=1)
