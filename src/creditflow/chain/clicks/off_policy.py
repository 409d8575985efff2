"""Off-policy estimates of a ranker's clicks and long views from the logs alone: how page-GRPO
settings are chosen without asking the simulator (docs/methods/experience.md, step 5).

A logged session shows each candidate at one position; under a position-based model its
expected clicks there are ``w[logged position] * a`` (``w`` the position weight, exposure x
examination, ``a`` its attractiveness). A new page moves it to another position, so its
clicks there are the logged ones scaled by the propensity ratio ``w[new] / w[logged]``: the
item-position estimator of unbiased learning to rank, with the fitted click model's position
weights as the logging propensities. Three estimates per page:

- ``dm`` (direct method): the click model's own expectation, ``sum_i w[new_i] * a_i``;
- ``ips``: the logged clicks re-weighted, ``sum_i r_i * c_i``, ``r_i = w[new_i] / w[logged_i]``
  clipped at ``clip`` (0 where the logged position was never exposed: no evidence there);
- ``dr`` (doubly robust): ``dm + sum_i r_i * (c_i - w[logged_i] * a_i)``, the model corrected
  by its residuals on the logged page; unbiased when either the model or the propensities are
  right, and exactly the logged clicks for the logged page.

Long views the same, with ``a_i * l_i`` (``l`` the long-view rate) in place of ``a_i``. The
click model must be fitted on other sessions than those estimated on (the validation part of
``chain.clicks.logged.validation_split``), or ``dr`` only repeats its fit.

Shape symbols: ``D`` pages per session, ``N`` sessions, ``L`` candidates (= positions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch

from creditflow.chain.clicks.logged import LoggedClickModel, fitted_response, observable

ESTIMATORS = ("dm", "ips", "dr")
FEEDBACK = ("clicks", "long_views")


def off_policy_feedback(
    pages: Mapping[str, torch.Tensor],
    sessions: pd.DataFrame,
    catalogue: pd.DataFrame,
    fitted: LoggedClickModel,
    clip: float = 10.0,
) -> pd.DataFrame:
    """Per ranker and session, each estimator's clicks and long views of its pages.

    Args:
        pages: ranker name -> ``(D, N, L)`` long rankings (position -> candidate) of the
            ``N`` sessions; estimates are averaged over the ``D`` pages.
        sessions: the logged sessions (``logged_order``, ``clicks``, ``long_views``); hidden
            columns are dropped before anything is read.
        catalogue: the item table (observable columns only are read).
        fitted: a click model fitted on other sessions.
        clip: the largest propensity ratio (> 0).

    Returns:
        One row per (ranker, session): ``ranker``, ``session_id``, and ``<feedback>_<est>``
        for feedback in ``FEEDBACK`` and estimator in ``ESTIMATORS``.
    """
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    seen, seen_catalogue = observable(sessions, catalogue)
    attractiveness, long_view, weights = fitted_response(fitted, seen, seen_catalogue)  # (N, L)
    logged_order = torch.tensor(np.array([list(o) for o in seen["logged_order"]]))  # (N, L)
    logged_position = logged_order.argsort(dim=1)  # (N, L) per candidate
    clicks = torch.tensor(np.array([list(c) for c in seen["clicks"]]), dtype=torch.float64)
    views = torch.tensor(np.array([list(v) for v in seen["long_views"]]), dtype=torch.float64)
    logged_weight = weights[logged_position]  # (N, L)
    expected = {"clicks": attractiveness, "long_views": attractiveness * long_view}
    observed = {"clicks": clicks, "long_views": views}
    frames = []
    for name, page in pages.items():
        if page.dim() != 3 or tuple(page.shape[1:]) != tuple(clicks.shape):
            raise ValueError(
                f"pages[{name!r}] must have shape (D, N, L) with (N, L) = "
                f"{tuple(clicks.shape)}, got {tuple(page.shape)}"
            )
        new_weight = weights[page.argsort(dim=2)]  # (D, N, L) per candidate
        ratio = torch.where(
            logged_weight > 0, new_weight / logged_weight.clamp(min=1e-12), torch.zeros(())
        ).clamp(max=clip)
        row: dict[str, object] = {"ranker": name, "session_id": seen["session_id"].to_numpy()}
        for kind in FEEDBACK:
            direct = (new_weight * expected[kind]).sum(-1)  # (D, N)
            ips = (ratio * observed[kind]).sum(-1)
            residual = (ratio * (observed[kind] - logged_weight * expected[kind])).sum(-1)
            for estimator, value in (("dm", direct), ("ips", ips), ("dr", direct + residual)):
                row[f"{kind}_{estimator}"] = value.mean(0).numpy()
        frames.append(pd.DataFrame(row))
    return pd.concat(frames, ignore_index=True)


def off_policy_changes(
    per_session: pd.DataFrame, baseline: str, long_view_weight: float = 1.0
) -> pd.DataFrame:
    """Per ranker and estimator, the change of clicks, long views and of their sum
    ``clicks + long_view_weight * long_views`` (the value R_old rewards) against ``baseline``
    (the logged order), as ratios of totals minus 1, each with its standard error over the
    sessions (paired, linearised).

    Returns:
        One row per (``ranker``, ``estimator``): ``<feedback>_change`` and
        ``<feedback>_change_se`` for ``clicks``, ``long_views`` and ``value``.
    """
    frame = per_session.copy()
    for estimator in ESTIMATORS:
        frame[f"value_{estimator}"] = (
            frame[f"clicks_{estimator}"] + long_view_weight * frame[f"long_views_{estimator}"]
        )
    base = frame[frame["ranker"] == baseline].set_index("session_id")
    if base.empty:
        raise ValueError(f"no {baseline!r} rows to compare with")
    rows = []
    for ranker, rows_of_ranker in frame.groupby("ranker", sort=False):
        part = rows_of_ranker.set_index("session_id").loc[base.index]
        for estimator in ESTIMATORS:
            row = {"ranker": ranker, "estimator": estimator}
            for kind in (*FEEDBACK, "value"):
                # The logged order's own value is what its sessions logged (every estimator's
                # is the same in expectation; ``dr``'s is exact), so all compare with one base.
                a, b = part[f"{kind}_{estimator}"], base[f"{kind}_dr"]
                row[f"{kind}_change"], row[f"{kind}_change_se"] = _ratio_change(a, b)
            rows.append(row)
    return pd.DataFrame(rows)


def _ratio_change(a: pd.Series, b: pd.Series) -> tuple[float, float]:
    """``sum(a) / sum(b) - 1`` and its standard error over the paired units (delta method)."""
    total = float(b.sum())
    if total <= 0:
        return math.nan, math.nan
    ratio = float(a.sum()) / total
    n = len(a)
    residual = a.to_numpy() - ratio * b.to_numpy()
    se = math.sqrt(float((residual**2).sum()) * n / max(n - 1, 1)) / total
    return ratio - 1.0, se
