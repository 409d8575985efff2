"""Thin node of the ``experience_scoring`` pipeline; the work happens in creditflow.training."""

from __future__ import annotations

from typing import Any

import pandas as pd

from creditflow.models.scorer import ExpScorer
from creditflow.training import expmodel


def score_items(
    expmodel_scorer: ExpScorer,
    expmodel_processor,
    catalogue_items: pd.DataFrame,
    params: dict[str, Any],
) -> pd.DataFrame:
    """``item_id, s_exp`` for every catalogue item, from its cover and title alone."""
    visible = catalogue_items[list(expmodel.ITEM_FIELDS)]  # the scorer never sees true_*
    return expmodel.score_items(
        expmodel_scorer, expmodel_processor, visible, batch_size=params["batch_size"]
    )
