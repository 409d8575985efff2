"""What s_exp itself adds: the chain's two controls and their paired contrasts.

Two rankers of the A/B table are controls, trained in the same run as the method they sit
beside:

- ``R_OLD_ONLY`` (``yaug_page_grpo_r_old_only``): page GRPO exactly like ``yaug_page_grpo``
  but on R_old alone (``reranker_grpo.controls.r_old_only``: beta 0), so
  ``yaug_page_grpo - yaug_page_grpo_r_old_only`` is what the experience term of the reward
  adds;
- ``SHUFFLED_EXP`` (``yaug_pretrained_shuffled_exp``): the y_aug reranker pre-trained and served
  with s_exp shuffled within each query (``shuffled_scores``) wherever s_exp enters (the y_aug
  order and the s_exp features), so ``yaug_pretrained - yaug_pretrained_shuffled_exp`` is what
  s_exp's order adds over scores of the same values tied to no item.

A contrast ``a - b`` is paired over the held-out sessions (``session_differences``): per
session the difference of the two rankers' simulated feedback, on the scale of the change vs
the logged order, with a Student t interval and minimum detectable effect over sessions
(``interval_columns``, ``creditflow.reporting.stats``). One run's sessions cover the
evaluation's sampling of sessions, not the training run's; ``benchmarks/experience_ab_seeds.py``
repeats the same contrasts over ExpModel and GRPO seeds with these functions.

Shapes: ``per_session`` is an ``ab_session_metrics`` table, one row per (ranker, session).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from creditflow.chain.ab_test.simulated_ab import CLICKS, LONG_VIEWS, true_ndcg_column
from creditflow.chain.annotation import QUERY_COLUMN
from creditflow.chain.reranker.data import LOGGED
from creditflow.reporting.stats import interval_text, minimum_detectable_effect, t_interval

R_OLD_ONLY = "yaug_page_grpo_r_old_only"
SHUFFLED_EXP = "yaug_pretrained_shuffled_exp"
# control -> the ranker it controls for (the tables show it right after that one).
CONTROLLED = {SHUFFLED_EXP: "yaug_pretrained", R_OLD_ONLY: "yaug_page_grpo"}
# Page GRPO on an R_old variant (reranker_grpo.r_old_variants) is ``VARIANT_PREFIX + name``.
VARIANT_PREFIX = "yaug_page_grpo_with_"
# (a, b, what a - b measures), the contrast rows of the A/B table.
CONTRASTS = (
    ("yaug_page_grpo", R_OLD_ONLY, "the experience term of page GRPO's reward (beta > 0 vs 0)"),
    ("yaug_pretrained", SHUFFLED_EXP, "s_exp vs s_exp shuffled within each query, y_aug alone"),
)
# Per contrast: CTR and long-view change (difference of the two rankers' changes vs the logged
# order) and the true-quality nDCG@k difference.
METRICS = ("ctr_change", "long_view_change", "true_ndcg_diff")
INTERVAL_SUFFIXES = ("", "_se", "_low", "_high", "_mde", "_text")
RANKER, CONTRAST = "ranker", "contrast"  # the A/B table's ``kind`` column
SESSIONS_BASIS = "held-out sessions, one run"

Page = TypeVar("Page")


def shuffled_scores(scores: pd.DataFrame, seed: int) -> pd.DataFrame:
    """``scores`` (``item_id, s_exp``, or per (query, item) with ``query_text``) with ``s_exp``
    permuted within each query (all rows when the scores are per item): the same values, so
    the same y^s gains and feature scale, no longer tied to the items.

    >>> frame = pd.DataFrame({"item_id": [0, 1, 2], "s_exp": [0.1, 0.2, 0.3]})
    >>> sorted(shuffled_scores(frame, 0)["s_exp"]) == [0.1, 0.2, 0.3]
    True
    """
    rng = np.random.default_rng(seed)
    out = scores.copy()
    groups = (
        out.groupby(QUERY_COLUMN).indices
        if QUERY_COLUMN in out.columns
        else {"": np.arange(len(out))}
    )
    values = out["s_exp"].to_numpy().copy()
    for rows in groups.values():
        values[rows] = values[rows][rng.permutation(len(rows))]
    out["s_exp"] = values
    return out


def session_differences(per_session: pd.DataFrame, a: str, b: str, k: int = 10) -> pd.DataFrame:
    """Per held-out session, ``a``'s value minus ``b``'s on ``METRICS``' scale: expected
    clicks and long views over the logged order's mean, so the mean over sessions is exactly
    the difference of the two rankers' changes vs the logged order (ratio of means - 1; every
    ranker has the same expected exposure, so clicks and CTR give the same ratio);
    ``true_ndcg_at_<k>`` as it is. One row per session of ``a``, indexed by ``session_id``."""
    ndcg = true_ndcg_column(k)
    frame = per_session.set_index(["ranker", "session_id"])
    logged = frame.loc[LOGGED]
    left = frame.loc[a]
    right = frame.loc[b].loc[left.index]
    return pd.DataFrame(
        {
            "ctr_change": (left[CLICKS] - right[CLICKS]) / logged[CLICKS].mean(),
            "long_view_change": (left[LONG_VIEWS] - right[LONG_VIEWS]) / logged[LONG_VIEWS].mean(),
            "true_ndcg_diff": left[ndcg] - right[ndcg],
        }
    )


def interval_columns(values: pd.DataFrame) -> dict[str, Any]:
    """Per column ``m`` of ``METRICS`` in ``values`` (one row per paired unit: a session or a
    seed), ``m`` the mean, ``m_se``, the 95 % Student t interval ``m_low`` / ``m_high``, the
    minimum detectable effect ``m_mde`` and the readable ``m_text`` (NaN bounds, never a
    guess, under two units)."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        mean, se, low, high = t_interval(values[metric].to_numpy())
        mde = minimum_detectable_effect(se, len(values))
        out |= {metric: mean, f"{metric}_se": se, f"{metric}_low": low, f"{metric}_high": high}
        out[f"{metric}_mde"] = mde
        out[f"{metric}_text"] = interval_text(mean, low, high, mde)
    return out


