"""Thin nodes of the ``augmented_targets`` pipeline; the work happens in creditflow.training."""

from __future__ import annotations

from typing import Any

import pandas as pd

from creditflow.chain.ab_test.controls import shuffled_scores
from creditflow.chain.reranker.data import rankings_frame, session_exp_scores
from creditflow.chain.reranker.training import (
    augmented_targets,
    click_first_order,
    logged_sessions,
)


def build_augmented_targets(
    query_logs_train: pd.DataFrame, item_experience_scores: pd.DataFrame
) -> pd.DataFrame:
    """docs/methods/experience.md, step 4: per training session, ``y_aug`` = clicked candidates by s_exp descending, then
    the exposed-not-clicked and unexposed ones by s_exp descending."""
    logs = logged_sessions(query_logs_train)
    scores = session_exp_scores(query_logs_train, item_experience_scores)  # (N, L)
    y_aug = augmented_targets(logs.clicks.bool(), scores, logs.mask)  # (N, L)
    return rankings_frame(query_logs_train, y_aug)


def build_click_first_targets(query_logs_train: pd.DataFrame) -> pd.DataFrame:
    """The baseline target: clicked candidates in logged order, then the rest in logged order
    (what a reranker trained on click logs alone imitates)."""
    logs = logged_sessions(query_logs_train)
    return rankings_frame(
        query_logs_train, click_first_order(logs.clicks.bool(), logs.logged_order)
    )


def shuffle_experience_scores(
    item_experience_scores: pd.DataFrame, pretrain_params: dict[str, Any]
) -> pd.DataFrame:
    """The shuffled-s_exp control's scores: s_exp permuted within each query, seeded by
    ``reranker_pretrain.controls.shuffled_exp.seed`` (``chain.ab_test.controls``)."""
    seed = pretrain_params["controls"]["shuffled_exp"]["seed"]
    return shuffled_scores(item_experience_scores, seed=seed)
