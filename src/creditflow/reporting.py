"""Tables and plots a person reads after a run (08_reporting)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # headless: figures are written to files, never shown

import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def plot_reward_curves(
    metrics: pd.DataFrame, columns: Sequence[str], group: str = "strategy"
) -> Figure:
    """One panel per metric column, one line per ``group`` value, against ``step``."""
    columns = [c for c in columns if c in metrics.columns]
    figure = Figure(figsize=(4.2 * len(columns), 3.4), layout="constrained")
    axes = figure.subplots(1, len(columns), squeeze=False)[0]
    for ax, column in zip(axes, columns, strict=True):
        for name, rows in metrics.groupby(group, sort=True):
            ax.plot(rows["step"], rows[column], marker=".", label=str(name))
        ax.set_title(column)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    return figure


def summarise_tapo_evaluations(
    evaluations: pd.DataFrame, training_metrics: pd.DataFrame, holdout_languages: Sequence[str]
) -> pd.DataFrame:
    """One row per policy: accuracy on seen / unseen (held-out) synthetic languages and on
    MGSM, mean chrF++ (translation reward), format rate, and the mean sign-conflict rate
    and final-step training reward seen in training (NaN for policies not trained by GRPO)."""
    synthetic = evaluations[evaluations["dataset"] == "synthetic"]
    unseen = synthetic["language"].isin(list(holdout_languages))
    mgsm = evaluations[evaluations["dataset"] == "mgsm"]
    rows = []
    for policy in evaluations["policy"].drop_duplicates():
        syn = synthetic["policy"] == policy
        row = {
            "policy": policy,
            "accuracy_seen": synthetic.loc[syn & ~unseen, "reward/reasoning"].mean(),
            "accuracy_unseen": synthetic.loc[syn & unseen, "reward/reasoning"].mean(),
            "chrf_seen": synthetic.loc[syn & ~unseen, "reward/translation"].mean(),
            "chrf_unseen": synthetic.loc[syn & unseen, "reward/translation"].mean(),
            "format_rate": synthetic.loc[syn, "reward/format"].mean(),
            "mgsm_accuracy": mgsm.loc[mgsm["policy"] == policy, "reward/reasoning"].mean(),
            "mgsm_format_rate": mgsm.loc[mgsm["policy"] == policy, "reward/format"].mean(),
        }
        trained = training_metrics[training_metrics["strategy"] == policy]
        if len(trained):
            row["train_sign_conflict_rate"] = trained.get(
                "adv/sign_conflict_rate", pd.Series(dtype=float)
            ).mean()
            row["train_reward_first"] = trained.sort_values("step")["reward/total"].iloc[0]
            row["train_reward_last"] = trained.sort_values("step")["reward/total"].iloc[-1]
        rows.append(row)
    return pd.DataFrame(rows)
