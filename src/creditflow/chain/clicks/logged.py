"""Page GRPO's default R_old: a click model learned from the training logs alone (docs/methods/experience.md, step 5).

A production system cannot ask its users how they would react to every page it might show;
it has its logs. This module fits ``chain.clicks.position_based``'s position-based model to the
impressions, clicks and long views of the training sessions, on what a production system
knows of a candidate (``OBSERVABLE_FEATURES``: popularity, whether its category is the
query's, and three title signals; with ``item_logged_rank_pseudo_count`` also the item's mean
position in the logged pages, what the production ranker thought of it) and, with
``effects``, each item's and each query-item pair's own attractiveness and long-view rate
learned from its clicks, shrunk toward what its features predict. It turns the fit into
per-candidate click and long-view probabilities for any page, optionally pessimistic: a
lower confidence bound where the logs say little (``pessimism``). It never reads ``true_*``, the query-item ``relevance`` or the
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

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from creditflow.chain.clicks.position_based import (
    EPS,
    KeyedEffects,
    PositionBasedClickModel,
    fit_position_based_click_model,
    long_view_log_likelihood,
)
from creditflow.chain.config import FEATURE_NAMES
from creditflow.chain.reranker.data import split_sessions
from creditflow.chain.reranker.training import session_features
from creditflow.chain.world.catalogue import (
    HIDDEN_COLUMNS,
    LABEL_UNEXPOSED,
    ClickModel,
    candidate_response,
)

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
# The item's mean logged position, appended to OBSERVABLE_FEATURES when the fit uses it.
LOGGED_RANK = "item_logged_rank"
EFFECT_GROUPS = ("item", "query_item")
PARTS = ("position", "click", "long_view", "standardise_mean", "standardise_scale", LOGGED_RANK)


@dataclass(frozen=True)
class LoggedClickModel:
    """A click model fitted to logs: the ``PositionBasedClickModel`` and what it needs to read
    a candidate beyond the catalogue's columns.

    model: the fitted model (its features ``feature_names``).
    item_logged_rank: item id -> the item's mean relative position in the fit part's logged
        pages (0 top, 1 bottom), shrunk toward ``default_rank`` by
        ``item_logged_rank_pseudo_count`` pseudo-pages; empty when the fit leaves it out.
    default_rank: the rank of an item the logs never listed (the logs' mean).
    """

    model: PositionBasedClickModel
    item_logged_rank: pd.Series
    default_rank: float

    @property
    def feature_names(self) -> tuple[str, ...]:
        return OBSERVABLE_FEATURES + ((LOGGED_RANK,) if len(self.item_logged_rank) else ())


def observable(
    sessions: pd.DataFrame, catalogue: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``sessions`` and ``catalogue`` without the hidden columns (the simulator's truth)."""
    return (
        sessions.drop(columns=[c for c in HIDDEN_SESSION_COLUMNS if c in sessions.columns]),
        catalogue.drop(columns=[c for c in HIDDEN_COLUMNS if c in catalogue.columns]),
    )


def has_truth(sessions: pd.DataFrame) -> bool:
    """Whether ``sessions`` carry the hidden per-candidate columns the simulated users read
    (the synthetic world's do; logs of your own only with a known ``true_quality``)."""
    return set(HIDDEN_SESSION_COLUMNS) <= set(sessions.columns)


def validation_split(
    sessions: pd.DataFrame, validation: Mapping[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(fit, validation)`` sessions of the training logs (``reranker_grpo.validation``:
    ``fraction``, ``seed``); both keep ``session_id`` order."""
    return split_sessions(sessions, validation["fraction"], seed=validation["seed"])


def candidate_features(
    sessions: pd.DataFrame,
    catalogue: pd.DataFrame,
    ranks: pd.Series | None = None,
    default_rank: float = 0.5,
) -> torch.Tensor:
    """``(N, L, F)`` ``OBSERVABLE_FEATURES`` of every candidate (candidate order), from the
    observable columns only; with ``ranks`` (``item_logged_ranks``) the item's logged rank as
    one more feature (``default_rank`` for an item it does not hold)."""
    sessions, catalogue = observable(sessions, catalogue)
    features, _ = session_features(sessions, catalogue)  # (N, L, all features)
    columns = [FEATURE_NAMES.index(name) for name in OBSERVABLE_FEATURES]
    features = features[..., columns].double()
    if ranks is None or not len(ranks):
        return features
    items = _candidates(sessions)  # (N, L)
    rank = ranks.reindex(items.ravel()).fillna(default_rank).to_numpy(np.float64, copy=True)
    return torch.cat([features, torch.from_numpy(rank.reshape(items.shape)).unsqueeze(-1)], -1)


def _candidates(sessions: pd.DataFrame) -> np.ndarray:
    return np.array([list(c) for c in sessions["candidates"]], dtype=np.int64)


def effect_keys(sessions: pd.DataFrame) -> dict[str, np.ndarray]:
    """``{group: (N, L)}`` every candidate's key in each group of ``EFFECT_GROUPS`` (candidate
    order): its item id, and its query and item id."""
    items = _candidates(sessions)
    queries = np.repeat(sessions["query_id"].to_numpy()[:, None], items.shape[1], axis=1)
    return {
        "item": items.astype(str),
        "query_item": np.char.add(np.char.add(queries.astype(str), ":"), items.astype(str)),
    }


def item_logged_ranks(sessions: pd.DataFrame, pseudo_count: float) -> tuple[pd.Series, float]:
    """Each item's mean relative position in the logged pages (``position / (L - 1)``, every
    listed candidate, shown or not), shrunk toward the mean over all of them by
    ``pseudo_count`` pseudo-pages, and that mean. What the production ranker thought of an
    item, read off its own logs."""
    order = np.array([list(o) for o in sessions["logged_order"]], dtype=np.int64)
    L = order.shape[1]
    items = np.take_along_axis(_candidates(sessions), order, axis=1)  # (N, L) by position
    relative = np.broadcast_to(np.arange(L) / max(L - 1, 1), items.shape)
    frame = pd.DataFrame({"item": items.ravel(), "rank": relative.ravel()})
    default = float(frame["rank"].mean())
    grouped = frame.groupby("item")["rank"].agg(["sum", "count"])
    ranks = (grouped["sum"] + pseudo_count * default) / (grouped["count"] + pseudo_count)
    return ranks.rename(LOGGED_RANK), default


def logged_impressions(
    sessions: pd.DataFrame,
    catalogue: pd.DataFrame,
    ranks: pd.Series | None = None,
    default_rank: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, np.ndarray]]:
    """The logged pages by position: ``(features (N, L, F), shown (N, L), clicks (N, L),
    long_views (N, L), keys {group: (N, L)})``; ``shown`` is every label but unexposed
    (``ranks``, ``default_rank`` as in ``candidate_features``)."""
    lengths = {len(c) for c in sessions["candidates"]}
    if len(lengths) > 1:
        raise ValueError(f"sessions must all have the same length, got {sorted(lengths)}")
    order = torch.tensor(np.array([list(o) for o in sessions["logged_order"]]), dtype=torch.long)
    features = candidate_features(sessions, catalogue, ranks, default_rank)  # (N, L, F)
    shown = torch.tensor(
        np.array([[label != LABEL_UNEXPOSED for label in row] for row in sessions["labels"]])
    )
    clicks = torch.tensor(np.array([list(c) for c in sessions["clicks"]]), dtype=torch.float64)
    long_views = torch.tensor(
        np.array([list(v) for v in sessions["long_views"]]), dtype=torch.float64
    )
    by_position = features.gather(1, order.unsqueeze(-1).expand_as(features))
    keys = {
        g: np.take_along_axis(k, order.numpy(), axis=1) for g, k in effect_keys(sessions).items()
    }
    return (
        by_position,
        shown.gather(1, order),
        clicks.gather(1, order),
        long_views.gather(1, order),
        keys,
    )


# The candidates of the fit table besides the configured model: what each adds is read off
# the rows (name -> (logged rank on, effects on)).
CANDIDATES = {"features": (False, False), "features_logged_rank": (True, False)}
CONFIGURED = "configured"


def fit_logged_click_model(
    sessions: pd.DataFrame, catalogue: pd.DataFrame, params: Mapping[str, Any]
) -> tuple[LoggedClickModel, pd.DataFrame]:
    """The click model of the fit part of ``sessions`` (``params``: ``reranker_grpo`` with
    ``validation`` and ``click_model``) and, as click models are judged, every candidate's fit
    on held-out sessions.

    Returns:
        The configured model (``click_model``: ``l2``, ``max_iter``, ``effects`` prior sds,
        ``item_logged_rank_pseudo_count``), and one row per (``model``, ``split``), ``split``
        ``fit`` / ``validation`` (fitted on the fit part) and, with ``click_model.cv_folds``
        K >= 2, ``cross_validation`` (each of K seeded folds of all of ``sessions`` scored by
        the candidates fitted to the other folds, pooled: every session held out once).
        ``model`` is one of ``constant`` (one CTR), ``position_only`` (CTR per position),
        ``features`` (the position-based model on ``OBSERVABLE_FEATURES``),
        ``features_logged_rank`` (+ the item's logged rank) and ``configured``. Columns:
        ``sessions``, ``impressions``, ``clicks``, the mean log-likelihood per impression
        (``click_loglik``), the click perplexity averaged over the positions with impressions
        (``click_perplexity``; per position ``perplexity_at_<p>``, 1 is perfect, 2 a coin),
        the gain in log-likelihood per impression over ``position_only`` with its standard
        error over sessions (``loglik_gain_vs_position_only``, ``_se``) and the long-view
        log-likelihood per click (``long_view_loglik``, the position-based candidates only).
    """
    options = params["click_model"]
    fit_part, validation = validation_split(sessions, params["validation"])
    candidates = _fit_candidates(fit_part, catalogue, options)
    rows = []
    for split, part in (("fit", fit_part), ("validation", validation)):
        rows += _fit_rows(split, len(part), *_scored(candidates, part, catalogue))
    folds = options.get("cv_folds") or 0
    if folds >= 2:
        rows += _cross_validation_rows(sessions, catalogue, options, folds, params["validation"])
    return candidates.models[CONFIGURED], pd.DataFrame(rows)


def fit_click_model(
    sessions: pd.DataFrame, catalogue: pd.DataFrame, params: Mapping[str, Any]
) -> LoggedClickModel:
    """The configured model of ``fit_logged_click_model`` alone, without the other candidates
    or the fit table (what a run that only needs the reward's click model fits)."""
    fit_part, _ = validation_split(sessions, params["validation"])
    candidates = _fit_candidates(fit_part, catalogue, params["click_model"], configured_only=True)
    return candidates.models[CONFIGURED]


@dataclass(frozen=True)
class _Candidates:
    """The click models of one fit part and its two baselines: ``per_position`` ``(L,)`` CTR
    per position, ``overall`` one CTR for all."""

    models: dict[str, LoggedClickModel]
    per_position: torch.Tensor
    overall: float


def _fit_candidates(
    fit_part: pd.DataFrame,
    catalogue: pd.DataFrame,
    options: Mapping[str, Any],
    configured_only: bool = False,
) -> _Candidates:
    """The position-based candidates (``CANDIDATES`` and the configured model, or the latter
    alone) fitted to ``fit_part``, and the baselines on the same impressions."""
    pseudo_count = options.get("item_logged_rank_pseudo_count")
    ranks, default_rank = item_logged_ranks(fit_part, pseudo_count or 0.0)
    prior_sd = {g: float(sd) for g, sd in (options.get("effects") or {}).items()}

    # The logs' features once, the logged rank last: a candidate without it drops that column.
    features, shown, clicks, long_views, keys = logged_impressions(
        fit_part, catalogue, ranks, default_rank
    )

    def fit(with_rank: bool, with_effects: bool) -> LoggedClickModel:
        kept = ranks if with_rank else ranks.iloc[:0]
        model = fit_position_based_click_model(
            features if with_rank else features[..., :-1],
            shown,
            clicks,
            long_views,
            l2=options["l2"],
            max_iter=options["max_iter"],
            effect_keys=keys,
            prior_sd=prior_sd if with_effects else None,
        )
        return LoggedClickModel(model, kept, default_rank)

    models = {} if configured_only else {name: fit(*flags) for name, flags in CANDIDATES.items()}
    models[CONFIGURED] = fit(pseudo_count is not None, True)
    per_position = (clicks * shown).sum(0) / shown.sum(0).clamp(min=1)  # (L,)
    return _Candidates(models, per_position, float(clicks[shown].mean()))


def _scored(
    candidates: _Candidates, part: pd.DataFrame, catalogue: pd.DataFrame
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, float]]:
    """``part``'s logged pages by position: ``(shown (S, L), clicks (S, L), P(click) (S, L)
    per model, the two baselines included, long-view log-likelihood per click per
    position-based model)``."""
    models = candidates.models
    # The part's features once, with the logged rank of the candidates that read it (they all
    # hold the same ranks, those of fit_part) last: the others drop that column.
    ranked = next((m for m in models.values() if len(m.item_logged_rank)), None)
    ranks = ranked.item_logged_rank if ranked is not None else None
    default_rank = ranked.default_rank if ranked is not None else 0.5
    all_features, part_shown, part_clicks, part_long_views, keys = logged_impressions(
        part, catalogue, ranks, default_rank
    )
    probabilities = {
        "constant": torch.full_like(part_clicks, candidates.overall),
        "position_only": candidates.per_position.expand_as(part_clicks),
    }
    long_views = {}
    for name, fitted in models.items():
        reads_rank = ranks is None or len(fitted.item_logged_rank)
        features = all_features if reads_rank else all_features[..., :-1]
        probabilities[name] = fitted.model.examination * fitted.model.attractiveness(features, keys)
        long_views[name] = long_view_log_likelihood(
            fitted.model, features, part_clicks, part_long_views, keys
        )
    return part_shown, part_clicks, probabilities, long_views


def _fit_rows(
    split: str,
    n_sessions: int,
    shown: torch.Tensor,
    clicks: torch.Tensor,
    probabilities: Mapping[str, torch.Tensor],
    long_views: Mapping[str, float],
) -> list[dict[str, Any]]:
    """One row per model of ``fit_logged_click_model``'s table."""
    baseline = _log_likelihoods(clicks, probabilities["position_only"])
    rows = []
    for name, p in probabilities.items():
        row = {
            "model": name,
            "split": split,
            "sessions": n_sessions,
            "impressions": int(shown.sum()),
            "clicks": int(clicks[shown].sum()),
            **_click_fit(shown, clicks, p, baseline),
        }
        if name in long_views:
            row["long_view_loglik"] = long_views[name]
        rows.append(row)
    return rows


def _cross_validation_rows(
    sessions: pd.DataFrame,
    catalogue: pd.DataFrame,
    options: Mapping[str, Any],
    folds: int,
    validation: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """``_fit_rows`` of ``folds``-fold cross-validation over ``sessions`` (folds seeded by
    ``validation.seed``), the held-out folds' predictions pooled."""
    fold_of = np.random.default_rng([validation["seed"], folds]).permutation(len(sessions))
    fold_of = fold_of % folds
    ordered = sessions.reset_index(drop=True)
    pooled: dict[str, list] = {"shown": [], "clicks": [], "p": [], "long_views": []}
    for fold in range(folds):
        held_out, rest = ordered[fold_of == fold], ordered[fold_of != fold]
        shown, clicks, probabilities, long_views = _scored(
            _fit_candidates(rest, catalogue, options), held_out, catalogue
        )
        pooled["shown"].append(shown)
        pooled["clicks"].append(clicks)
        pooled["p"].append(probabilities)
        pooled["long_views"].append((long_views, int(clicks.sum())))
    names = list(pooled["p"][0])
    probabilities = {n: torch.cat([p[n] for p in pooled["p"]]) for n in names}
    clicks_total = sum(count for _, count in pooled["long_views"])
    long_views = {  # per click, pooled over the folds' clicks
        n: sum(v[n] * count for v, count in pooled["long_views"]) / max(clicks_total, 1)
        for n in pooled["long_views"][0][0]
    }
    return _fit_rows(
        "cross_validation",
        len(ordered),
        torch.cat(pooled["shown"]),
        torch.cat(pooled["clicks"]),
        probabilities,
        long_views,
    )


def _log_likelihoods(clicks: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``(S, L)`` each position's Bernoulli log-likelihood of ``clicks`` under ``p``."""
    p = p.double().clamp(EPS, 1 - EPS)
    return clicks * p.log() + (1 - clicks) * (1 - p).log()


def _click_fit(
    shown: torch.Tensor, clicks: torch.Tensor, p: torch.Tensor, baseline: torch.Tensor
) -> dict[str, float]:
    """A click model's fit on impressions ``shown`` ``(S, L)``: mean log-likelihood, the
    perplexity per position and its mean, and the gain over ``baseline`` (the position-only
    log-likelihoods) with its standard error with sessions as the units (a ratio estimator:
    the gain per impression, linearised)."""
    ll = _log_likelihoods(clicks, p) * shown
    count = shown.sum(0)  # (L,)
    out = {"click_loglik": float(ll.sum() / shown.sum())}
    # Perplexity 2^(-mean log2 likelihood) = e^(-mean ln likelihood) at each position.
    at = torch.where(count > 0, torch.exp(-ll.sum(0) / count.clamp(min=1)), torch.nan)
    out["click_perplexity"] = float(at[count > 0].mean())
    per_session = (ll - baseline * shown).sum(1)  # (S,)
    n = shown.sum(1).double()  # (S,)
    gain = float(per_session.sum() / n.sum())
    S = len(n)
    residual = per_session - gain * n
    se = float(residual.pow(2).sum().sqrt() / n.sum() * math.sqrt(S / max(S - 1, 1)))
    out["loglik_gain_vs_position_only"] = gain
    out["loglik_gain_vs_position_only_se"] = se
    out.update({f"perplexity_at_{k}": float(v) for k, v in enumerate(at)})
    return out


def fitted_response(
    fitted: LoggedClickModel,
    sessions: pd.DataFrame,
    catalogue: pd.DataFrame,
    pessimism: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(attractiveness (N, L), long_view (N, L), position_weights (L,))`` of every
    session's candidates under the fitted model: its expected clicks of a page ``y`` are
    ``sum_p position_weights[p] * attractiveness[y[p]]`` (``chain.clicks.feedback``).
    ``pessimism``: ``kappa`` of the lower confidence bounds
    (``PositionBasedClickModel.attractiveness``)."""
    model = fitted.model
    features = candidate_features(
        sessions, catalogue, fitted.item_logged_rank, fitted.default_rank
    )  # (N, L, F)
    L = features.shape[1]
    if model.examination.shape[0] != L:
        raise ValueError(
            f"the click model was fitted on pages of {model.examination.shape[0]} positions, "
            f"these sessions have {L}"
        )
    keys = effect_keys(sessions)
    return (
        model.attractiveness(features, keys, pessimism),
        model.long_view(features, keys, pessimism),
        model.position_weights(),
    )


# ---------------------------------------------------------------- the catalog's table
def click_model_table(fitted: LoggedClickModel) -> pd.DataFrame:
    """The fitted model as a table (``logged_click_model.csv``): one row per parameter,
    columns ``part`` (``PARTS``, or ``click_effect:<group>`` / ``long_view_effect:<group>``
    for per-key offsets, ``..._prior`` for their prior sds), ``name`` (a position, feature,
    item or key), ``value``; the position rows also carry the logged ``exposure``, the
    effect rows their posterior ``sd``."""
    model, names = fitted.model, fitted.feature_names
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
            for n, w in zip(names, weights, strict=True)
        ]
        rows.append({"part": part, "name": "bias", "value": float(bias)})
    for part, values in (
        ("standardise_mean", model.feature_mean),
        ("standardise_scale", model.feature_scale),
    ):
        rows += [
            {"part": part, "name": n, "value": float(v)} for n, v in zip(names, values, strict=True)
        ]
    for logit, effects in (("click", model.click_effects), ("long_view", model.long_view_effects)):
        for effect in effects:
            part = f"{logit}_effect:{effect.group}"
            rows.append({"part": f"{part}_prior", "name": effect.group, "value": effect.prior_sd})
            rows += [
                {"part": part, "name": key, "value": float(m), "sd": float(sd)}
                for key, m, sd in zip(effect.keys, effect.mean, effect.sd, strict=True)
            ]
    if len(fitted.item_logged_rank):
        rows.append({"part": LOGGED_RANK, "name": "default", "value": fitted.default_rank})
        rows += [
            {"part": LOGGED_RANK, "name": str(item), "value": float(rank)}
            for item, rank in fitted.item_logged_rank.items()
        ]
    return pd.DataFrame(rows, columns=["part", "name", "value", "exposure", "sd"])


def click_model_from_table(table: pd.DataFrame) -> LoggedClickModel:
    """The ``LoggedClickModel`` of a ``click_model_table``.

    Raises:
        ValueError: a part or feature is missing (a table of another feature set).
    """
    table = table.assign(name=table["name"].astype(str))

    def part(name: str) -> pd.DataFrame:
        rows = table[table["part"] == name]
        if rows.empty:
            raise ValueError(f"the click-model table has no {name!r} rows; refit it")
        return rows

    ranks = table[(table["part"] == LOGGED_RANK) & (table["name"] != "default")]
    names = OBSERVABLE_FEATURES + ((LOGGED_RANK,) if len(ranks) else ())

    def by_feature(name: str) -> torch.Tensor:
        values = part(name).set_index("name")["value"]
        missing = sorted(set(names) - set(values.index))
        if missing:
            raise ValueError(f"the click-model table's {name!r} rows lack {missing}; refit it")
        return torch.tensor([float(values[n]) for n in names], dtype=torch.float64)

    def effects(logit: str) -> tuple[KeyedEffects, ...]:
        out = []
        for prior in table[
            table["part"].str.startswith(f"{logit}_effect:") & table["part"].str.endswith("_prior")
        ].itertuples():
            rows = part(prior.part.removesuffix("_prior"))
            out.append(
                KeyedEffects(
                    group=prior.name,
                    keys=tuple(rows["name"]),
                    mean=torch.tensor(rows["value"].to_numpy(float)),
                    sd=torch.tensor(rows["sd"].to_numpy(float)),
                    prior_sd=float(prior.value),
                )
            )
        return tuple(out)

    positions = part("position").assign(p=lambda f: f["name"].astype(int)).sort_values("p")
    bias = {
        n: float(part(n).set_index("name").loc["bias", "value"]) for n in ("click", "long_view")
    }
    model = PositionBasedClickModel(
        examination=torch.tensor(positions["value"].to_numpy(float)),
        exposure=torch.tensor(positions["exposure"].to_numpy(float)),
        click_weights=by_feature("click"),
        click_bias=bias["click"],
        long_view_weights=by_feature("long_view"),
        long_view_bias=bias["long_view"],
        feature_mean=by_feature("standardise_mean"),
        feature_scale=by_feature("standardise_scale"),
        click_effects=effects("click"),
        long_view_effects=effects("long_view"),
    )
    default = table[(table["part"] == LOGGED_RANK) & (table["name"] == "default")]["value"]
    item_ranks = pd.Series(
        ranks["value"].to_numpy(float), index=ranks["name"].astype(np.int64), name=LOGGED_RANK
    )
    return LoggedClickModel(model, item_ranks, float(default.iloc[0]) if len(default) else 0.5)


def recovery_table(fitted: LoggedClickModel, world: ClickModel) -> pd.DataFrame:
    """Per position, the fitted position bias beside the simulator's (a diagnostic of the
    evaluation: the fit never sees ``world``): ``examination_fitted`` / ``_true`` (``gamma_p``
    against ``(p + 1) ** -position_bias``), ``position_weight_fitted`` / ``_true``
    (exposure x examination), and their absolute errors."""
    model = fitted.model
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


def attractiveness_recovery(
    fitted: LoggedClickModel, sessions: pd.DataFrame, catalogue: pd.DataFrame, world: ClickModel
) -> pd.DataFrame:
    """How well the fit recovers what the simulated users do with each candidate of
    ``sessions`` (a diagnostic of the evaluation: the fit never sees ``world``): one row per
    part, ``click`` (fitted attractiveness against the simulator's ``P(click | examined)``)
    and ``long_view`` (``P(long view | click)``), with the Pearson correlation of their logits
    (``logit_correlation``), the Spearman correlation (``rank_correlation``) and the mean
    absolute error of the probabilities (``abs_error``) over the ``candidates``."""
    attractiveness, long_view, _ = fitted_response(fitted, *observable(sessions, catalogue))
    click_true, long_view_true = candidate_response(sessions, catalogue, world)
    rows = []
    for part, fitted_values, true_values in (
        ("click", attractiveness.numpy(), click_true),
        ("long_view", long_view.numpy(), long_view_true),
    ):
        fitted_p = fitted_values.ravel()
        true_p = np.asarray(true_values, dtype=np.float64).ravel()
        logits = [
            np.log(p / (1 - p))
            for p in (np.clip(fitted_p, EPS, 1 - EPS), np.clip(true_p, EPS, 1 - EPS))
        ]
        rows.append(
            {
                "part": part,
                "candidates": fitted_p.size,
                "logit_correlation": float(np.corrcoef(*logits)[0, 1]),
                "rank_correlation": float(
                    pd.Series(fitted_p).corr(pd.Series(true_p), method="spearman")
                ),
                "abs_error": float(np.abs(fitted_p - true_p).mean()),
            }
        )
    return pd.DataFrame(rows)
