"""Generative reranker engine pieces: features, targets, teacher-forced pre-training and
evaluation (docs/methods/experience.md, steps 4-5). The page-level GRPO reward is in
``chain.reranker.page_reward``.

Shape symbols: ``N`` sessions, ``B`` sampled pages, ``L`` candidates per session (the longest
session; shorter ones are padded at the end), ``F`` features. ``mask`` is True on real
candidates. Rankings map position -> candidate index (see ``chain.reranker.model``).

Features and targets read only what a production system logs (``candidates``,
``logged_order``, ``labels``, ``clicks``, ``query_text``) and the item table's ``item_id``,
``category``, ``title`` and ``popularity``; the hidden ``true_quality`` and ``relevance`` are
read by ``evaluate_rankings`` and the simulated A/B alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from creditflow.algorithms import masked_mean
from creditflow.chain.reranker.model import PointerReranker, step_mask
from creditflow.chain.reranker.ranking import augmented_target, ndcg_at_k, rank_gains
from creditflow.chain.world.catalogue import (
    CLICKBAIT_PREFIXES,
    FILLER_WORDS,
    FREQUENCY_BANDS,
    LABEL_CLICKED,
    LABEL_EXPOSED,
    LABEL_UNEXPOSED,
    category_vocabulary,
)
from creditflow.training.checkpoint import CheckpointStore, content_digest, run_store
from creditflow.training.supervised import SupervisedConfig, SupervisedTrainer

logger = logging.getLogger(__name__)

_LABEL_COLUMN = {LABEL_CLICKED: 0, LABEL_EXPOSED: 1, LABEL_UNEXPOSED: 2}


# ---------------------------------------------------------------- session tensors
def _pad(rows: Sequence[Sequence], fill: float | bool, dtype: torch.dtype) -> torch.Tensor:
    """``(N, L)`` tensor of ragged rows, right-padded with ``fill`` to the longest."""
    length = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), length), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
    return out


@dataclass(frozen=True)
class LoggedSessions:
    """The logged feedback of ``N`` sessions as padded tensors.

    mask: ``(N, L)`` bool, True on real candidates.
    clicks: ``(N, L)`` float 0/1 per candidate (the business gains of ``R_old``).
    unexposed: ``(N, L)`` bool, True on candidates labelled ``U``.
    logged_order: ``(N, L)`` long, position -> candidate; padding slots follow the real
        candidates in index order, so every row is a ranking in the ``chain.reranker.model`` layout.
    """

    mask: torch.Tensor
    clicks: torch.Tensor
    unexposed: torch.Tensor
    logged_order: torch.Tensor


def logged_sessions(sessions: pd.DataFrame) -> LoggedSessions:
    """Padded tensors of the ``clicks``, ``labels`` and ``logged_order`` columns."""
    lengths = [len(c) for c in sessions["candidates"]]
    L = max(lengths, default=0)
    mask = _pad([[1] * n for n in lengths], 0, torch.bool)
    orders = [
        list(o) + list(range(n, L)) for o, n in zip(sessions["logged_order"], lengths, strict=True)
    ]
    return LoggedSessions(
        mask=mask.view(len(lengths), L),
        clicks=_pad(list(sessions["clicks"]), 0.0, torch.float32).view(len(lengths), L),
        unexposed=_pad(
            [[label == LABEL_UNEXPOSED for label in labels] for labels in sessions["labels"]],
            False,
            torch.bool,
        ).view(len(lengths), L),
        logged_order=_pad(orders, 0, torch.long).view(len(lengths), L),
    )


def _query_categories(query_texts: Sequence[str], categories: Sequence[str]) -> list[str | None]:
    """The category most of a query's words belong to (the first word's on ties), None if no
    word is a topical word of any category."""
    word_category = {w: c for c in categories for w in category_vocabulary(c)}
    out = []
    for text in query_texts:
        named = [word_category[w] for w in text.split() if w in word_category]
        out.append(max(named, key=named.count) if named else None)
    return out


def session_features(
    sessions: pd.DataFrame, item_table: pd.DataFrame, exp_scores: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate features of every session (columns ``FEATURE_NAMES``), never the true quality.

    Args:
        sessions: frame with ``candidates``, ``logged_order``, ``labels`` and ``query_text``
            (``chain.world.catalogue.generate_sessions``).
        item_table: catalogue with ``item_id``, ``category``, ``title`` and ``popularity``
            (other columns, hidden ones included, are not read).
        exp_scores: ``(N, L)`` experience scores ``s_exp`` aligned with the padded candidates;
            None leaves both score features 0 (e.g. the click-only baseline).

    Returns:
        ``(features (N, L, F) float32, mask (N, L) bool)``.
    """
    logs = logged_sessions(sessions)
    N, L = logs.mask.shape
    if exp_scores is not None and tuple(exp_scores.shape) != (N, L):
        raise ValueError(
            f"exp_scores must have shape (N, L) = {(N, L)}, got {tuple(exp_scores.shape)}"
        )
    items = item_table.set_index("item_id")
    log_popularity = np.log(items["popularity"].to_numpy(dtype=np.float64))
    spread = log_popularity.std()
    pop_z = pd.Series(
        (log_popularity - log_popularity.mean()) / (spread if spread > 0 else 1.0),
        index=items.index,
    )
    categories = sorted(items["category"].unique())
    query_category = _query_categories(list(sessions["query_text"]), categories)

    candidates = list(sessions["candidates"])
    popularity = _pad([pop_z.loc[list(c)].tolist() for c in candidates], 0.0, torch.float32)
    match = _pad(
        [
            [float(cat == q) for cat in items["category"].loc[list(c)]]
            for c, q in zip(candidates, query_category, strict=True)
        ],
        0.0,
        torch.float32,
    )
    titles = _title_signals(candidates, items, query_category)  # (N, L, 3)
    position = logs.logged_order.argsort(dim=1).float()  # (N, L) candidate -> logged position
    label_one_hot = torch.zeros(N, L, len(_LABEL_COLUMN))
    for i, row in enumerate(sessions["labels"]):
        for j, label in enumerate(row):
            if label not in _LABEL_COLUMN:
                raise ValueError(
                    f"session row {i} has label {label!r}; valid labels: {sorted(_LABEL_COLUMN)}"
                )
            label_one_hot[i, j, _LABEL_COLUMN[label]] = 1.0

    if exp_scores is None:
        score = gain = torch.zeros(N, L)
    else:
        score = exp_scores.float()
        # Padding ranks last so the real candidates' gains do not depend on it.
        gain = rank_gains(score.masked_fill(~logs.mask, float("-inf")))
    lengths = logs.mask.sum(dim=1, keepdim=True).float()  # (N, 1)
    columns = [
        score,
        gain,
        popularity.view(N, L),
        match.view(N, L),
        position / (lengths - 1).clamp(min=1),
        1.0 / (position + 1.0),
    ]
    features = torch.cat([torch.stack(columns, dim=-1), titles, label_one_hot], dim=-1)  # (N, L, F)
    # where(), not a product: a padded score may be inf or NaN and 0 * inf is NaN.
    return torch.where(logs.mask.unsqueeze(-1), features, 0.0), logs.mask


