"""Thin nodes of the ``reranker_grpo`` pipeline; the work happens in creditflow.training."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from creditflow.models.reranker import PointerReranker
from creditflow.reporting import metrics_frame, plot_reward_curves
from creditflow.training import CheckpointStore
from creditflow.training.grpo_runs import run_page_grpo
from creditflow.training.reranker_data import inputs_for, session_exp_scores
from creditflow.training.reranking import logged_sessions
from creditflow.training.strategies.page import PageReward, page_grpo_config

logger = logging.getLogger(__name__)

REWARD_COLUMNS = ("reward/page", "reward/r_old", "reward/exp_ndcg", "actor/kl", "actor/entropy")


def train_reranker_page_grpo(
    reranker_yaug: PointerReranker,
    query_logs_train: pd.DataFrame,
    catalogue_items: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
    pretrain_params: dict[str, Any],
) -> tuple[PointerReranker, pd.DataFrame, pd.DataFrame]:
    """SPEC 3.5: GRPO from the y_aug reranker with the page reward
    ``alpha * R_old + beta * nDCG@K(y, y^s)`` (R_old the click nDCG@K of the logged session,
    y^s the candidates by s_exp) and a KL term to the pre-trained reranker."""
    features, mask = inputs_for(
        query_logs_train, catalogue_items, item_experience_scores, pretrain_params, "yaug"
    )  # (N, L, F), (N, L)
    config = page_grpo_config(params["grpo"], n_candidates=mask.shape[1])
    reward = PageReward(
        logged_sessions(query_logs_train).clicks,
        session_exp_scores(query_logs_train, item_experience_scores),
        **params["reward"],
    )
    model, result = run_page_grpo(reranker_yaug, features, mask, reward, config, checkpoints)
    return model, metrics_frame(result.history), pd.DataFrame(result.samples)


def plot_reranker_grpo_curves(reranker_grpo_metrics: pd.DataFrame) -> Figure:
    """Page reward, its two parts, the KL to the pre-trained reranker and the pointer entropy
    against the GRPO step."""
    metrics = reranker_grpo_metrics.assign(run="page_grpo")
    return plot_reward_curves(metrics, REWARD_COLUMNS, group="run")
