"""The experience chain's reports: ExpModel scores against the hidden quality and the teacher,
rankers by popularity band, paired gains, sweeps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from creditflow.chain.ab_test.controls import R_OLD_ONLY, SHUFFLED_EXP
from creditflow.chain.annotation.schema import DIMENSIONS, QUERY_COLUMN  # noqa: E402
from creditflow.chain.expmodel.data import (
    TRAIN,
    UNSEEN,
    is_per_query,
    ok_annotations,
    pairs_within,
    split_ids,
)
from creditflow.chain.expmodel.pft import pair_accuracy
from creditflow.chain.expmodel.scoring import pair_scores
from creditflow.chain.reranker.training import EVALUATION_METRICS, summarise_by_band  # noqa: E402


# ---------------------------------------------------------------- experience model / reranking
def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b between two equally long sequences (ties corrected, as
    ``scipy.stats.kendalltau``); NaN with fewer than two values or a constant sequence.

    ``tau_b = (concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y))`` over the
    ``n0 = n (n - 1) / 2`` pairs, ``ties_x`` the pairs tied in ``x`` (whatever ``y`` does).

    >>> kendall_tau([1, 2, 3], [1, 3, 2])  # pairs (1,2) +, (1,3) +, (2,3) -: (2 - 1) / 3
    0.3333333333333333
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"need two 1-d sequences of one length, got {x.shape} and {y.shape}")
    n = len(x)
    score = ties_x = ties_y = 0.0
    # One row of the pair matrix at a time: O(n) memory for catalogues of any size.
    for i in range(n - 1):
        sx, sy = np.sign(x[i + 1 :] - x[i]), np.sign(y[i + 1 :] - y[i])
        score += float((sx * sy).sum())
        ties_x += float((sx == 0).sum())
        ties_y += float((sy == 0).sum())
    pairs = n * (n - 1) / 2
    denominator = np.sqrt((pairs - ties_x) * (pairs - ties_y))
    return float(score / denominator) if denominator > 0 else float("nan")


EXPERIENCE_TARGETS = ("quality", *DIMENSIONS)  # per-item rows of ``evaluate_experience_scores``
QUERY_TARGET = "query_quality"  # its per-(query, item) row


def evaluate_experience_scores(  # noqa: PLR0913 - the scores, the truths and the splits
    catalogue: pd.DataFrame,
    annotations: pd.DataFrame,
    scores: pd.DataFrame,
    item_split: pd.DataFrame,
    pairs: pd.DataFrame,
    sessions: pd.DataFrame | None = None,
    query_annotations: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """How well ``s_exp`` ranks the items, on the ExpModel's training items and on unseen ones.

    One row per target of ``EXPERIENCE_TARGETS``: ``quality`` (the hidden ``true_quality``;
    the annotator's ``overall``) and each dimension ``d`` (``true_<d>``; the annotator's score
    ``d``). Columns: ``kendall_tau_s_exp`` (every scored item), ``kendall_tau_in_sample``
    (``TRAIN`` items of ``item_split``), ``kendall_tau_unseen`` (``UNSEEN`` items, which no
    SFT or PFT step saw), the annotator's ``kendall_tau_annotation`` and
    ``kendall_tau_annotation_unseen`` (its ok items; the teacher's ceiling), the item counts,
    and ``pair_accuracy_in_sample`` / ``pair_accuracy_unseen``: the share of preference
    ``pairs`` (annotated A > B, ``preference_pairs``) with both items train / unseen that
    ``s_exp`` orders the same way (ties half; NaN without such pairs), on the ``quality`` row
    for per-item pairs and on the ``QUERY_TARGET`` row for per-query ones.

    Scores per (query, item) (``expmodel_sft.score_mode: query``) enter the per-item rows as
    each item's mean s_{q,v} over the queries it was scored for: a summary, since a query-aware
    score also carries relevance to the query.

    With ``sessions`` (the logs, with their hidden per-candidate ``true_quality``: relevance to
    the query times the item's quality) one more row, ``QUERY_TARGET``, is what y_aug and page
    GRPO use, the order *within* a query: the mean over queries of Kendall tau(s, truth) over
    the query's distinct candidates (train / unseen: the candidates of that split; queries
    with fewer than two such are skipped), with per-item scores read as the same score under
    every query. Its annotator columns use ``query_annotations`` (per (query, item), or per
    item: ``annotations``) on the annotated pairs. Its ``items`` / ``unseen_items`` count
    (query, item) pairs. Without a hidden truth (a catalogue of your own) the tau columns are
    NaN.
    """
    s_exp = item_level_scores(scores)
    ok = ok_annotations(annotations).drop_duplicates("item_id").set_index("item_id")
    truth = catalogue.set_index("item_id")
    sides = {TRAIN: split_ids(item_split, TRAIN), UNSEEN: split_ids(item_split, UNSEEN)}

    def tau(values: pd.Series, column: str, ids: set | None = None) -> float:
        if column not in truth.columns:
            return float("nan")
        kept = values if ids is None else values[values.index.isin(ids)]
        return kendall_tau(kept, truth.loc[kept.index, column])

    def accuracy(ids: set) -> float:
        inside = pairs_within(pairs, ids)
        if inside.empty:
            return float("nan")
        return pair_accuracy(*pair_scores(inside, scores))

    per_query_pairs = is_per_query(pairs)
    rows = []
    for target in EXPERIENCE_TARGETS:
        column, annotated = (
            ("true_quality", "overall") if target == "quality" else (f"true_{target}", target)
        )
        with_pairs = target == "quality" and not per_query_pairs
        rows.append(
            {
                "target": target,
                "items": len(s_exp),
                "unseen_items": int(s_exp.index.isin(sides[UNSEEN]).sum()),
                "kendall_tau_s_exp": tau(s_exp, column),
                "kendall_tau_in_sample": tau(s_exp, column, sides[TRAIN]),
                "kendall_tau_unseen": tau(s_exp, column, sides[UNSEEN]),
                "annotated_items": len(ok),
                "kendall_tau_annotation": tau(ok[annotated], column),
                "kendall_tau_annotation_unseen": tau(ok[annotated], column, sides[UNSEEN]),
                "pair_accuracy_in_sample": accuracy(sides[TRAIN]) if with_pairs else float("nan"),
                "pair_accuracy_unseen": accuracy(sides[UNSEEN]) if with_pairs else float("nan"),
            }
        )
    if sessions is not None:
        judged = annotations if query_annotations is None else query_annotations
        row = _query_row(scores, judged, sessions, sides)
        row["pair_accuracy_in_sample"] = accuracy(sides[TRAIN]) if per_query_pairs else np.nan
        row["pair_accuracy_unseen"] = accuracy(sides[UNSEEN]) if per_query_pairs else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def item_level_scores(scores: pd.DataFrame) -> pd.Series:
    """``s_exp`` by ``item_id``: the scores as they are, or each item's mean s_{q,v} over its
    queries for per-query scores."""
    if is_per_query(scores):
        return scores.groupby("item_id", sort=True)["s_exp"].mean()
    return scores.set_index("item_id")["s_exp"]


def query_truth(sessions: pd.DataFrame) -> pd.DataFrame:
    """``query_text, item_id, true_quality``: the hidden per-(query, candidate) quality of the
    sessions (relevance to the query times the item's quality, fixed per pair), once per pair;
    empty without a ``true_quality`` column.

    >>> logs = pd.DataFrame(
    ...     {
    ...         "query_text": ["a", "a"],
    ...         "candidates": [[1, 2], [2, 3]],
    ...         "true_quality": [[0.5, 0.1], [0.1, 0.9]],
    ...     }
    ... )
    >>> query_truth(logs).values.tolist()
    [['a', 1, 0.5], ['a', 2, 0.1], ['a', 3, 0.9]]
    """
    columns = [QUERY_COLUMN, "item_id", "true_quality"]
    if "true_quality" not in sessions.columns:
        return pd.DataFrame(columns=columns)
    rows = [
        (query, item, float(value))
        for query, items, values in zip(
            sessions[QUERY_COLUMN], sessions["candidates"], sessions["true_quality"], strict=True
        )
        for item, value in zip(items, values, strict=True)
    ]
    return pd.DataFrame(rows, columns=columns).drop_duplicates([QUERY_COLUMN, "item_id"])


def mean_query_tau(frame: pd.DataFrame, score: str, truth: str) -> float:
    """Mean over the queries of ``frame`` (``QUERY_COLUMN`` and the two columns) of Kendall
    tau(``score``, ``truth``) within the query; NaN taus (under two candidates, constant
    columns) are skipped, NaN when none is left.

    >>> frame = pd.DataFrame(
    ...     {"query_text": ["a", "a", "a", "b", "b"], "s": [1, 2, 3, 1, 2], "t": [1, 3, 2, 2, 1]}
    ... )
    >>> mean_query_tau(frame, "s", "t")  # a: 1/3, b: -1
    -0.33333333333333337
    """
    taus = [
        kendall_tau(part[score].to_numpy(), part[truth].to_numpy())
        for _, part in frame.groupby(QUERY_COLUMN, sort=True)
        if len(part) >= 2
    ]
    taus = [t for t in taus if not np.isnan(t)]
    return float(np.mean(taus)) if taus else float("nan")


def _query_row(
    scores: pd.DataFrame,
    annotations: pd.DataFrame,
    sessions: pd.DataFrame,
    sides: Mapping[str, set],
) -> dict[str, object]:
    """The ``QUERY_TARGET`` row of ``evaluate_experience_scores`` (its pair accuracies aside)."""
    truth = query_truth(sessions)
    if is_per_query(scores):
        truth = truth.merge(scores, on=[QUERY_COLUMN, "item_id"], how="inner")
    else:
        truth = truth.merge(scores, on="item_id", how="inner")
    ok = ok_annotations(annotations)
    keys = [QUERY_COLUMN, "item_id"] if is_per_query(ok) else ["item_id"]
    judged = truth.merge(ok.drop_duplicates(keys)[[*keys, "overall"]], on=keys, how="inner")

    def tau(frame: pd.DataFrame, column: str, ids: set | None = None) -> float:
        kept = frame if ids is None else frame[frame["item_id"].isin(ids)]
        return mean_query_tau(kept, column, "true_quality")

    return {
        "target": QUERY_TARGET,
        "items": len(truth),
        "unseen_items": int(truth["item_id"].isin(sides[UNSEEN]).sum()),
        "kendall_tau_s_exp": tau(truth, "s_exp"),
        "kendall_tau_in_sample": tau(truth, "s_exp", sides[TRAIN]),
        "kendall_tau_unseen": tau(truth, "s_exp", sides[UNSEEN]),
        "annotated_items": len(judged),
        "kendall_tau_annotation": tau(judged, "overall"),
        "kendall_tau_annotation_unseen": tau(judged, "overall", sides[UNSEEN]),
    }


def summarise_rankers_by_band(per_session: pd.DataFrame, group: str = "ranker") -> pd.DataFrame:
    """``summarise_by_band`` for each ranker of a long per-session evaluation table: one row per
    (ranker, band), bands ``head``, ``torso``, ``tail`` then ``all``, rankers in table order."""
    frames = [
        summarise_by_band(rows).reset_index().assign(**{group: name})
        for name, rows in per_session.groupby(group, sort=False)
    ]
    table = pd.concat(frames, ignore_index=True)
    first = [group, "band", "sessions"]
    return table[first + [c for c in table.columns if c not in first]]


def plot_metrics_by_band(
    table: pd.DataFrame, columns: Sequence[str], group: str = "ranker"
) -> Figure:
    """One panel per metric column: grouped bars, one group of bars per ``band`` and one bar
    per ``group`` value (in table order), with +-1 standard error bars where the table has
    ``<column>_se`` (``summarise_by_band``: across sessions, unpaired)."""
    columns = [c for c in columns if c in table.columns]
    bands = list(dict.fromkeys(table["band"]))
    names = list(dict.fromkeys(table[group]))
    figure = Figure(figsize=(4.6 * len(columns), 3.9), layout="constrained")
    axes = figure.subplots(1, len(columns), squeeze=False)[0]
    width = 0.8 / max(len(names), 1)
    positions = np.arange(len(bands))
    # tab20 past ten rankers: the default cycle repeats its ten colours.
    palette = matplotlib.colormaps["tab20" if len(names) > 10 else "tab10"]
    for ax, column in zip(axes, columns, strict=True):
        for offset, name in enumerate(names):
            rows = table[table[group] == name].set_index("band").reindex(bands)
            errors = rows[f"{column}_se"] if f"{column}_se" in rows.columns else None
            ax.bar(
                positions + (offset - (len(names) - 1) / 2) * width,
                rows[column],
                width,
                yerr=errors,
                capsize=2,
                error_kw={"linewidth": 0.8},
                label=name,
                color=palette(offset % palette.N),
            )
        ax.set_xticks(positions, bands)
        ax.set_title(column if f"{column}_se" not in table.columns else f"{column} (±1 s.e.)")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    # Above the panels, not inside one: bars fill every panel's height.
    # At most five labels a row: one row of every ranker runs past the figure's edges.
    figure.legend(
        handles, labels, loc="outside upper center", ncols=min(len(names), 5), fontsize="small"
    )
    return figure


def plot_sweep(
    sweep: pd.DataFrame,
    field: str,
    columns: Sequence[str],
    bands: Sequence[str] = ("all", "tail"),
    group: str = "ranker",
    mark: float | None = None,
) -> Figure:
    """One panel per (band, metric column) of a sweep table (one row per ``field`` value,
    ``group`` and ``band``): a line per ``group`` value against ``field``, with +-1 standard
    error bars from ``<column>_se``, a dashed line at 0 and a dotted one at ``mark`` (e.g. the
    default value of ``field``)."""
    bands = [b for b in bands if b in set(sweep["band"])]
    figure = Figure(figsize=(4.8 * len(columns), 3.4 * len(bands)), layout="constrained")
    axes = figure.subplots(len(bands), len(columns), squeeze=False)
    for row, band in enumerate(bands):
        rows = sweep[sweep["band"] == band]
        for ax, column in zip(axes[row], columns, strict=True):
            for name, unsorted in rows.groupby(group, sort=False):
                part = unsorted.sort_values(field)
                errors = part[f"{column}_se"] if f"{column}_se" in part.columns else None
                ax.errorbar(
                    part[field],
                    part[column],
                    yerr=errors,
                    marker="o",
                    ms=3,
                    capsize=2,
                    linewidth=1,
                    label=name,
                )
            ax.axhline(0.0, color="grey", linestyle="--", linewidth=0.8)
            if mark is not None:
                ax.axvline(mark, color="grey", linestyle=":", linewidth=0.8)
            ax.set_xlabel(field)
            ax.set_title(f"{column}, {band}")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside upper center", ncols=4, fontsize="small")
    return figure


def paired_gains_by_band(
    per_session: pd.DataFrame, references: Mapping[str, str], group: str = "ranker"
) -> pd.DataFrame:
    """The gain of each ranker over its reference on the same sessions, per band.

    ``references`` maps a ranker of ``per_session`` (an ``evaluate_rankings`` table with a
    ``group`` column) to the one it is compared with, e.g. a reranker reading s_exp to the same
    reranker reading zeros. Per (ranker, band: ``head``, ``torso``, ``tail``, ``all``) the mean
    per-session difference of every metric (``<metric>_gain``) and its paired standard error
    (``<metric>_gain_se``: the std of the differences / sqrt(n), NaN for one session), which is
    the one to judge a difference by: rankers on the same sessions share their noise.
    """
    metrics = [c for c in EVALUATION_METRICS if c in per_session.columns]
    present = set(per_session[group])
    unknown = sorted((set(references) | set(references.values())) - present)
    if unknown:
        raise ValueError(f"rankers {unknown} are not in the table; it has {sorted(present)}")
    keys = ["session_id", "query_frequency_band"]
    rows = []
    for name, reference in references.items():
        mine = per_session[per_session[group] == name].set_index(keys)[metrics]
        theirs = per_session[per_session[group] == reference].set_index(keys)[metrics]
        gains = (mine - theirs.reindex(mine.index)).reset_index()
        summary = summarise_by_band(gains).reset_index()
        summary = summary.rename(
            columns={m: f"{m}_gain" for m in metrics} | {f"{m}_se": f"{m}_gain_se" for m in metrics}
        )
        rows.append(summary.assign(**{group: name, "reference": reference}))
    table = pd.concat(rows, ignore_index=True)
    first = [group, "reference", "band", "sessions"]
    return table[first + [c for c in table.columns if c not in first]]


def teacher_agreement(
    scores: pd.DataFrame, annotations: pd.DataFrame, item_split: pd.DataFrame
) -> pd.DataFrame:
    """How well an ExpModel's per-item s_exp (``item_id, s_exp``) orders the items as its
    teacher's ``overall`` does: one row per split (``train``: the items SFT and PFT read,
    ``unseen``: annotated items no training step saw) with ``items`` and ``kendall_tau``
    (NaN for fewer than two items). The unseen row is the one that says whether the model
    transfers to items the teacher did not judge for it."""
    joined = ok_annotations(annotations).merge(scores, on="item_id", validate="one_to_one")
    rows = []
    for split in (TRAIN, UNSEEN):
        part = joined[joined["item_id"].isin(split_ids(item_split, split))]
        rows.append(
            {
                "split": split,
                "items": len(part),
                "kendall_tau": kendall_tau(part["s_exp"].tolist(), part["overall"].tolist()),
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- what each ranker learned from
# What page GRPO's R_old is, per reranker_grpo.reward.r_old (chain.reranker.page_reward).
R_OLD_SEES = {
    "fitted_click_model": (
        "the clicks + long views a click model fitted to the training logs expects (it sees "
        "positions, popularity, category match, title signals, where the logs ranked each item "
        "and each item's own clicks as reranker_grpo.click_model says; no hidden truth)"
    ),
    "oracle_expected": (
        "the simulator's exact expected clicks + long views, which read the hidden quality, "
        "click-bait and relevance (the A/B's own scoring function)"
    ),
    "online_sampled": (
        "one simulated user's clicks + long views per sampled page (the simulator, which "
        "reads the hidden truth, sampled once per page)"
    ),
    "logged_clicks": "the nDCG of the clicks logged under the old order",
}
_FEATURES = "popularity, category match, title signals and logged position"
_TRAINED_ON = {
    "logged": "Not trained here: the production order by popularity, click-bait and noise, "
    "blind to quality.",
    "click_pretrained": f"Imitates the logs' click-first order; sees {_FEATURES}, not s_exp.",
    "click_exp_pretrained": f"Imitates the logs' click-first order; sees {_FEATURES} and s_exp.",
    "yaug_no_exp_pretrained": "Imitates y_aug (clicks first, each part by s_exp); sees "
    f"{_FEATURES}, not s_exp.",
    "yaug_pretrained": f"Imitates y_aug (clicks first, each part by s_exp); sees {_FEATURES} "
    "and s_exp.",
    SHUFFLED_EXP: "Control: imitates y_aug built from s_exp shuffled within each query (clicks "
    f"first, each part by the shuffled s_exp); sees {_FEATURES} and the shuffled s_exp.",
    "oracle_clicks": "Not trained: sorts by the true P(click | examined), reading the hidden "
    "truth (a reference, not a ranker).",
    "oracle_quality": "Not trained: sorts by the hidden true quality (a reference, not a ranker).",
}
SAMPLED_SUFFIX = "_sampled"


def trained_on(
    ranker: str,
    r_old: str,
    r_old_only_alpha: float = 1.0,
    variants: Mapping[str, str] | None = None,
) -> str:
    """One sentence: which reward or target ``ranker`` (a name of the A/B table) was trained
    on and what information it could see; page GRPO's depends on ``r_old``, its ``R_OLD_ONLY``
    control's on ``r_old_only_alpha`` too (``reranker_grpo.controls.r_old_only.alpha``);
    ``variants`` maps an R_old variant's A/B name to its ``r_old``.

    >>> trained_on("click_pretrained", "fitted_click_model")[:34]
    "Imitates the logs' click-first ord"
    >>> trained_on("yaug_page_grpo_r_old_only", "fitted_click_model")[:76]
    'Control: y_aug reranker, then page GRPO on R_old alone (alpha 1, beta 0: no '
    """
    if ranker.endswith(SAMPLED_SUFFIX):
        source = ranker.removesuffix(SAMPLED_SUFFIX)
        return f"{trained_on(source, r_old)[:-1]}; pages sampled at the GRPO temperature."
    if variants and ranker in variants:
        return (
            "Variant: as yaug_page_grpo, but with R_old "
            f"{R_OLD_SEES[variants[ranker]]}; sees {_FEATURES} and s_exp."
        )
    if ranker == R_OLD_ONLY:
        return (
            f"Control: y_aug reranker, then page GRPO on R_old alone (alpha {r_old_only_alpha:g}, "
            f"beta 0: no experience term) with R_old {R_OLD_SEES[r_old]}; sees {_FEATURES} and "
            "s_exp."
        )
    if "page_grpo" in ranker:
        return (
            "y_aug reranker, then page GRPO on alpha * R_old + beta * nDCG@k(y, y^s) with R_old "
            f"{R_OLD_SEES[r_old]}; sees {_FEATURES} and s_exp."
        )
    return _TRAINED_ON.get(ranker, "Not one of the chain's rankers.")
