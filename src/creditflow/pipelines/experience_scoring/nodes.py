"""Thin node of the ``experience_scoring`` pipeline; the work happens in creditflow.training."""

from __future__ import annotations

from typing import Any

import pandas as pd

from creditflow.chain.expmodel import data as expmodel_data
from creditflow.chain.expmodel import scoring as expmodel_scoring
from creditflow.chain.expmodel.scorer import ExpScorer


def score_items(  # noqa: PLR0913 - the scorer, what it reads, and the sessions to score for
    expmodel_scorer: ExpScorer,
    expmodel_processor,
    catalogue_items: pd.DataFrame,
    query_logs_train: pd.DataFrame,
    query_logs_heldout: pd.DataFrame,
    expmodel_params: dict[str, Any],
    params: dict[str, Any],
) -> pd.DataFrame:
    """The experience scores, from an item's cover and title alone: by
    ``expmodel_sft.score_mode`` (``expmodel_params``), in ``query`` mode s_{q,v}
    of every (query, candidate) of the training and held-out sessions (``query_text, item_id,
    s_exp``), in ``item`` mode ``item_id, s_exp`` for every catalogue item (the sessions are
    not read)."""
    visible = catalogue_items[list(expmodel_data.ITEM_FIELDS)]  # the scorer never sees true_*
    units = None
    if expmodel_data.check_score_mode(expmodel_params["score_mode"]) == expmodel_data.QUERY_MODE:
        units = expmodel_data.query_candidates(pd.concat([query_logs_train, query_logs_heldout]))
    return expmodel_scoring.score_items(
        expmodel_scorer, expmodel_processor, visible, batch_size=params["batch_size"], units=units
    )