_FILLER = frozenset(FILLER_WORDS)
_PREFIXES = tuple(p.lower() for p in CLICKBAIT_PREFIXES)


def title_signals(title: str, query_words: frozenset[str]) -> tuple[float, float, float]:
    """``(title_clickbait, title_filler_share, title_query_match)`` of one title (see
    ``FEATURE_NAMES``); ``query_words`` are the topical words of the query's category.

    >>> title_signals("WOW!!! THIS PASTA RECIPE!!!", frozenset({"pasta", "recipe"}))
    (1.0, 0.25, 0.5)
    """
    lowered = title.lower()
    letters = [c for c in title if c.isalpha()]
    markers = (
        lowered.startswith(_PREFIXES),
        title.endswith("!!!"),
        bool(letters) and all(c.isupper() for c in letters),
    )
    words = [w.strip("!.?,") for w in lowered.split()]
    words = [w for w in words if w]
    n = max(len(words), 1)  # an empty title has no share of anything
    filler = sum(w in _FILLER for w in words) / n
    match = sum(w in query_words for w in words) / n
    return sum(markers) / len(markers), filler, match


def _title_signals(
    candidates: Sequence[Sequence[int]], items: pd.DataFrame, query_category: Sequence[str | None]
) -> torch.Tensor:
    """``(N, L, 3)`` ``title_signals`` of each candidate, 0 on padding."""
    if "title" not in items.columns:
        raise ValueError("item_table needs a title column (the title features read it)")
    titles = items["title"]
    rows = []
    for members, category in zip(candidates, query_category, strict=True):
        words = frozenset(category_vocabulary(category)) if category is not None else frozenset()
        rows.append([title_signals(str(titles.loc[i]), words) for i in members])
    length = max((len(r) for r in rows), default=0)
    out = torch.zeros(len(rows), length, 3)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


