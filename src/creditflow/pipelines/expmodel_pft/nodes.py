"""Thin nodes of the ``expmodel_pft`` pipeline; the work happens in creditflow.chain.expmodel."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pandas as pd

from creditflow.chain.expmodel import data as expmodel_data
from creditflow.chain.expmodel import pft as expmodel_pft
from creditflow.chain.expmodel.pft import HELDOUT_ACCURACY
from creditflow.chain.expmodel.scorer import ExpScorer
from creditflow.config.values import checked_options
from creditflow.reporting.tables import metrics_frame
from creditflow.training import CheckpointStore
from creditflow.training.supervised import SupervisedConfig
from creditflow.training.threads import torch_threads

logger = logging.getLogger(__name__)


def build_preference_pairs(
    query_logs_train: pd.DataFrame, expmodel_annotations: pd.DataFrame, params: dict[str, Any]
) -> pd.DataFrame:
    """docs/methods/experience.md, step 3: ordered pairs (A > B) of annotated candidates of long-tail training sessions
    whose annotated overall scores differ by at least the margin; per query (each item's
    annotation for the session's query, the pair keeps the query) in query mode."""
    options = checked_options(
        params["pairs"],
        expmodel_data.preference_pairs,
        "expmodel_pft.pairs",
        taken=("sessions_df", "annotations_df"),
    )
    pairs = expmodel_data.preference_pairs(query_logs_train, expmodel_annotations, **options)
    if pairs.empty:
        raise ValueError(
            "no preference pair: lower expmodel_pft.pairs.margin, add bands or generate more "
            "sessions (annotation.query_logs)"
        )
    logger.info("%d preference pairs from %d sessions", len(pairs), pairs["session_id"].nunique())
    return pairs


def train_expmodel_pft(
    expmodel_sft_model,
    expmodel_processor,
    catalogue_items: pd.DataFrame,
    expmodel_preference_pairs: pd.DataFrame,
    expmodel_item_split: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
) -> tuple[ExpScorer, pd.DataFrame]:
    """docs/methods/experience.md, step 3: a scalar head on a copy of the SFT'd backbone, trained on the pairs of two
    train items (``expmodel_item_split``; the unseen ones are for the evaluation) with
    ``-log sigmoid(s+ - s-) + lambda (s+ + s-)^2``. The metrics table holds one row per step;
    its last row also holds the pair accuracy on the held-out pairs (``pft/heldout_accuracy``).
    A re-run of the same run resumes from (or loads) its checkpoint in ``checkpoints``."""
    training = SupervisedConfig.from_params(params["training"], **expmodel_data.EXPMODEL_TRAINING)
    options = expmodel_pft.PFTOptions.from_params(params["pft"])
    # from_generator shares the backbone: the copy keeps the SFT model as it was saved.
    scorer = ExpScorer.from_generator(copy.deepcopy(expmodel_sft_model))
    train_items = expmodel_data.split_ids(expmodel_item_split, expmodel_data.TRAIN)
    train_pairs = expmodel_data.pairs_within(expmodel_preference_pairs, train_items)
    with torch_threads(params.get("torch_threads")):
        scorer, history, heldout_accuracy = expmodel_pft.train_expmodel_pft(
            scorer,
            expmodel_processor,
            catalogue_items,
            train_pairs,
            training=training,
            options=options,
            checkpoints=checkpoints,
        )
    metrics = metrics_frame(history)
    metrics[HELDOUT_ACCURACY] = float("nan")  # measured once, after training
    metrics.loc[metrics.index[-1], HELDOUT_ACCURACY] = heldout_accuracy
    return scorer, metrics