def contrast_rows(
    per_session: pd.DataFrame, contrasts: Sequence[tuple[str, str, str]], k: int = 10
) -> pd.DataFrame:
    """One row per contrast ``(a, b, what)`` whose two rankers are both in ``per_session``:
    ``contrast`` (``"a - b"``), ``what``, ``sessions`` and ``interval_columns`` of
    ``session_differences`` (paired over the sessions)."""
    present = set(per_session["ranker"])
    rows = []
    for a, b, what in contrasts:
        if {a, b} <= present:
            values = session_differences(per_session, a, b, k)
            rows.append(
                {"contrast": f"{a} - {b}", "what": what, "sessions": len(values)}
                | interval_columns(values)
            )
    return pd.DataFrame(rows)


def variant_ranker(name: str) -> str:
    """The A/B name of page GRPO on the R_old variant ``name``."""
    return f"{VARIANT_PREFIX}{name}"


def with_variant_names(
    controls: Mapping[str, Page], variants: Mapping[str, Page]
) -> dict[str, Page]:
    """``controls`` then each R_old variant's entry under its A/B name (``variant_ranker``)."""
    return dict(controls) | {variant_ranker(name): value for name, value in variants.items()}


def variant_contrasts(names: Sequence[str]) -> tuple[tuple[str, str, str], ...]:
    """``CONTRASTS`` and, per R_old variant, the method against page GRPO on that variant."""
    return CONTRASTS + tuple(
        (
            "yaug_page_grpo",
            variant_ranker(name),
            f"page GRPO's R_old from the configured click model vs the {name!r} variant",
        )
        for name in names
    )


def with_contrasts(
    table: pd.DataFrame,
    per_session: pd.DataFrame,
    contrasts: Sequence[tuple[str, str, str]] = CONTRASTS,
    k: int = 10,
) -> pd.DataFrame:
    """The A/B table (``simulated_ab.summarise_ab``) with ``kind`` = ``RANKER`` and ``basis``
    on every row, then one row per contrast of ``contrast_rows``: ``ranker`` ``"a - b"``,
    band ``all``, ``kind`` = ``CONTRAST``, ``what`` and the interval columns. The ranker rows
    and their columns are unchanged (NaN in the contrasts' columns, and the reverse)."""
    rows = contrast_rows(per_session, contrasts, k)
    table = table.assign(kind=RANKER, basis=SESSIONS_BASIS)
    if rows.empty:
        return table
    rows = rows.rename(columns={"contrast": "ranker"}).assign(
        band="all", kind=CONTRAST, basis=SESSIONS_BASIS
    )
    return pd.concat([table, rows], ignore_index=True)


def ab_log_text(table: pd.DataFrame) -> str:
    """``with_contrasts``' table as the log shows it: the rankers' rows and columns, then each
    contrast's readable intervals."""
    rankers = table[table["kind"] == RANKER]
    added = {"kind", "basis", "what", "trained_on"}
    added |= {f"{m}{suffix}" for m in METRICS for suffix in INTERVAL_SUFFIXES}
    text = rankers.drop(columns=[c for c in table.columns if c in added]).to_string(index=False)
    contrasts = table[table["kind"] == CONTRAST]
    if contrasts.empty:
        return text
    shown = contrasts[["ranker", "sessions", *(f"{m}_text" for m in METRICS)]]
    return (
        f"{text}\ncontrasts, paired over the {SESSIONS_BASIS} (mean [95 % t interval]):\n"
        f"{shown.to_string(index=False)}"
    )


def beside_their_methods(pages: Mapping[str, Page]) -> dict[str, Page]:
    """``pages`` (ranker -> anything) with each control of ``CONTROLLED`` moved right after
    the ranker it controls for (at the end when that one is absent); the rest keep their
    order.

    >>> pages = dict.fromkeys(["yaug_pretrained", "yaug_page_grpo", R_OLD_ONLY, SHUFFLED_EXP])
    >>> list(beside_their_methods(pages))[:2]
    ['yaug_pretrained', 'yaug_pretrained_shuffled_exp']
    """
    out: dict[str, Page] = {}
    for name, page in pages.items():
        if name in CONTROLLED and CONTROLLED[name] in pages:
            continue  # placed with its method
        out[name] = page
        for control, method in CONTROLLED.items():
            if method == name and control in pages:
                out[control] = pages[control]
    return out