# ---------------------------------------------------------------- pre-training targets
def click_first_order(clicked: torch.Tensor, logged_order: torch.Tensor) -> torch.Tensor:
    """Baseline target: the clicked candidates in logged order, then the rest in logged order.

    Args:
        clicked: ``(N, L)`` bool, True on clicked candidates (label ``C``).
        logged_order: ``(N, L)`` long, position -> candidate.

    Returns:
        ``(N, L)`` long ranking (position -> candidate).

    >>> click_first_order(torch.tensor([[False, True, True]]), torch.tensor([[2, 0, 1]]))
    tensor([[2, 1, 0]])
    """
    if clicked.shape != logged_order.shape or clicked.dim() != 2:
        raise ValueError(
            f"clicked and logged_order must both have shape (N, L), got "
            f"{tuple(clicked.shape)} and {tuple(logged_order.shape)}"
        )
    logged_order = logged_order.long()
    clicked_by_position = clicked.bool().gather(1, logged_order).to(torch.uint8)  # (N, L)
    # A stable sort on the clicked flag keeps the logged order inside each group.
    by_click = clicked_by_position.argsort(dim=1, descending=True, stable=True)
    return logged_order.gather(1, by_click)


def augmented_targets(
    clicked: torch.Tensor, exp_scores: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``y_aug`` (docs/methods/experience.md, step 4, ``algorithms.augmented_target``) of padded sessions: padding slots
    get score ``-inf`` so they come last, in index order (stable ties), as the reranker
    expects.

    clicked, exp_scores, mask: ``(N, L)``. Returns ``(N, L)`` long rankings.
    """
    scores = exp_scores.float().masked_fill(~mask.bool(), float("-inf"))
    return augmented_target(clicked.bool() & mask.bool(), scores)


# ---------------------------------------------------------------- pre-training
def teacher_forcing_nll(
    model: PointerReranker, features: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Scalar mean negative log-likelihood per counted step of ``targets`` (docs/methods/experience.md, step 4).

    features: ``(N, L, F)``; mask: ``(N, L)`` bool; targets: ``(N, L)`` long rankings. Padding
    steps are forced and excluded from the mean.
    """
    logp = model.log_probs_of(features, mask, targets)  # (N, L)
    return masked_mean(-logp, step_mask(mask.bool()))


def pretrain_reranker(
    model: PointerReranker,
    features: torch.Tensor,
    mask: torch.Tensor,
    targets: torch.Tensor,
    *,
    training: SupervisedConfig,
    checkpoints: CheckpointStore | None = None,
    progress: bool = True,
) -> list[dict[str, float]]:
    """Teacher-forced pre-training of the reranker on target rankings (docs/methods/experience.md, step 4).

    Each step draws ``training.batch_size`` sessions (``EpochSampler``: reshuffled every epoch,
    a batch may straddle two), minimises ``teacher_forcing_nll`` with AdamW and leaves the
    model in eval mode.

    Args:
        model: the reranker, trained in place.
        features: ``(N, L, F)`` float candidate features.
        mask: ``(N, L)`` bool, True on real candidates.
        targets: ``(N, L)`` long rankings, e.g. ``augmented_targets`` (y_aug) or
            ``click_first_order`` (the baseline).
        training: steps, sessions per step (capped at N; a batch may straddle two epochs of
            the one ``EpochSampler``, so it can hold a session twice), AdamW,
            clipping and the session order's seed; the chain's settings are
            ``PRETRAIN_TRAINING``.
        checkpoints: a store to resume from and save to every ``training.checkpoint_every``
            steps and at the end; the run goes into a subdirectory keyed by the starting
            weights, the three tensors and ``training``.
        progress: show a progress bar.

    Returns:
        One row per step: ``{"step", "pretrain/nll", "lr"}``.
    """
    N = features.shape[0]
    if N < 1:
        raise ValueError("no sessions to pre-train on")
    if targets.shape != mask.shape or features.shape[:2] != mask.shape:
        raise ValueError(
            f"need features (N, L, F), mask (N, L), targets (N, L); got {tuple(features.shape)}, "
            f"{tuple(mask.shape)}, {tuple(targets.shape)}"
        )
    config = type(training)(**{**training.to_dict(), "batch_size": min(training.batch_size, N)})
    device = next(model.parameters()).device

    def batch_fn(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        index = torch.tensor(rows)
        return features[index].to(device), mask[index].to(device), targets[index].to(device)

    def loss_fn(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, dict[str, float]]:
        loss = teacher_forcing_nll(model, *batch)
        return loss, {"pretrain/nll": loss.item()}

    digests = [content_digest(t) for t in (features, mask, targets)]
    store = run_store(checkpoints, model, config.run_key(), digests)
    history = SupervisedTrainer(
        model, N, batch_fn, loss_fn, config, store, desc="pretrain reranker", progress=progress
    ).train()
    model.eval()
    logger.info(
        "pre-trained the reranker for %d steps, final NLL %.4f",
        config.steps,
        history[-1]["pretrain/nll"],
    )
    return history


# ---------------------------------------------------------------- evaluation
EVALUATION_METRICS = ("true_ndcg", "click_ndcg", "exp_ndcg", "unexposed_top_k_share")


def evaluate_rankings(
    rankings: torch.Tensor,
    sessions: pd.DataFrame,
    exp_scores: torch.Tensor | None,
    k: int,
    gain_mode: str = "rank",
) -> pd.DataFrame:
    """Per-session quality of rankings against the hidden truth and the logs.

    Args:
        rankings: ``(N, L)`` long, position -> candidate (padding slots, if any, after the real
            candidates).
        sessions: the sessions ranked (``generate_sessions`` frame, incl. ``true_quality``;
            without that column ``true_ndcg`` is NaN).
        exp_scores: ``(N, L)`` experience scores, or None to skip ``exp_ndcg``.
        k: nDCG cut-off (>= 1).
        gain_mode: gains of ``y^s`` for ``exp_ndcg`` (``algorithms.rank_gains``), as in the
            page reward (``reranker_grpo.reward.gain_mode``).

    Returns:
        One row per session: ``session_id``, ``query_frequency_band``, ``true_ndcg`` (nDCG@k with
        the hidden ``true_quality`` as gains: the experience actually delivered), ``click_ndcg``
        (``R_old``, clicks as gains), ``exp_ndcg`` (against ``y^s`` of ``exp_scores``, as in the
        reward) and ``unexposed_top_k_share`` (share of the top ``min(k, n)`` slots given to
        never-exposed candidates).
    """
    logs = logged_sessions(sessions)
    N, L = logs.mask.shape
    if tuple(rankings.shape) != (N, L):
        raise ValueError(f"rankings must have shape (N, L) = {(N, L)}, got {tuple(rankings.shape)}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    rankings = rankings.long()
    if "true_quality" in sessions.columns:
        truth = _pad(list(sessions["true_quality"]), 0.0, torch.float32).view(N, L)
        true_ndcg = ndcg_at_k(truth.gather(1, rankings), k, ideal_gains=truth)
    else:  # logs of your own without a known quality (chain.world.sources)
        true_ndcg = torch.full((N,), float("nan"))
    frame = {
        "session_id": sessions["session_id"].to_numpy(),
        "query_frequency_band": sessions["query_frequency_band"].to_numpy(),
        "true_ndcg": true_ndcg,
        "click_ndcg": ndcg_at_k(logs.clicks.gather(1, rankings), k, ideal_gains=logs.clicks),
    }
    if exp_scores is not None:
        scores = exp_scores.float()
        if gain_mode == "minmax":
            # Padding at the row's lowest real score leaves its min and max unchanged.
            real_min = scores.masked_fill(~logs.mask, float("inf")).amin(dim=1, keepdim=True)
            scores = torch.where(logs.mask, scores, real_min)
        else:
            scores = scores.masked_fill(~logs.mask, float("-inf"))  # ranks padding last
        # Padding gets no gain: it must not enter the ideal DCG.
        gains = rank_gains(scores, gain_mode).masked_fill(~logs.mask, 0.0)
        frame["exp_ndcg"] = ndcg_at_k(gains.gather(1, rankings), k, ideal_gains=gains)
    top = torch.arange(L) < torch.minimum(logs.mask.sum(dim=1, keepdim=True), torch.tensor(k))
    unexposed_on_top = logs.unexposed.gather(1, rankings) & top
    frame["unexposed_top_k_share"] = unexposed_on_top.sum(dim=1) / top.sum(dim=1).clamp(min=1)
    return pd.DataFrame({name: _numpy(v) for name, v in frame.items()})


def _numpy(values: torch.Tensor | np.ndarray) -> np.ndarray:
    return values.numpy() if isinstance(values, torch.Tensor) else np.asarray(values)


def summarise_by_band(per_session: pd.DataFrame) -> pd.DataFrame:
    """Mean of each metric of ``evaluate_rankings`` per query-frequency band, plus ``all``.

    Returns a frame indexed by band (``head``, ``torso``, ``tail`` as present, then ``all``) with
    the metric columns, ``<metric>_se`` (the standard error of that mean across the band's
    sessions: sample std / sqrt(n), NaN for one session) and ``sessions`` (the count). Two
    rankers evaluated on the same sessions are paired: the standard error of their difference
    is smaller than these suggest.
    """
    metrics = [c for c in EVALUATION_METRICS if c in per_session.columns]
    if not metrics or "query_frequency_band" not in per_session.columns:
        raise ValueError(
            "per_session must be an evaluate_rankings frame with query_frequency_band and at "
            f"least one of {list(EVALUATION_METRICS)}"
        )
    grouped = per_session.groupby("query_frequency_band")[metrics]
    bands = [b for b in FREQUENCY_BANDS if b in grouped.groups]
    summary = grouped.mean().reindex(bands)
    errors = grouped.sem().reindex(bands).add_suffix("_se")
    summary = pd.concat([summary, errors], axis=1)
    summary["sessions"] = per_session["query_frequency_band"].value_counts().reindex(bands)
    overall = pd.concat([per_session[metrics].mean(), per_session[metrics].sem().add_suffix("_se")])
    overall = overall.to_frame("all").T
    overall["sessions"] = len(per_session)
    return pd.concat([summary, overall]).rename_axis("band")
