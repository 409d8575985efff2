"""The Credit Gym's reports (docs/methods/credit_gym.md): the per-seed table of a sweep turned
into the dose-response table (means over seeds with 95 % t intervals, paired differences with
the baseline and their minimum detectable effect), its figure, and the claim cards read from it.

The per-seed table has one row per (knob, dose, strategy, seed) with the knob values, the
recovery scores ``recovery/auc@first`` ... and the learning scores ``final_reward`` (exact
expected reward as a share of the optimum), ``gain`` (its rise from the warm start) and
``steps_to_target``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from creditflow.reporting.stats import interval_text, minimum_detectable_effect, t_interval

RECOVERY = [
    f"recovery/{s}@{at}"
    for s in ("auc", "spearman", "pooled_spearman")
    for at in ("first", "middle", "last")
]
LEARNING = ["final_reward", "gain", "steps_to_target"]
DIAGNOSTICS = ["conflict/sign_rate@first"]


def dose_response(per_seed: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """One row per (knob, dose, strategy, metric): the mean over seeds with its 95 % t
    interval, and the paired difference ``strategy - baseline`` (same seed, same world) with
    its interval and minimum detectable effect at 80 % power (NaN for the baseline itself)."""
    if baseline not in set(per_seed["strategy"]):
        raise ValueError(
            f"baseline {baseline!r} is not among the strategies {sorted(set(per_seed['strategy']))}"
        )
    metrics = [m for m in [*LEARNING, *RECOVERY, *DIAGNOSTICS] if m in per_seed]
    rows = []
    for (knob, dose), point in per_seed.groupby(["knob", "dose"], sort=False):
        for metric in metrics:
            wide = point.pivot_table(
                index="seed", columns="strategy", values=metric, aggfunc="first"
            )
            for strategy in wide.columns:
                values = wide[strategy].dropna().to_numpy()
                mean, _, low, high = t_interval(values)
                diff = (wide[strategy] - wide[baseline]).dropna().to_numpy()
                d_mean, d_se, d_low, d_high = (
                    t_interval(diff) if strategy != baseline else (np.nan,) * 4
                )
                rows.append(
                    {
                        "knob": knob,
                        "dose": dose,
                        "strategy": strategy,
                        "metric": metric,
                        "n_seeds": len(values),
                        "mean": mean,
                        "ci_low": low,
                        "ci_high": high,
                        "diff_mean": d_mean,
                        "diff_low": d_low,
                        "diff_high": d_high,
                        "mde": minimum_detectable_effect(d_se, len(diff)),
                    }
                )
    return pd.DataFrame(rows)


def dose_response_figure(table: pd.DataFrame, baseline: str) -> Figure:
    """One row of panels per knob: each strategy's final-reward gain over ``baseline`` (paired,
    95 % band) and its recovery AUC at the first step (95 % band) against the dose."""
    knobs = list(dict.fromkeys(table["knob"]))
    fig = Figure(figsize=(13, 2.8 * len(knobs)), layout="constrained")
    axes = fig.subplots(len(knobs), 2, squeeze=False)
    panels = [
        ("final_reward", "diff", f"final reward - {baseline}"),
        ("recovery/auc@first", "", "recovery AUC (first step)"),
    ]
    strategies = list(dict.fromkeys(table["strategy"]))
    # Ten colours, then the same ten dashed with another marker: every strategy its own line.
    colours = {s: f"C{i % 10}" for i, s in enumerate(strategies)}
    styles = {s: ("-", "o") if i < 10 else ("--", "s") for i, s in enumerate(strategies)}
    for row, knob in enumerate(knobs):
        for col, (metric, kind, label) in enumerate(panels):
            ax = axes[row][col]
            part = table[(table["knob"] == knob) & (table["metric"] == metric)]
            for strategy, group in part.groupby("strategy", sort=False):
                if kind == "diff" and strategy == baseline:
                    continue
                curve = group.sort_values("dose")
                mean, low, high = (
                    (curve["diff_mean"], curve["diff_low"], curve["diff_high"])
                    if kind == "diff"
                    else (curve["mean"], curve["ci_low"], curve["ci_high"])
                )
                line, marker = styles[strategy]
                ax.plot(
                    curve["dose"], mean, ls=line, marker=marker, color=colours[strategy],
                    label=strategy,
                )  # fmt: skip
                ax.fill_between(curve["dose"], low, high, color=colours[strategy], alpha=0.12)
            ax.axhline(0.0 if kind == "diff" else 0.5, color="grey", lw=0.8, ls="--")
            ax.set_xlabel(knob)
            ax.set_ylabel(label)
    handles, labels = axes[0][1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="outside right upper")
    fig.suptitle("Credit Gym: dose-response (mean over seeds, 95 % intervals)")
    return fig


@dataclass(frozen=True)
class GymClaim:
    """``policy - reference`` on ``metric`` is expected to have sign ``expected`` at the doses
    ``at`` of ``knob``: ``"each"`` (a threshold card: the smallest dose from which every larger
    one is reproduced), ``"max"`` / ``"min"`` (the largest / smallest dose), ``"default"`` (the
    point where every knob has its default). ``ratio``: the per-seed ``policy / reference``
    of ``metric`` minus ``ratio`` instead of the difference (a share-of-gain card)."""

    name: str
    knob: str
    policy: str
    reference: str
    expected: int
    at: str
    source: str
    metric: str = "final_reward"
    ratio: float | None = None


GYM_CLAIMS = (
    GymClaim("shuffled advantages < uniform GRPO (positive control)", "conflict",
             "shuffled_advantages", "grpo", -1, "default", "the gym itself: credit unrelated to reward must not learn"),
    GymClaim("oracle weights > uniform GRPO (positive control)", "conflict", "oracle", "grpo",
             +1, "default", "the gym itself: credit on exactly the decisive tokens must learn faster"),
    GymClaim("TAPO > summed GRPO once the conflict share is at least x", "conflict", "tapo",
             "grpo", +1, "each", "TAPO: step-level advantages beat trajectory-level ones"),
    GymClaim("ToR > uniform once perception dependence is at least y", "perception", "tor",
             "grpo", +1, "each", "ToR: reweighting reasoning and perception tokens"),
    GymClaim("top-20 % entropy >= all tokens when forks are high-entropy", "fork_entropy",
             "high_entropy_20", "grpo", +1, "max", "Wang et al. 2025: the high-entropy minority"),
    GymClaim("top-20 % entropy < all tokens when forks are not high-entropy", "fork_entropy",
             "high_entropy_20", "grpo", -1, "min", "the gym's construction: no fork is high-entropy"),
    GymClaim("random 20 % of tokens keeps most (> 50 %) of full GRPO's gain", "conflict",
             "random_20", "grpo", +1, "default", "a 2026 paper reports 97.8 %", metric="gain",
             ratio=0.5),
)  # fmt: skip

REPRODUCED, CONTRADICTED, NO_INTERVAL = "reproduced", "contradicted", "no interval"
IDENTICAL = "identical: no signal at this budget"
NOT_RUN = "not run: a strategy or knob of the card is absent from the sweep"


def verdict(expected: int, low: float, high: float, mde: float) -> str:
    """The reading of a 95 % interval of ``policy - reference`` (as ``benchmarks/claims.py``
    reads its cards): reproduced / contradicted when it excludes 0, else not detectable at
    this budget with its MDE.

    >>> verdict(+1, 0.01, 0.03, 0.02), verdict(+1, -0.02, 0.03, 0.04)
    ('reproduced', 'not detectable at this budget (MDE 0.040)')
    """
    if pd.isna(low) or pd.isna(high):
        return NO_INTERVAL
    if low > 0 or high < 0:
        return REPRODUCED if (low > 0) == (expected > 0) else CONTRADICTED
    return f"not detectable at this budget (MDE {mde:.3f})"


def default_rows(per_seed: pd.DataFrame, defaults: Mapping[str, float]) -> pd.DataFrame:
    """The rows at the point where every knob has its default, one per (strategy, seed)."""
    at = np.logical_and.reduce([np.isclose(per_seed[k], v) for k, v in defaults.items()])
    return per_seed[at].drop_duplicates(["strategy", "seed"])


def claim_cards(
    per_seed: pd.DataFrame, defaults: Mapping[str, float], claims: Sequence[GymClaim] = GYM_CLAIMS
) -> pd.DataFrame:
    """One row per (card, dose judged): the paired per-seed differences, their 95 % t
    interval, MDE and verdict; a threshold card's rows carry its ``threshold`` (NaN when no
    dose reproduces it for good)."""
    rows: list[dict[str, Any]] = []
    for claim in claims:
        if not {claim.policy, claim.reference} <= set(per_seed["strategy"]):
            rows.append({"claim": claim.name, "knob": claim.knob, "verdict": NOT_RUN})
            continue
        if claim.at == "default":
            points = [(float("nan"), default_rows(per_seed, defaults))]
        else:
            swept = per_seed[per_seed["knob"] == claim.knob]
            if swept.empty:
                rows.append({"claim": claim.name, "knob": claim.knob, "verdict": NOT_RUN})
                continue
            doses = sorted(set(swept["dose"]))
            doses = {"max": doses[-1:], "min": doses[:1]}.get(claim.at, doses)
            points = [(d, swept[swept["dose"] == d]) for d in doses]
        card = [_card_row(claim, dose, point) for dose, point in points]
        if claim.at == "each":
            threshold = float("nan")
            for row in reversed(card):
                if row["verdict"] != REPRODUCED:
                    break
                threshold = row["dose"]
            for row in card:
                row["threshold"] = threshold
        rows += card
    return pd.DataFrame(rows)


def _card_row(claim: GymClaim, dose: float, point: pd.DataFrame) -> dict[str, Any]:
    wide = point.pivot_table(index="seed", columns="strategy", values=claim.metric, aggfunc="first")
    if claim.ratio is None:
        values = wide[claim.policy] - wide[claim.reference]
        what = f"{claim.policy} - {claim.reference} ({claim.metric})"
    else:
        values = wide[claim.policy] / wide[claim.reference] - claim.ratio
        what = f"{claim.policy} / {claim.reference} ({claim.metric}) - {claim.ratio}"
    values = values.replace([np.inf, -np.inf], np.nan).dropna().to_numpy()
    mean, se, low, high = t_interval(values)
    mde = minimum_detectable_effect(se, len(values))
    # Every seed's difference 0 up to float rounding: the two strategies trained the same
    # policy (TAPO at conflict 0, whose two rewards are equal, is summed GRPO up to rounding).
    identical = len(values) > 0 and np.allclose(values, 0.0, atol=1e-5)
    return {
        "claim": claim.name,
        "knob": claim.knob,
        "dose": dose,
        "difference": what,
        "expected": "> 0" if claim.expected > 0 else "< 0",
        "n_seeds": len(values),
        "measured": interval_text(mean, low, high),
        "mean": mean,
        "ci_low": low,
        "ci_high": high,
        "mde": mde,
        "verdict": IDENTICAL if identical else verdict(claim.expected, low, high, mde),
        "source": claim.source,
    }
