"""Page GRPO's default R_old: a click model learned from the training logs alone (docs/methods/experience.md, step 5).

A production system cannot ask its users how they would react to every page it might show;
it has its logs. This module fits ``chain.clicks.position_based``'s position-based model to the
impressions, clicks and long views of the training sessions, on what a production system
knows of a candidate (``OBSERVABLE_FEATURES``: popularity, whether its category is the
query's, and three title signals), and turns it into per-candidate click and long-view
probabilities for any page. It never reads ``true_*``, the query-item ``relevance`` or the
simulator's ``ClickModel``: ``observable`` drops those columns before anything is computed,
and only ``recovery_table`` (a diagnostic, outside training) compares the fit with the
simulator's position bias.

The training sessions are split once (``validation_split``): the fit uses one part, the
other is the validation side on which the fit is scored (held-out log-likelihood) and on
which page-GRPO settings are chosen (``benchmarks/page_grpo_settings.py``). The held-out A/B
sessions are never read here.

Shape symbols: ``N`` sessions, ``L`` candidates (= positions), ``F`` features.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch

from creditflow.chain.clicks.position_based import (
    PositionBasedClickModel,
    click_log_likelihood,
    fit_position_based_click_model,
    long_view_log_likelihood,
)
from creditflow.chain.config import FEATURE_NAMES
from creditflow.chain.reranker.data import split_sessions
from creditflow.chain.reranker.training import session_features
from creditflow.chain.world.catalogue import HIDDEN_COLUMNS, LABEL_UNEXPOSED, ClickModel

# What a production system knows of a candidate when it logs an impression; no experience
# score (that is R_exp's job), no logged position (the position factor is separate), no label.
OBSERVABLE_FEATURES = (
    "log_popularity_z",
    "category_match",
    "title_clickbait",
    "title_filler_share",
    "title_query_match",
)
# Session columns only the simulator and the evaluation may read.
HIDDEN_SESSION_COLUMNS = ("relevance", "true_quality")
PARTS = ("position", "click", "long_view", "standardise_mean", "standardise_scale")


def observable(
    sessions: pd.DataFrame, catalogue: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``sessions`` and ``catalogue`` without the hidden columns (the simulator's truth)."""
    return (
        sessions.drop(columns=[c for c in HIDDEN_SESSION_COLUMNS if c in sessions.columns]),
        catalogue.drop(columns=[c for c in HIDDEN_COLUMNS if c in catalogue.columns]),
    )


