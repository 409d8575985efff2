"""Thin nodes of the ``movielens_eval`` pipeline; the work happens in creditflow.tasks/training."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from creditflow.models.reranker import PointerReranker
from creditflow.pipelines.reranker_eval.nodes import named_rerankers
from creditflow.reporting import plot_metrics_by_band, summarise_rankers_by_band
from creditflow.tasks.movielens import movielens_sessions
from creditflow.training.config import checked_options
from creditflow.training.reranker_data import rank_and_evaluate
from creditflow.training.reranking import EVALUATION_METRICS

logger = logging.getLogger(__name__)

# The rerankers evaluated on MovieLens (name -> the reranker_pretrain setting of its inputs).
MOVIELENS_RERANKERS = {
    "click_pretrained": "click",
    "yaug_pretrained": "yaug",
    "yaug_page_grpo": "yaug",
}


def build_movielens_sessions(
    movielens_ratings: pd.DataFrame, movielens_items: pd.DataFrame, params: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One ranking session per user (held-back rated movies plus unrated negatives, a
    popularity-ordered logged page) and the item table the reranker features read."""
    options = checked_options(
        params["sessions"],
        movielens_sessions,
        "movielens_eval.sessions",
        taken=("ratings", "items"),
    )
    return movielens_sessions(movielens_ratings, movielens_items, **options)


def evaluate_rerankers_on_movielens(
    movielens_sessions: pd.DataFrame,
    movielens_item_table: pd.DataFrame,
    reranker_click: PointerReranker,
    reranker_yaug: PointerReranker,
    reranker_page_grpo: PointerReranker,
    params: dict[str, Any],
    pretrain_params: dict[str, Any],
) -> pd.DataFrame:
    """Per MovieLens session and ranker: nDCG@K of the ratings (``true_ndcg``, rating / 5 as
    the gain), of the positive ratings (``click_ndcg``) and the top-K share of unrated movies.
    MovieLens items have no covers, so there are no experience scores: every reranker reads
    zero score features and ``exp_ndcg`` is not computed."""
    models = named_rerankers(
        reranker_click, reranker_yaug, reranker_page_grpo, names=MOVIELENS_RERANKERS
    )
    return rank_and_evaluate(
        movielens_sessions,
        movielens_item_table,
        None,
        models,
        MOVIELENS_RERANKERS,
        pretrain_params,
        k=params["k"],
    )


def summarise_movielens_evaluation(
    movielens_evaluation_sessions: pd.DataFrame,
) -> tuple[pd.DataFrame, Figure]:
    """The MovieLens table (ranker x user band: head, torso, tail, all) and its bar plot."""
    table = summarise_rankers_by_band(movielens_evaluation_sessions)
    logger.info("reranker evaluation on MovieLens:\n%s", table.to_string(index=False))
    return table, plot_metrics_by_band(table, EVALUATION_METRICS)
