"""Thin nodes of the ``reranker_pretrain`` pipeline; the work happens in creditflow.training."""

from __future__ import annotations

from typing import Any

import pandas as pd

from creditflow.chain.config import PRETRAIN_TRAINING
from creditflow.chain.reranker import training as reranker_training
from creditflow.chain.reranker.data import inputs_for, rankings_from_frame
from creditflow.chain.reranker.model import PointerReranker, build_reranker
from creditflow.reporting.tables import metrics_frame
from creditflow.training import CheckpointStore
from creditflow.training.supervised import SupervisedConfig


def pretrain_reranker(
    targets: pd.DataFrame,
    query_logs_train: pd.DataFrame,
    catalogue_items: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
    kind: str,
    label: str | None = None,
) -> tuple[PointerReranker, pd.DataFrame]:
    """A fresh reranker trained by teacher forcing to emit ``targets`` (y_aug or click-first)
    on the training sessions, reading the inputs of setting ``kind``; returns it and the
    per-step NLL, labelled ``label`` (default ``kind``). A re-run of the same run resumes from
    (or loads) its checkpoint in ``checkpoints``."""
    training = SupervisedConfig.from_params(params["training"], **PRETRAIN_TRAINING)
    features, mask = inputs_for(
        query_logs_train, catalogue_items, item_experience_scores, params, kind
    )
    model = build_reranker(features.shape[-1], params["model"], seed=params["model_seed"])
    rankings = rankings_from_frame(query_logs_train, targets)
    history = reranker_training.pretrain_reranker(
        model, features, mask, rankings, training=training, checkpoints=checkpoints
    )
    return model, metrics_frame(history).assign(reranker=label or kind)
