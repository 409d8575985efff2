"""Tables and plots a person reads after a run (08_reporting)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import matplotlib
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from creditflow.reporting.stats import (  # noqa: E402
    comparison_intervals,
    interval_basis,
    interval_text,
)

matplotlib.use("Agg")  # headless: figures are written to files, never shown

SEED = "seed"  # the GRPO seed column of the seeded tables (pipelines.comparison.SEED)
WARM_START = "sft"  # the warm start's policy label (pipelines.comparison.WARM_START)


def metrics_frame(history: Sequence[Mapping[str, float]] | pd.DataFrame) -> pd.DataFrame:
    """Per-step engine history (rows, or a frame of them) -> a ``*_metrics`` table with an
    integer ``step`` column (the MLflow hook logs one point per step and rejects fractional
    steps)."""
    frame = history.copy() if isinstance(history, pd.DataFrame) else pd.DataFrame(list(history))
    if "step" in frame.columns:
        frame["step"] = frame["step"].round().astype("int64")
    return frame


def plot_reward_curves(
    metrics: pd.DataFrame, columns: Sequence[str], group: str = "strategy"
) -> Figure:
    """One panel per metric column, one line per ``group`` value, against ``step``.

    With a ``seed`` column holding several seeds (the repeated GRPO runs of a comparison) each
    line is the mean over seeds at that step and a shaded band +-1 standard error of that
    mean (across seeds, n - 1); the legend's title says so. One seed: the run's own line.
    """
    columns = [c for c in columns if c in metrics.columns]
    n_seeds = metrics[SEED].nunique() if SEED in metrics.columns else 1
    figure = Figure(figsize=(4.2 * len(columns), 3.4), layout="constrained")
    axes = figure.subplots(1, len(columns), squeeze=False)[0]
    for ax, column in zip(axes, columns, strict=True):
        for name, rows in metrics.groupby(group, sort=True):
            by_step = rows.groupby("step")[column]
            mean = by_step.mean()
            (line,) = ax.plot(mean.index, mean.to_numpy(), marker=".", label=str(name))
            if n_seeds > 1:
                se = by_step.sem()  # NaN at a step only one seed reached: no band there
                ax.fill_between(
                    mean.index, mean - se, mean + se, color=line.get_color(), alpha=0.2, lw=0
                )
        ax.set_title(column)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    title = f"mean of {n_seeds} seeds, band ±1 s.e." if n_seeds > 1 else None
    axes[0].legend(fontsize="small", title=title, title_fontsize="small")
    return figure


def summarise_tapo_evaluations(
    evaluations: pd.DataFrame,
    training_metrics: pd.DataFrame,
    holdout_languages: Sequence[str],
    baseline: str | None = "sft",
    task_dataset: str = "synthetic",
) -> pd.DataFrame:
    """One row per policy: greedy accuracy on seen / unseen (held-out) languages of the task
    rows (``dataset == task_dataset``: the synthetic problems, or a catalog source's held-out
    ones) and on MGSM, mean chrF++ (translation reward), format rate; when the evaluation
    sampled, the expected evaluation reward under training-time sampling (``eval_reward_*`` =
    translation + reasoning, its parts ``sampled_*`` and the samples' format rate) and,
    when ``baseline`` names an evaluated policy (the warm start), the gain over it paired by
    problem (``id`` and ``language``)
    (``eval_reward_gain_*`` and its standard error ``eval_reward_gain_se_*``); and the mean
    sign-conflict rate and the training reward over the first / last 5 steps (NaN for
    policies not trained by GRPO)."""
    synthetic = evaluations[evaluations["dataset"] == task_dataset]
    unseen = synthetic["language"].isin(list(holdout_languages))
    gains = _paired_sampled_gains(synthetic, unseen, baseline)
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
            **_sampled_rewards(synthetic, syn, unseen),
            **gains.get(policy, {}),
            "mgsm_accuracy": mgsm.loc[mgsm["policy"] == policy, "reward/reasoning"].mean(),
            "mgsm_format_rate": mgsm.loc[mgsm["policy"] == policy, "reward/format"].mean(),
        }
        trained = training_metrics[training_metrics["strategy"] == policy]
        if len(trained):
            row["train_sign_conflict_rate"] = trained.get(
                "adv/sign_conflict_rate", pd.Series(dtype=float)
            ).mean()
            row.update(training_reward_ends(trained))
        rows.append(row)
    return pd.DataFrame(rows)


def summarise_tapo_by_language(
    evaluations: pd.DataFrame,
    training_metrics: pd.DataFrame,
    task_dataset: str,
    baseline: str | None = "sft",
) -> pd.DataFrame:
    """``summarise_tapo_evaluations`` for a catalog task source, whose languages are all
    trained on (every task row is "seen"). A source with one language gives the same table;
    a multilingual one adds a ``language`` column: ``"all"`` on each policy's row, then one
    row per (policy, language) with the evaluation columns of that language's rows (the
    training columns only on the ``"all"`` rows, as training mixes the languages)."""
    table = summarise_tapo_evaluations(evaluations, training_metrics, [], baseline, task_dataset)
    tasks = evaluations[evaluations["dataset"] == task_dataset]
    languages = sorted(tasks["language"].unique())
    if len(languages) < 2:
        return table
    untrained = training_metrics.iloc[:0]
    parts = [table.assign(language="all")]
    for language in languages:
        rows = evaluations[evaluations["language"] == language]
        part = summarise_tapo_evaluations(rows, untrained, [], baseline, task_dataset)
        parts.append(part.assign(language=language))
    out = pd.concat(parts, ignore_index=True)
    order = {policy: i for i, policy in enumerate(table["policy"])}
    out = out.sort_values("policy", key=lambda p: p.map(order), kind="stable")
    first = ["policy", "language"]
    return out[first + [c for c in out.columns if c not in first]].reset_index(drop=True)


def training_reward_ends(trained: pd.DataFrame, window: int = 5) -> dict[str, float]:
    """Mean training reward (``reward/total``) over the first and over the last ``window``
    steps of one run (``train_reward_first`` / ``train_reward_last``; the windows overlap
    when the run has fewer than ``2 * window`` steps). One step's reward (16 prompts) is too
    noisy to read a trend from."""
    reward = trained.sort_values("step")["reward/total"]
    return {
        "train_reward_first": float(reward.iloc[:window].mean()),
        "train_reward_last": float(reward.iloc[-window:].mean()),
    }


def _sampled_rewards(synthetic: pd.DataFrame, rows: pd.Series, unseen: pd.Series) -> dict:
    """Expected rewards under training-time sampling (``sampled/reward/<name>`` columns of
    ``evaluate_tapo_policy``), seen and unseen languages: ``eval_reward`` is translation +
    reasoning (the reward TAPO and summed GRPO train on), plus its two parts. Empty when the
    evaluation drew no samples."""
    if "sampled/reward/reasoning" not in synthetic:
        return {}
    out = {}
    for split, where in (("seen", rows & ~unseen), ("unseen", rows & unseen)):
        part = synthetic.loc[where]
        out[f"eval_reward_{split}"] = _sampled_eval_reward(part).mean()
        out[f"sampled_accuracy_{split}"] = part["sampled/reward/reasoning"].mean()
        out[f"sampled_chrf_{split}"] = _sampled_translation(part).mean()
    if "sampled/reward/format" in synthetic:
        # Greedy decoding of even the warm start is almost always well-formed; under sampling
        # a few % of completions break the format (default run: 5.6 % for the warm start,
        # 3.3 % after summed GRPO).
        out["sampled_format_rate"] = synthetic.loc[rows, "sampled/reward/format"].mean()
    return out


def _sampled_translation(rows: pd.DataFrame) -> pd.Series:
    """Per-row sampled translation reward; 0 when the evaluation did not compute one."""
    return rows.get("sampled/reward/translation", pd.Series(0.0, index=rows.index))


def _sampled_eval_reward(rows: pd.DataFrame) -> pd.Series:
    """Per-row eval reward: sampled translation + reasoning reward (what TAPO and summed GRPO
    train on)."""
    return _sampled_translation(rows) + rows["sampled/reward/reasoning"]


def _paired_sampled_gains(
    synthetic: pd.DataFrame, unseen: pd.Series, baseline: str | None
) -> dict[str, dict[str, float]]:
    """policy -> {eval_reward_gain_<split>, eval_reward_gain_se_<split>}: the mean over
    problems (joined on ``id``, and ``language`` where there is one: a multilingual source's
    id names one problem in every language) of the policy's sampled translation + reasoning
    reward minus the baseline's, and the standard error of that mean (sample std / sqrt(n),
    NaN for n < 2). Pairing removes the between-problem spread that the two means share.
    Empty without sampled columns, an ``id`` column or the baseline policy."""
    needed = {"id", "sampled/reward/reasoning"}
    if baseline is None or not needed <= set(synthetic):
        return {}
    if baseline not in set(synthetic["policy"]):
        return {}
    keys = ["id", "language"] if "language" in synthetic else ["id"]
    frame = synthetic[keys].assign(
        policy=synthetic["policy"], unseen=unseen, r=_sampled_eval_reward(synthetic)
    )
    base = frame[frame["policy"] == baseline].set_index(keys)["r"]
    out: dict[str, dict[str, float]] = {}
    for policy, rows in frame.groupby("policy", sort=False):
        if policy == baseline:
            continue
        out[policy] = {}
        for split, is_unseen in (("seen", False), ("unseen", True)):
            part = rows[rows["unseen"] == is_unseen].set_index(keys)["r"]
            diff = (part - base.reindex(part.index)).dropna()
            n = len(diff)
            out[policy][f"eval_reward_gain_{split}"] = float(diff.mean()) if n else np.nan
            out[policy][f"eval_reward_gain_se_{split}"] = (
                float(diff.std(ddof=1) / np.sqrt(n)) if n >= 2 else np.nan
            )
    return out


# ---------------------------------------------------------------- seeds
def summarise_per_seed(
    evaluations: pd.DataFrame,
    training_metrics: pd.DataFrame,
    summarise: Callable[[pd.DataFrame, pd.DataFrame], pd.DataFrame],
    warm_start: str = WARM_START,
) -> pd.DataFrame:
    """A comparison table (``summarise(evaluations, training_metrics)``, one row per policy,
    e.g. ``summarise_tapo_evaluations``) seed by seed: the warm start's rows once (``seed``
    empty), then each strategy's rows of each seed, strategies in table order.

    ``evaluations`` and ``training_metrics``: the strategies' rows carry their GRPO ``seed``,
    the warm start's rows none (NaN); each seed's table sees the warm start and that seed.
    """
    seeds = sorted(evaluations[SEED].dropna().unique())
    parts = []
    for index, seed in enumerate(seeds):
        rows = evaluations[SEED].eq(seed) | evaluations["policy"].eq(warm_start)
        table = summarise(evaluations[rows], training_metrics[training_metrics[SEED] == seed])
        is_warm = table["policy"] == warm_start
        table = table[~is_warm] if index else table
        seed_column = pd.array([pd.NA if w else int(seed) for w in is_warm[table.index]], "Int64")
        parts.append(table.assign(**{SEED: seed_column}))
    per_seed = pd.concat(parts, ignore_index=True)
    order = {policy: i for i, policy in enumerate(evaluations["policy"].drop_duplicates())}
    per_seed = per_seed.sort_values("policy", key=lambda p: p.map(order), kind="stable")
    keys = _row_keys(per_seed)
    return per_seed[[*keys, SEED] + [c for c in per_seed if c not in {*keys, SEED}]].reset_index(
        drop=True
    )


def summarise_over_seeds(per_seed: pd.DataFrame, intervals: pd.DataFrame) -> pd.DataFrame:
    """The comparison table from ``summarise_per_seed``'s: per policy (and ``language``, where
    the table has one) the mean over seeds of every numeric column, with ``n_seeds`` and
    ``ci_basis`` (``reporting.stats.interval_basis``; empty for the warm start) after the keys.

    ``intervals``: ``reporting.stats.comparison_intervals`` columns indexed like the keys; a
    column of it that the per-seed table also has (``eval_reward_gain_seen``, its ``_se_``)
    replaces the mean of that column: a standard error is not averaged over seeds but
    recomputed over them.
    """
    keys = _row_keys(per_seed)
    values = [c for c in per_seed.select_dtypes("number").columns if c != SEED]
    table = per_seed.groupby(keys, sort=False)[values].mean()
    n_seeds = per_seed.groupby(keys, sort=False)[SEED].nunique()
    table.insert(0, "n_seeds", n_seeds.where(n_seeds > 0).astype("Int64"))
    table.insert(1, "ci_basis", [interval_basis(n) if n else None for n in n_seeds])
    if len(intervals.columns):
        intervals = intervals.reindex(table.index)
        for column in intervals.columns:
            table[column] = intervals[column]
    return table.reset_index()


def tapo_intervals(
    evaluations: pd.DataFrame,
    holdout_languages: Sequence[str],
    task_dataset: str,
    baseline: str | None,
    by_language: bool = False,
    warm_start: str = WARM_START,
) -> pd.DataFrame:
    """``reporting.stats.comparison_intervals`` of the tapo table: the sampled evaluation
    reward (translation + reasoning, ``eval_reward``) of the task rows, paired by problem
    (``id``, and ``language``) and seed, on the seen and on the unseen languages
    (``eval_reward_gain_seen``, ``eval_reward_vs_baseline_ci_low_unseen``, ...). Indexed by
    policy; with ``by_language`` and several languages by (policy, language), for
    ``summarise_tapo_by_language``'s rows (``"all"``, then each language; every language is
    seen). Empty without sampled columns."""
    tasks = evaluations[evaluations["dataset"] == task_dataset]
    if "sampled/reward/reasoning" not in tasks or not len(tasks):
        return pd.DataFrame(index=pd.Index([], name="policy"))
    keys = ["id", "language"] if "language" in tasks else ["id"]
    scores = tasks[["policy", SEED, *keys]].assign(value=_sampled_eval_reward(tasks))
    unseen = (
        tasks["language"].isin(list(holdout_languages))
        if "language" in tasks
        else pd.Series(False, index=tasks.index)
    )

    def split(rows: pd.DataFrame, name: str) -> pd.DataFrame:
        return comparison_intervals(rows, keys, warm_start, baseline, "eval_reward", name)

    overall = pd.concat([split(scores[~unseen], "seen"), split(scores[unseen], "unseen")], axis=1)
    languages = sorted(scores["language"].unique()) if "language" in scores else []
    if not by_language or len(languages) < 2:  # one language: one row per policy
        return overall
    parts = [overall.assign(language="all")]
    for language in languages:
        part = split(scores[scores["language"] == language], "seen")
        parts.append(part.assign(language=language))
    return pd.concat(parts).set_index("language", append=True)


def _row_keys(table: pd.DataFrame) -> list[str]:
    """The columns naming a row of a comparison table: ``policy``, and ``language`` where the
    table has one (``summarise_tapo_by_language``)."""
    return [k for k in ("policy", "language") if k in table.columns]


# A comparison table's interval columns: <metric>_gain_<split> / <metric>_vs_baseline_<split>
# (the mean), each with _se_, _ci_low_, _ci_high_ and _mde_ siblings.
_INTERVAL = re.compile(r"(?P<metric>.+)_(?P<kind>gain|vs_baseline)_(?P<split>[a-z0-9]+)$")


def comparison_text(table: pd.DataFrame, baseline: str | None = None) -> str:
    """A comparison table as a log reads it without a wide terminal: one block per row (its
    policy, and language where the table has one), then one line per interval,
    ``reporting.stats.interval_text``: ``mean [low, high]``, a null with its minimum
    detectable effect. The table itself (every column) is the saved CSV.

    >>> table = pd.DataFrame(
    ...     {
    ...         "policy": ["sft", "grpo"],
    ...         "ci_basis": [None, "problems (1 seed)"],
    ...         "eval_reward": [0.25, 0.5],
    ...         "eval_reward_gain_heldout": [float("nan"), 0.01],
    ...         "eval_reward_gain_ci_low_heldout": [float("nan"), -0.02],
    ...         "eval_reward_gain_ci_high_heldout": [float("nan"), 0.04],
    ...         "eval_reward_gain_mde_heldout": [float("nan"), 0.05],
    ...     }
    ... )
    >>> print(comparison_text(table))
    sft: eval_reward 0.250
    grpo (problems (1 seed)): eval_reward 0.500
      eval_reward gain over sft (heldout): +0.010 [-0.020, +0.040] not detectable (MDE 0.050)
    """
    intervals = [m for c in table.columns if (m := _INTERVAL.match(c)) and "_ci_" not in c]
    intervals = [m for m in intervals if not m["metric"].endswith(("_se", "_mde"))]
    means = sorted({m["metric"] for m in intervals} & set(table.columns))
    lines = []
    for _, row in table.iterrows():
        name = str(row["policy"]) + (f" [{row['language']}]" if "language" in table else "")
        basis = f" ({row['ci_basis']})" if isinstance(row.get("ci_basis"), str) else ""
        values = ", ".join(f"{metric} {row[metric]:.3f}" for metric in means)
        lines.append(f"{name}{basis}: {values}")
        for match in intervals:
            metric, kind, split = match["metric"], match["kind"], match["split"]
            mean = row[match.string]
            if pd.isna(mean):
                continue
            low, high, mde = (
                row.get(f"{metric}_{kind}_{part}_{split}") for part in ("ci_low", "ci_high", "mde")
            )
            against = "over sft" if kind == "gain" else f"vs {baseline or 'the baseline'}"
            lines.append(
                f"  {metric} {'gain ' if kind == 'gain' else ''}{against} ({split}): {interval_text(mean, low, high, mde)}"
            )
    return "\n".join(lines)
