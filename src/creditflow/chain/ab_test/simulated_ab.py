"""A simulated online A/B of rankers.

Every ranker's page of a held-out session goes to the same simulated users: the world's
``ClickModel`` (``creditflow.chain.world.catalogue``), which drew the logged clicks, now reacts to
each page. Its clicks are position-based, so the expected clicks and long views of any page are
exact sums over positions (``chain.clicks.feedback.expected_page_feedback``); a common-random-
number Monte Carlo (``method="monte_carlo"``) gives the same quantities with noise and is the
parity check of the exact path. Rankers are compared on the same sessions, so their
differences are paired.

Beside the simulated metrics the table keeps the counterfactual one the chain had: nDCG of the
clicks logged under the old order (``counterfactual_click_ndcg``; an item the old page never
exposed has no click, so it cannot score), and its inverse-propensity version, each logged
click divided by its known propensity ``P(exposed and examined)`` at its logged position
(``ips_click_ndcg``; positions the old page never exposes, propensity 0, stay at 0).

Shape symbols: ``D`` pages per session and ranker (1 for a greedy page, more for pages
sampled at a temperature), ``N`` sessions, ``L`` candidates, ``R`` Monte Carlo draws.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from creditflow.chain.clicks.feedback import expected_page_feedback, sample_page_feedback
from creditflow.chain.config import AB_METHODS
from creditflow.chain.reranker.ranking import ndcg_at_k
from creditflow.chain.world.catalogue import FREQUENCY_BANDS, ClickModel, candidate_response

# Per-session metrics, averaged over a ranker's D pages (``ab_session_metrics``).
CLICKS, LONG_VIEWS = "clicks_per_page", "long_views_per_page"
CTR, LONG_VIEW_RATE, QUALITY_CLICKS = "ctr", "long_view_rate", "quality_weighted_clicks"
# Relative changes vs the baseline (ratio of means - 1), with a paired standard error.
CHANGE_METRICS = {CTR: "ctr_change_vs_logged", LONG_VIEW_RATE: "long_view_change_vs_logged"}


def true_ndcg_column(k: int) -> str:
    return f"true_ndcg_at_{k}"


@dataclass(frozen=True)
class SimulatedUsers:
    """What the world's users would do with each held-out candidate.

    click_probability: ``(N, L)`` ``P(click | examined)`` per candidate.
    long_view_probability: ``(N, L)`` ``P(long view | click)`` per candidate.
    click_model: the model they come from (its position weights and exposure).
    """

    click_probability: torch.Tensor
    long_view_probability: torch.Tensor
    click_model: ClickModel

    @property
    def length(self) -> int:
        return self.click_probability.shape[1]

    def position_weights(self) -> torch.Tensor:
        """``(L,)`` ``P(exposed and examined)`` per position."""
        return torch.from_numpy(self.click_model.position_weights(self.length))

    def expected_exposure(self) -> float:
        """Expected exposed positions of a page: the same for every ranker."""
        return float(self.click_model.exposure(self.length).sum())


def simulated_users(
    sessions: pd.DataFrame, catalogue: pd.DataFrame, click_model: ClickModel
) -> SimulatedUsers:
    """``SimulatedUsers`` of ``sessions`` (``chain.world.catalogue.candidate_response``)."""
    click, long_view = candidate_response(sessions, catalogue, click_model)
    return SimulatedUsers(torch.from_numpy(click), torch.from_numpy(long_view), click_model)


def oracle_pages(users: SimulatedUsers, sessions: pd.DataFrame) -> dict[str, torch.Tensor]:
    """``(1, N, L)`` reference pages that read the hidden truth (never a servable ranker):
    ``oracle_clicks`` sorts by ``P(click | examined)`` (the most clicks any page gets),
    ``oracle_quality`` by the candidates' true quality."""
    truth = torch.tensor([list(q) for q in sessions["true_quality"]], dtype=torch.float64)
    by = {"oracle_clicks": users.click_probability, "oracle_quality": truth}
    return {
        name: values.argsort(dim=1, descending=True, stable=True).unsqueeze(0)
        for name, values in by.items()
    }


