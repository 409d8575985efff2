"""The reranker chain's tables as tensors and back (docs/methods/experience.md).

The pipelines ``annotation`` -> ``expmodel_sft`` -> ``expmodel_pft`` -> ``experience_scoring``
-> ``augmented_targets`` -> ``reranker_pretrain`` -> ``reranker_grpo`` -> ``reranker_eval`` pass
sessions, item scores and rankings between them as tables; this module splits the sessions,
turns the tables into the padded tensors the engines take (``chain.reranker.training``,
``page_grpo.run_page_grpo``), rankings back into tables, and ranks and evaluates held-out
sessions with the trained rerankers.

Shape symbols: ``N`` sessions, ``L`` candidates per session, ``F`` candidate features.
Rankings map position -> candidate index (``creditflow.chain.reranker.model``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from creditflow.chain.annotation import QUERY_COLUMN
from creditflow.chain.config import FEATURE_NAMES
from creditflow.chain.reranker.model import PointerReranker
from creditflow.chain.reranker.policy import greedy_rankings
from creditflow.chain.reranker.training import (
    evaluate_rankings,
    logged_sessions,
    session_features,
)

RANKING_COLUMNS = ("session_id", "ranking", "ranked_items")
# The ranker name of the logged production order in evaluation tables.
LOGGED = "logged"


# ---------------------------------------------------------------- sessions
def split_sessions(
    sessions: pd.DataFrame, heldout_fraction: float, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A seeded split of sessions: ``round(heldout_fraction * n)`` held out, the rest for
    training; both keep ``session_id`` order.

    >>> frame = pd.DataFrame({"session_id": range(8)})
    >>> [len(part) for part in split_sessions(frame, 0.25, seed=0)]
    [6, 2]
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must lie in (0, 1), got {heldout_fraction}")
    n_heldout = round(heldout_fraction * len(sessions))
    if not 0 < n_heldout < len(sessions):
        raise ValueError(
            f"heldout_fraction {heldout_fraction} of {len(sessions)} sessions leaves one side "
            "empty; generate more sessions or change the fraction"
        )
    heldout = np.zeros(len(sessions), dtype=bool)
    heldout[np.random.default_rng(seed).permutation(len(sessions))[:n_heldout]] = True
    ordered = sessions.reset_index(drop=True)
    return ordered[~heldout].reset_index(drop=True), ordered[heldout].reset_index(drop=True)


def session_exp_scores(sessions: pd.DataFrame, item_scores: pd.DataFrame) -> torch.Tensor:
    """``(N, L)`` float32 ``s_exp`` of each session's candidates, right-padded with 0 like
    ``chain.reranker.training.session_features``. ``item_scores`` is ``item_id, s_exp`` (one score
    per item) or, with a ``query_text`` column, s_{q,v} per (query, item)
    (``expmodel_sft.score_mode: query``): each candidate then gets its score for the
    session's query.

    Raises:
        ValueError: a candidate has no score (the scores come from another catalogue, or
            another query's sessions).
    """
    per_query = QUERY_COLUMN in item_scores.columns
    keys = (
        zip(item_scores[QUERY_COLUMN], item_scores["item_id"], strict=True)
        if per_query
        else item_scores["item_id"]
    )
    lookup = dict(zip(keys, item_scores["s_exp"], strict=True))
    candidates = [list(c) for c in sessions["candidates"]]
    queries = sessions[QUERY_COLUMN] if per_query else [None] * len(candidates)
    wanted = [
        [(query, i) if per_query else i for i in items]
        for query, items in zip(queries, candidates, strict=True)
    ]
    missing = sorted({key for keys in wanted for key in keys} - set(lookup), key=str)
    if missing:
        raise ValueError(
            f"{len(missing)} candidate(s) have no experience score, e.g. {missing[:5]}; "
            "score the catalogue (and queries) the sessions were drawn from"
        )
    L = max((len(c) for c in candidates), default=0)
    scores = torch.zeros(len(candidates), L)
    for row, keys in enumerate(wanted):
        scores[row, : len(keys)] = torch.tensor([lookup[k] for k in keys], dtype=torch.float32)
    return scores  # (N, L)


# ---------------------------------------------------------------- reranker inputs
def reranker_inputs(
    sessions: pd.DataFrame,
    items: pd.DataFrame,
    item_scores: pd.DataFrame | None,
    exclude: Sequence[str] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features (N, L, F), mask (N, L))`` of ``session_features``, with the ``exclude``d
    feature columns set to 0 (the model keeps ``F`` inputs, so every reranker has the same
    architecture). ``item_scores`` None gives the score features 0 (a reranker without the
    experience model)."""
    unknown = sorted(set(exclude) - set(FEATURE_NAMES))
    if unknown:
        raise ValueError(f"unknown feature(s) {unknown} to exclude; valid: {list(FEATURE_NAMES)}")
    scores = None if item_scores is None else session_exp_scores(sessions, item_scores)
    features, mask = session_features(sessions, items, scores)  # (N, L, F), (N, L)
    dropped = torch.tensor([name in set(exclude) for name in FEATURE_NAMES])  # (F,)
    return features.masked_fill(dropped, 0.0), mask


def reranker_setting(params: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """The settings of reranker ``kind`` in ``params['rerankers']``."""
    if kind not in params["rerankers"]:
        raise ValueError(
            f"unknown reranker {kind!r}; parameters define {sorted(params['rerankers'])}"
        )
    return params["rerankers"][kind]


def inputs_for(
    sessions: pd.DataFrame,
    item_table: pd.DataFrame,
    item_scores: pd.DataFrame | None,
    params: Mapping[str, Any],
    kind: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features (N, L, F), mask (N, L))`` as reranker ``kind`` reads them: with or without
    the experience-score features (zero when ``item_scores`` is None), less the excluded ones.
    ``params`` is the ``reranker_pretrain`` group (``rerankers``, ``features.exclude``)."""
    scores = item_scores if reranker_setting(params, kind)["use_exp_scores"] else None
    return reranker_inputs(sessions, item_table, scores, params["features"]["exclude"])


# ---------------------------------------------------------------- rankings as tables
def rankings_frame(sessions: pd.DataFrame, rankings: torch.Tensor) -> pd.DataFrame:
    """``RANKING_COLUMNS``: per session its ranking (``list[int]``, position -> candidate index,
    real candidates only) and the ranked ``item_id`` values, for a person to read."""
    rows = []
    for session, ranking in zip(sessions.itertuples(index=False), rankings.tolist(), strict=True):
        n = len(session.candidates)
        order = ranking[:n]  # padding slots come after the real candidates
        rows.append((session.session_id, order, [int(session.candidates[i]) for i in order]))
    return pd.DataFrame(rows, columns=list(RANKING_COLUMNS))


def rankings_from_frame(sessions: pd.DataFrame, frame: pd.DataFrame) -> torch.Tensor:
    """``(N, L)`` long rankings of ``sessions`` (matched by ``session_id``) read from a
    ``rankings_frame``; padding slots follow in index order, as the reranker expects."""
    by_session = dict(zip(frame["session_id"], frame["ranking"], strict=True))
    missing = sorted(set(sessions["session_id"]) - set(by_session))
    if missing:
        raise ValueError(f"no ranking for session(s) {missing[:5]} (of {len(missing)})")
    lengths = [len(c) for c in sessions["candidates"]]
    L = max(lengths, default=0)
    rows = [
        [int(i) for i in by_session[s]] + list(range(n, L))
        for s, n in zip(sessions["session_id"], lengths, strict=True)
    ]
    return torch.tensor(rows, dtype=torch.long).view(len(rows), L)


# ---------------------------------------------------------------- served pages
PAGE_COLUMNS = ("ranker", "draw", "session_id", "ranking")


def serve_pages(  # noqa: PLR0913 - the rankers, what they read, and how sampled pages are drawn
    sessions: pd.DataFrame,
    item_table: pd.DataFrame,
    item_scores: pd.DataFrame | None,
    models: Mapping[str, PointerReranker],
    kinds: Mapping[str, str],
    params: Mapping[str, Any],
    *,
    sampled: Mapping[str, str] | None = None,
    temperature: float = 1.0,
    samples: int = 1,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """The pages each ranker serves on ``sessions``: name -> ``(D, N, L)`` long rankings.

    ``LOGGED`` is the logged order and every model of ``models`` its greedy page (``D = 1``);
    ``sampled`` (new name -> a model's name) adds ``samples`` pages per session drawn from that
    model at ``temperature`` (``D = samples``, seeded by ``seed``): the pages a policy trained
    at that temperature actually produced. ``kinds`` names, per model, the reranker setting of
    ``params`` (the ``reranker_pretrain`` group) that says what it reads.
    """
    sampled = dict(sampled or {})
    unnamed = sorted(set(models) - set(kinds))
    if unnamed:
        raise ValueError(f"no reranker setting named for model(s) {unnamed}; got {dict(kinds)}")
    unknown = sorted(set(sampled.values()) - set(models))
    if unknown:
        raise ValueError(f"sampled pages of unknown model(s) {unknown}; models: {list(models)}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    inputs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def inputs_of(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        kind = kinds[name]
        if kind not in inputs:
            inputs[kind] = inputs_for(sessions, item_table, item_scores, params, kind)
        return inputs[kind]  # (N, L, F), (N, L)

    pages = {LOGGED: logged_sessions(sessions).logged_order.unsqueeze(0)}  # (1, N, L)
    for name, model in models.items():
        pages[name] = greedy_rankings(model, *inputs_of(name)).unsqueeze(0)  # (1, N, L)
    for name, source in sampled.items():
        generator = torch.Generator().manual_seed(seed)
        model = models[source].eval()
        with torch.no_grad():
            draws = [
                model.sample(*inputs_of(source), generator=generator, temperature=temperature)[0]
                for _ in range(samples)
            ]
        pages[name] = torch.stack(draws)  # (D, N, L)
    return pages


def pages_frame(pages: Mapping[str, torch.Tensor], sessions: pd.DataFrame) -> pd.DataFrame:
    """``PAGE_COLUMNS``, one row per (ranker, draw, session): ``serve_pages`` as a table."""
    ids = sessions["session_id"].tolist()
    rows = [
        (name, draw, session_id, [int(v) for v in ranking])
        for name, ranked in pages.items()
        for draw, page in enumerate(ranked.tolist())
        for session_id, ranking in zip(ids, page, strict=True)
    ]
    return pd.DataFrame(rows, columns=list(PAGE_COLUMNS))


def pages_from_frame(frame: pd.DataFrame, sessions: pd.DataFrame) -> dict[str, torch.Tensor]:
    """``pages_frame`` read back: name -> ``(D, N, L)``, sessions in ``sessions`` order, rankers
    in table order."""
    order = {s: i for i, s in enumerate(sessions["session_id"])}
    pages = {}
    for name, part in frame.groupby("ranker", sort=False):
        draws = []
        for _, page in part.groupby("draw", sort=True):
            by_session = dict(zip(page["session_id"], page["ranking"], strict=True))
            missing = sorted(set(order) - set(by_session))
            if missing:
                raise ValueError(f"ranker {name!r} has no page for session(s) {missing[:5]}")
            draws.append([list(by_session[s]) for s in order])
        pages[name] = torch.tensor(draws, dtype=torch.long)  # (D, N, L)
    return pages


# ---------------------------------------------------------------- evaluation tables
def evaluate_pages(
    pages: Mapping[str, torch.Tensor],
    sessions: pd.DataFrame,
    item_scores: pd.DataFrame | None,
    k: int,
    gain_mode: str = "rank",
) -> pd.DataFrame:
    """``evaluate_rankings`` (at ``k``, ``gain_mode``) of every ranker's ``(D, N, L)`` pages
    (``serve_pages``), the metrics of a session averaged over its ``D`` pages: one long table
    with a ``ranker`` column, rankers in ``pages`` order."""
    scores = None if item_scores is None else session_exp_scores(sessions, item_scores)
    frames = []
    for name, ranked in pages.items():
        draws = [evaluate_rankings(page, sessions, scores, k, gain_mode) for page in ranked]
        frame = draws[0].copy()
        metrics = frame.columns.drop(["session_id", "query_frequency_band"])
        frame[metrics] = sum(d[metrics] for d in draws) / len(draws)
        frames.append(frame.assign(ranker=name))
    return pd.concat(frames, ignore_index=True)


# Evaluated rankers, in table order: the logged production order (LOGGED), then
# the greedy pages of the rerankers (name -> which reranker_pretrain setting says what the model
# reads). The four pre-trained ones are target x inputs: click or y_aug
# target, with or without the s_exp features; every other feature is the same for all.
RERANKER_INPUTS = {
    "click_pretrained": "click",
    "click_exp_pretrained": "click_exp",
    "yaug_no_exp_pretrained": "yaug_no_exp",
    "yaug_pretrained": "yaug",
    "yaug_page_grpo": "yaug",
}


def named_rerankers(
    *models: PointerReranker, names: Mapping[str, str] = RERANKER_INPUTS
) -> dict[str, PointerReranker]:
    """``models`` under the names of ``names`` (default: the chain's ``RERANKER_INPUTS``)."""
    return dict(zip(names, models, strict=True))
