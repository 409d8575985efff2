"""One leaderboard across the benches (benchmarks/leaderboard.py, docs/results.md): per bench
and method, the gain over uniform GRPO with its 95 % interval and minimum detectable effect,
the robust aggregates over the Credit Gym's sweep points (interquartile mean and probability
of improvement, stratified-bootstrap intervals: ``reporting.robust``), the credit recovery on
the gym, and the verdicts of the claim cards that name the method.

Inputs are the benches' own per-seed tables: the gym's ``credit_gym_per_seed.csv`` (one row
per knob, dose, strategy and seed) and a testbed's per-seed comparison table (one row per
policy and seed, ``benchmarks/seeds.py`` / ``claims.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from creditflow.reporting.credit_gym import default_rows
from creditflow.reporting.robust import (
    interquartile_mean,
    probability_of_improvement,
    stratified_bootstrap,
)
from creditflow.reporting.stats import interval_text, minimum_detectable_effect, t_interval

KNOBS = ["decisive_fraction", "conflict", "perception", "fork_entropy", "noise"]
COLUMNS = [
    "bench",
    "method",
    "n_seeds",
    "gain",
    "gain_low",
    "gain_high",
    "gain_mde",
    "iqm",
    "iqm_low",
    "iqm_high",
    "p_improve",
    "p_improve_low",
    "p_improve_high",
    "recovery_auc",
    "recovery_pooled_spearman",
    "step_time_ratio",
    "verdicts",
]


def gym_scores(per_seed: pd.DataFrame, metric: str = "final_reward") -> dict[str, np.ndarray]:
    """Per strategy, its ``(seeds, points)`` scores: every distinct world of the sweep once (a
    point two knobs share, the default, appears once), the seeds and points in one order for
    every strategy. A strategy missing a (seed, point) of another is refused."""
    distinct = per_seed.drop_duplicates(["strategy", "seed", *KNOBS])
    wide = distinct.pivot_table(
        index="seed", columns=[*KNOBS, "strategy"], values=metric, aggfunc="first"
    )
    scores = {}
    for strategy in sorted(distinct["strategy"].unique()):
        table = wide.xs(strategy, axis=1, level="strategy")
        if table.isna().any().any():
            raise ValueError(f"strategy {strategy!r} lacks some (seed, point) of the sweep")
        scores[strategy] = table.to_numpy()
    return scores


def paired_gain(
    table: pd.DataFrame, metric: str, method: str, baseline: str, key: str = "strategy"
) -> dict[str, float]:
    """``method - baseline`` of ``metric``, paired by seed: mean, 95 % t interval, MDE."""
    wide = table.pivot_table(index="seed", columns=key, values=metric, aggfunc="first")
    differences = (wide[method] - wide[baseline]).dropna().to_numpy()
    mean, se, low, high = t_interval(differences)
    return {
        "n_seeds": len(differences),
        "gain": mean,
        "gain_low": low,
        "gain_high": high,
        "gain_mde": minimum_detectable_effect(se, len(differences)),
    }


def gym_leaderboard(
    per_seed: pd.DataFrame,
    defaults: Mapping[str, float],
    baseline: str = "grpo",
    cards: pd.DataFrame | None = None,
    step_time_ratio: Mapping[str, float] | None = None,
    reps: int = 2000,
) -> pd.DataFrame:
    """The gym's rows: per strategy, its gain over ``baseline`` in final reward at the default
    point (paired by seed), the IQM of its final reward over every point and seed, the
    probability that it improves on the baseline over the points, its recovery at the first
    step at the default point, ``step_time_ratio`` where measured, and the verdicts of the gym
    cards (``reporting.credit_gym.claim_cards``) whose policy it is."""
    scores = gym_scores(per_seed)
    at_default = default_rows(per_seed, defaults)
    rows = []
    for method, matrix in scores.items():
        iqm = stratified_bootstrap(interquartile_mean, matrix, reps=reps)
        improve = (
            stratified_bootstrap(probability_of_improvement, matrix, scores[baseline], reps=reps)
            if method != baseline
            else (np.nan, np.nan, np.nan)
        )
        recovery = at_default[at_default["strategy"] == method]
        row: dict[str, Any] = {
            "bench": "credit_gym",
            "method": method,
            **(
                paired_gain(at_default, "final_reward", method, baseline)
                if method != baseline
                else {"n_seeds": int(recovery["seed"].nunique())}
            ),
            "iqm": iqm[0],
            "iqm_low": iqm[1],
            "iqm_high": iqm[2],
            "p_improve": improve[0],
            "p_improve_low": improve[1],
            "p_improve_high": improve[2],
            "recovery_auc": recovery["recovery/auc@first"].mean(),
            "recovery_pooled_spearman": recovery.get(
                "recovery/pooled_spearman@first", pd.Series(dtype=float)
            ).mean(),
            "step_time_ratio": (step_time_ratio or {}).get(method, np.nan),
            "verdicts": _verdicts(cards, method),
        }
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def testbed_leaderboard(
    bench: str,
    per_seed: pd.DataFrame,
    metric: str,
    baseline: str,
    cards: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """A testbed's rows (tapo, tor): per trained policy, its gain over ``baseline`` in
    ``metric`` paired by seed, and the verdicts of the testbed's claim cards
    (``benchmarks/claims.py``) whose policy it is."""
    seeded = per_seed.dropna(subset=["seed"])
    rows = []
    for method in sorted(seeded["policy"].unique()):
        gain = (
            paired_gain(seeded, metric, method, baseline, key="policy")
            if method != baseline
            else {"n_seeds": int(seeded[seeded["policy"] == method]["seed"].nunique())}
        )
        rows.append(
            {"bench": bench, "method": method, **gain, "verdicts": _verdicts(cards, method)}
        )
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def _verdicts(cards: pd.DataFrame | None, method: str) -> str:
    """The cards whose policy is ``method`` (their ``difference`` reads ``policy - reference
    (metric)``, or ``policy / reference ...`` for a ratio): ``claim @ dose: verdict`` joined."""
    if cards is None or cards.empty or "difference" not in cards.columns:
        return ""
    policies = cards["difference"].fillna("").str.split(" ").str[0]
    found = []
    for _, row in cards[policies == method].iterrows():
        dose = row.get("dose")
        at = "" if dose is None or pd.isna(dose) else f" @ {dose:g}"
        found.append(f"{row['claim']}{at}: {row['verdict']}")
    return "; ".join(found)


def markdown(table: pd.DataFrame) -> str:
    """The leaderboard as a markdown table, intervals as ``mean [low, high]``."""
    head = (
        "| bench | method | seeds | gain over GRPO [95 % CI] (MDE) | IQM [95 % CI] | "
        "P(improves on GRPO) [95 % CI] | recovery AUC / pooled rho | step time x | verdicts |"
    )
    lines = [head, "|" + "---|" * 9]
    for _, r in table.iterrows():
        gain = (
            "-" if pd.isna(r["gain"]) else interval_text(r["gain"], r["gain_low"], r["gain_high"])
        )
        if not pd.isna(r["gain_mde"]):
            gain += f" ({r['gain_mde']:.3f})"
        iqm = "-" if pd.isna(r["iqm"]) else interval_text(r["iqm"], r["iqm_low"], r["iqm_high"])
        improve = (
            "-"
            if pd.isna(r["p_improve"])
            else f"{r['p_improve']:.2f} [{r['p_improve_low']:.2f}, {r['p_improve_high']:.2f}]"
        )
        recovery = (
            "-"
            if pd.isna(r["recovery_auc"])
            else f"{r['recovery_auc']:.2f} / {r['recovery_pooled_spearman']:.2f}"
        )
        ratio = "-" if pd.isna(r["step_time_ratio"]) else f"{r['step_time_ratio']:.2f}"
        cells = [r["bench"], r["method"], str(int(r["n_seeds"])), gain, iqm, improve, recovery]
        lines.append("| " + " | ".join([*cells, ratio, r["verdicts"] or "-"]) + " |")
    return "\n".join(lines)