def _page_feedback(
    pages: torch.Tensor,
    users: SimulatedUsers,
    method: str,
    draws: int,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(clicks (D, N, L), long_views (D, N, L))`` per position: exact expectations, or the
    mean of ``draws`` simulated users whose random numbers depend on ``(seed, draw)`` only, so
    every ranker meets the same users (common random numbers)."""
    D, N, L = pages.shape
    flat = pages.reshape(D * N, L)
    click = users.click_probability.repeat(D, 1)  # (D * N, L)
    long_view = users.long_view_probability.repeat(D, 1)
    if method == "exact":
        clicks, long_views = expected_page_feedback(
            flat, click, long_view, users.position_weights()
        )
        return clicks.view(D, N, L), long_views.view(D, N, L)
    lo, hi = users.click_model.exposure_depth
    examination = torch.from_numpy(users.click_model.examination(L))
    clicks = torch.zeros(D * N, L, dtype=torch.float64)
    long_views = torch.zeros_like(clicks)
    for draw in range(draws):
        generator = torch.Generator().manual_seed(int(seed) * 100_003 + draw)
        depth = torch.randint(lo, hi + 1, (N,), generator=generator)  # (N,)
        uniforms = torch.rand(N, L, 2, generator=generator, dtype=torch.float64)
        c, v = sample_page_feedback(
            flat, click, long_view, examination, depth.repeat(D), uniforms.repeat(D, 1, 1)
        )
        clicks += c
        long_views += v
    return (clicks / draws).view(D, N, L), (long_views / draws).view(D, N, L)


def ab_session_metrics(  # noqa: PLR0913 - every argument is a separate knob of the A/B
    pages: Mapping[str, torch.Tensor],
    sessions: pd.DataFrame,
    users: SimulatedUsers,
    *,
    k: int = 10,
    method: str = "exact",
    draws: int = 200,
    seed: int = 0,
) -> pd.DataFrame:
    """Per ranker and held-out session: the simulated feedback of its pages.

    Args:
        pages: ranker name -> ``(D, N, L)`` long rankings (position -> candidate) of the
            ``N`` sessions, in ``sessions`` order; metrics are averaged over the ``D`` pages.
        sessions: the held-out sessions (``generate_sessions`` frame: ``clicks``,
            ``logged_order`` and the hidden ``true_quality``).
        users: their ``SimulatedUsers``.
        k: cut-off of the nDCG columns.
        method: ``"exact"`` expectations or ``"monte_carlo"`` with ``draws`` common random
            numbers from ``seed``.

    Returns:
        One row per (ranker, session): ``ranker``, ``session_id``, ``query_frequency_band``,
        ``clicks_per_page`` and ``long_views_per_page`` (expected counts), ``ctr`` and
        ``long_view_rate`` (the same per expected exposed position, which no ranker changes),
        ``quality_weighted_clicks`` (expected clicks times the clicked candidate's true
        quality), ``true_ndcg_at_<k>`` (hidden true quality as gains),
        ``counterfactual_click_ndcg_at_<k>`` (clicks logged under the old order as gains) and
        ``ips_click_ndcg_at_<k>`` (those clicks over their logged propensity).
    """
    if method not in AB_METHODS:
        raise ValueError(f"unknown A/B method {method!r}; valid: {', '.join(AB_METHODS)}")
    if method == "monte_carlo" and draws < 1:
        raise ValueError(f"monte_carlo needs draws >= 1, got {draws}")
    N, L = users.click_probability.shape
    truth = torch.tensor([list(q) for q in sessions["true_quality"]], dtype=torch.float64)
    logged_clicks = torch.tensor([list(c) for c in sessions["clicks"]], dtype=torch.float64)
    logged_order = torch.tensor([list(o) for o in sessions["logged_order"]], dtype=torch.long)
    # Propensity of each candidate's logged click: the weight of the position it was shown at.
    propensity = users.position_weights()[logged_order.argsort(dim=1)]  # (N, L) per candidate
    ips = torch.where(propensity > 0, logged_clicks / propensity.clamp(min=1e-12), 0.0)
    exposure = users.expected_exposure()
    frames = []
    for name, given in pages.items():
        if given.dim() != 3 or tuple(given.shape[1:]) != (N, L):
            raise ValueError(f"pages[{name!r}] must have shape (D, N, L) = (D, {N}, {L})")
        ranked = given.long()
        clicks, long_views = _page_feedback(ranked, users, method, draws, seed)  # (D, N, L)
        gains = truth.unsqueeze(0).expand(ranked.shape[0], N, L)

        def ndcg(values: torch.Tensor, ranked: torch.Tensor = ranked) -> torch.Tensor:
            ordered = values.unsqueeze(0).expand_as(ranked).gather(2, ranked)
            return ndcg_at_k(ordered, k, ideal_gains=values.unsqueeze(0).expand_as(ranked))

        per_page = {
            CLICKS: clicks.sum(-1),
            LONG_VIEWS: long_views.sum(-1),
            QUALITY_CLICKS: (clicks * gains.gather(2, ranked)).sum(-1),
            true_ndcg_column(k): ndcg(truth),
            f"counterfactual_click_ndcg_at_{k}": ndcg(logged_clicks),
            f"ips_click_ndcg_at_{k}": ndcg(ips),
        }
        frame = pd.DataFrame({key: v.mean(dim=0).numpy() for key, v in per_page.items()})
        frame[CTR] = frame[CLICKS] / exposure
        frame[LONG_VIEW_RATE] = frame[LONG_VIEWS] / exposure
        frame.insert(0, "query_frequency_band", sessions["query_frequency_band"].to_numpy())
        frame.insert(0, "session_id", sessions["session_id"].to_numpy())
        frame.insert(0, "ranker", name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def paired_ratio_change(treatment: np.ndarray, baseline: np.ndarray) -> tuple[float, float]:
    """``mean(treatment) / mean(baseline) - 1`` over paired sessions and its standard error.

    Delta method for a ratio of means of paired samples: with ``R`` the ratio,
    ``se = std(treatment - R * baseline) / (sqrt(n) * mean(baseline))`` (NaN for one session).

    >>> paired_ratio_change(np.array([1.1, 2.2]), np.array([1.0, 2.0]))  # exactly +10%
    (0.10000000000000009, 0.0)
    """
    treatment, baseline = np.asarray(treatment, float), np.asarray(baseline, float)
    if treatment.shape != baseline.shape or treatment.ndim != 1:
        raise ValueError("treatment and baseline must be paired 1-d arrays")
    ratio = treatment.mean() / baseline.mean()
    n = len(baseline)
    if n < 2:
        return float(ratio - 1.0), float("nan")
    residual = treatment - ratio * baseline
    se = residual.std(ddof=1) / (np.sqrt(n) * baseline.mean())
    return float(ratio - 1.0), float(se)


def summarise_ab(per_session: pd.DataFrame, k: int, baseline: str = "logged") -> pd.DataFrame:
    """The A/B table: one row per (ranker, band in head / torso / tail present, then all).

    Means of the ``ab_session_metrics`` columns, ``<metric>_se`` for ``ctr``,
    ``long_view_rate`` and ``true_ndcg_at_<k>`` (across sessions), and against ``baseline``
    on the same sessions: ``ctr_change_vs_logged`` / ``long_view_change_vs_logged`` (relative,
    ``paired_ratio_change``) and ``true_ndcg_at_<k>_diff_vs_logged`` (absolute), each with a
    paired ``_se``; ``sessions`` counts the band.
    """
    if baseline not in set(per_session["ranker"]):
        raise ValueError(f"baseline ranker {baseline!r} is not in the per-session table")
    ndcg = true_ndcg_column(k)
    metrics = [
        c for c in per_session.columns if c not in ("ranker", "session_id", "query_frequency_band")
    ]
    base = per_session[per_session["ranker"] == baseline].set_index("session_id")
    bands = [b for b in FREQUENCY_BANDS if b in set(per_session["query_frequency_band"])]
    rows = []
    for ranker, rows_of_ranker in per_session.groupby("ranker", sort=False):
        frame = rows_of_ranker.set_index("session_id")
        for band in [*bands, "all"]:
            part = frame if band == "all" else frame[frame["query_frequency_band"] == band]
            paired = base.loc[part.index]
            row = {"ranker": ranker, "band": band, **part[metrics].mean().to_dict()}
            for metric in (CTR, LONG_VIEW_RATE, ndcg):
                row[f"{metric}_se"] = part[metric].sem()
            for metric, name in CHANGE_METRICS.items():
                row[name], row[f"{name}_se"] = paired_ratio_change(
                    part[metric].to_numpy(), paired[metric].to_numpy()
                )
            difference = part[ndcg] - paired[ndcg]
            row[f"{ndcg}_diff_vs_logged"] = difference.mean()
            row[f"{ndcg}_diff_vs_logged_se"] = difference.sem()
            row["sessions"] = len(part)
            rows.append(row)
    return pd.DataFrame(rows)


def ab_plot_columns(k: int) -> list[str]:
    """The A/B table's paired changes vs the logged order, for ``plot_metrics_by_band``."""
    return [*CHANGE_METRICS.values(), f"{true_ndcg_column(k)}_diff_vs_logged"]


def sweep_click_model(  # noqa: PLR0913, PLR0917 - the pages, the world and the swept field
    pages: Mapping[str, torch.Tensor],
    sessions: pd.DataFrame,
    catalogue: pd.DataFrame,
    click_model: ClickModel,
    field: str,
    values: list[float],
    k: int = 10,
) -> pd.DataFrame:
    """``summarise_ab`` of the same ``pages`` in one world per value of ``click_model.<field>``
    (exact expectations): the A/B table of every value stacked, with a ``<field>`` column."""
    if not hasattr(click_model, field):
        raise ValueError(f"ClickModel has no field {field!r}")
    tables = []
    for value in values:
        users = simulated_users(sessions, catalogue, click_model.replace(**{field: value}))
        table = summarise_ab(ab_session_metrics(pages, sessions, users, k=k), k=k)
        table.insert(0, field, value)
        tables.append(table)
    return pd.concat(tables, ignore_index=True)


def break_even(
    sweep: pd.DataFrame, field: str, column: str, band: str = "all"
) -> dict[str, float | None]:
    """Per ranker, the ``field`` value where ``column`` crosses 0 first (linear interpolation
    between swept values), None where it never does within the sweep.

    >>> sweep = pd.DataFrame(
    ...     {"w": [0.0, 1.0, 2.0], "ranker": "a", "band": "all", "change": [-0.2, -0.1, 0.1]}
    ... )
    >>> break_even(sweep, "w", "change")
    {'a': 1.5}
    """
    out: dict[str, float | None] = {}
    rows = sweep[sweep["band"] == band]
    for ranker, unsorted in rows.groupby("ranker", sort=False):
        part = unsorted.sort_values(field)
        x, y = part[field].to_numpy(float), part[column].to_numpy(float)
        out[ranker] = None
        if len(y) and y[0] == 0:
            out[ranker] = float(x[0])
            continue
        for i in range(1, len(y)):
            if np.sign(y[i]) != np.sign(y[i - 1]):
                out[ranker] = float(x[i - 1] + (x[i] - x[i - 1]) * -y[i - 1] / (y[i] - y[i - 1]))
                break
    return out