def validation_split(
    sessions: pd.DataFrame, validation: Mapping[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(fit, validation)`` sessions of the training logs (``reranker_grpo.validation``:
    ``fraction``, ``seed``); both keep ``session_id`` order."""
    return split_sessions(sessions, validation["fraction"], seed=validation["seed"])


def candidate_features(sessions: pd.DataFrame, catalogue: pd.DataFrame) -> torch.Tensor:
    """``(N, L, F)`` ``OBSERVABLE_FEATURES`` of every candidate (candidate order), from the
    observable columns only."""
    sessions, catalogue = observable(sessions, catalogue)
    features, _ = session_features(sessions, catalogue)  # (N, L, all features)
    columns = [FEATURE_NAMES.index(name) for name in OBSERVABLE_FEATURES]
    return features[..., columns]


def logged_impressions(
    sessions: pd.DataFrame, catalogue: pd.DataFrame
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logged pages by position: ``(features (N, L, F), shown (N, L), clicks (N, L),
    long_views (N, L))``; ``shown`` is every label but unexposed."""
    lengths = {len(c) for c in sessions["candidates"]}
    if len(lengths) > 1:
        raise ValueError(f"sessions must all have the same length, got {sorted(lengths)}")
    order = torch.tensor(np.array([list(o) for o in sessions["logged_order"]]), dtype=torch.long)
    features = candidate_features(sessions, catalogue)  # (N, L, F) by candidate
    shown = torch.tensor(
        np.array([[label != LABEL_UNEXPOSED for label in row] for row in sessions["labels"]])
    )
    clicks = torch.tensor(np.array([list(c) for c in sessions["clicks"]]), dtype=torch.float64)
    long_views = torch.tensor(
        np.array([list(v) for v in sessions["long_views"]]), dtype=torch.float64
    )
    by_position = features.gather(1, order.unsqueeze(-1).expand_as(features))
    return (
        by_position,
        shown.gather(1, order),
        clicks.gather(1, order),
        long_views.gather(1, order),
    )


def fit_logged_click_model(
    sessions: pd.DataFrame, catalogue: pd.DataFrame, params: Mapping[str, Any]
) -> tuple[PositionBasedClickModel, pd.DataFrame]:
    """The click model of the fit part of ``sessions`` (``params``: ``reranker_grpo`` with
    ``validation`` and ``click_model``) and its diagnostics on the validation part.

    Returns:
        The model, and one row per (``split`` fit / validation): ``sessions``,
        ``impressions``, ``clicks``, the mean log-likelihood per impression of the fitted
        model (``click_loglik``), of a position-only model (CTR per position, no features:
        ``position_only_loglik``) and of a constant CTR (``constant_loglik``), and the mean
        long-view log-likelihood per click (``long_view_loglik``).
    """
    fit_part, validation = validation_split(sessions, params["validation"])
    options = params["click_model"]
    logs = {"fit": logged_impressions(fit_part, catalogue)}
    logs["validation"] = logged_impressions(validation, catalogue)
    model = fit_position_based_click_model(
        *logs["fit"], l2=options["l2"], max_iter=options["max_iter"]
    )
    _, shown, clicks, _ = logs["fit"]
    # Baselines, fitted on the same impressions: CTR per position, and one CTR for all.
    per_position = (clicks * shown).sum(0) / shown.sum(0).clamp(min=1)  # (L,)
    overall = float(clicks[shown].mean())
    rows = []
    for (split, (features, part_shown, part_clicks, part_long_views)), part in zip(
        logs.items(), (fit_part, validation), strict=True
    ):
        c = part_clicks[part_shown]
        position_p = per_position.expand_as(part_clicks)[part_shown].clamp(1e-9, 1 - 1e-9)
        constant_p = torch.full_like(c, overall).clamp(1e-9, 1 - 1e-9)
        rows.append(
            {
                "split": split,
                "sessions": len(part),
                "impressions": int(part_shown.sum()),
                "clicks": int(c.sum()),
                "click_loglik": click_log_likelihood(model, features, part_shown, part_clicks),
                "position_only_loglik": _bernoulli_loglik(c, position_p),
                "constant_loglik": _bernoulli_loglik(c, constant_p),
                "long_view_loglik": long_view_log_likelihood(
                    model, features, part_clicks, part_long_views
                ),
            }
        )
    return model, pd.DataFrame(rows)


def _bernoulli_loglik(outcomes: torch.Tensor, p: torch.Tensor) -> float:
    return float((outcomes * p.log() + (1 - outcomes) * (1 - p).log()).mean())


def fitted_response(
    model: PositionBasedClickModel, sessions: pd.DataFrame, catalogue: pd.DataFrame
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(attractiveness (N, L), long_view (N, L), position_weights (L,))`` of every
    session's candidates under the fitted ``model``: its expected clicks of a page ``y`` are
    ``sum_p position_weights[p] * attractiveness[y[p]]`` (``chain.clicks.feedback``)."""
    features = candidate_features(sessions, catalogue)  # (N, L, F)
    L = features.shape[1]
    if model.examination.shape[0] != L:
        raise ValueError(
            f"the click model was fitted on pages of {model.examination.shape[0]} positions, "
            f"these sessions have {L}"
        )
    return model.attractiveness(features), model.long_view(features), model.position_weights()


# ---------------------------------------------------------------- the catalog's table
def click_model_table(model: PositionBasedClickModel) -> pd.DataFrame:
    """The fitted model as a table (``logged_click_model.csv``): one row per parameter,
    columns ``part`` (``PARTS``), ``name`` (a position or a feature), ``value``; the position
    rows also carry the logged ``exposure``."""
    rows = [
        {"part": "position", "name": str(p), "value": float(g), "exposure": float(e)}
        for p, (g, e) in enumerate(zip(model.examination, model.exposure, strict=True))
    ]
    for part, weights, bias in (
        ("click", model.click_weights, model.click_bias),
        ("long_view", model.long_view_weights, model.long_view_bias),
    ):
        rows += [
            {"part": part, "name": n, "value": float(w)}
            for n, w in zip(OBSERVABLE_FEATURES, weights, strict=True)
        ]
        rows.append({"part": part, "name": "bias", "value": float(bias)})
    for part, values in (
        ("standardise_mean", model.feature_mean),
        ("standardise_scale", model.feature_scale),
    ):
        rows += [
            {"part": part, "name": n, "value": float(v)}
            for n, v in zip(OBSERVABLE_FEATURES, values, strict=True)
        ]
    return pd.DataFrame(rows, columns=["part", "name", "value", "exposure"])


def click_model_from_table(table: pd.DataFrame) -> PositionBasedClickModel:
    """The ``PositionBasedClickModel`` of a ``click_model_table``.

    Raises:
        ValueError: a part or feature is missing (a table of another feature set).
    """

    def part(name: str) -> pd.DataFrame:
        rows = table[table["part"] == name]
        if rows.empty:
            raise ValueError(f"the click-model table has no {name!r} rows; refit it")
        return rows

    def by_feature(name: str) -> torch.Tensor:
        values = part(name).set_index("name")["value"]
        missing = sorted(set(OBSERVABLE_FEATURES) - set(values.index))
        if missing:
            raise ValueError(f"the click-model table's {name!r} rows lack {missing}; refit it")
        return torch.tensor([float(values[n]) for n in OBSERVABLE_FEATURES], dtype=torch.float64)

    positions = part("position").assign(p=lambda f: f["name"].astype(int)).sort_values("p")
    bias = {
        n: float(part(n).set_index("name").loc["bias", "value"]) for n in ("click", "long_view")
    }
    return PositionBasedClickModel(
        examination=torch.tensor(positions["value"].to_numpy(float)),
        exposure=torch.tensor(positions["exposure"].to_numpy(float)),
        click_weights=by_feature("click"),
        click_bias=bias["click"],
        long_view_weights=by_feature("long_view"),
        long_view_bias=bias["long_view"],
        feature_mean=by_feature("standardise_mean"),
        feature_scale=by_feature("standardise_scale"),
    )


def recovery_table(model: PositionBasedClickModel, world: ClickModel) -> pd.DataFrame:
    """Per position, the fitted position bias beside the simulator's (a diagnostic of the
    evaluation: the fit never sees ``world``): ``examination_fitted`` / ``_true`` (``gamma_p``
    against ``(p + 1) ** -position_bias``), ``position_weight_fitted`` / ``_true``
    (exposure x examination), and their absolute errors."""
    L = model.examination.shape[0]
    frame = pd.DataFrame(
        {
            "position": np.arange(L),
            "examination_fitted": model.examination.numpy(),
            "examination_true": world.examination(L),
            "position_weight_fitted": model.position_weights().numpy(),
            "position_weight_true": world.position_weights(L),
        }
    )
    frame["examination_abs_error"] = (frame["examination_fitted"] - frame["examination_true"]).abs()
    frame["position_weight_abs_error"] = (
        frame["position_weight_fitted"] - frame["position_weight_true"]
    ).abs()
    return frame
