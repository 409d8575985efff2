"""Kedro slice test of the ``experience_scoring`` pipeline at the smallest sizes."""

import numpy as np
import pandas as pd
import pytest
from kedro.runner import SequentialRunner

from creditflow.pipelines.experience_scoring import create_pipeline
from creditflow.tasks.reranking import HIDDEN_COLUMNS
from tests.pipelines._experience_chain import chain_catalog, slice_catalog, smallest_params

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]


def test_every_item_gets_one_score_from_its_cover_and_title_alone():
    params = smallest_params()
    pipeline = create_pipeline()
    catalog = slice_catalog(pipeline, params)
    SequentialRunner().run(pipeline, catalog)
    items = catalog.load("catalogue_items")
    scores = catalog.load("item_experience_scores")
    assert list(scores.columns) == ["item_id", "s_exp"]
    assert scores["item_id"].tolist() == items["item_id"].tolist()
    assert np.isfinite(scores["s_exp"]).all() and scores["s_exp"].nunique() > 1

    # The scorer read back from its directory scores as the chain's run did.
    saved = chain_catalog().load("item_experience_scores")
    np.testing.assert_allclose(saved["s_exp"], scores["s_exp"], rtol=1e-5, atol=1e-5)

    # The hidden columns never reach the scorer.
    garbage = items.assign(**dict.fromkeys(HIDDEN_COLUMNS, -1.0), popularity=-1.0)
    again = slice_catalog(pipeline, params, catalogue_items=garbage)
    SequentialRunner().run(pipeline, again)
    pd.testing.assert_frame_equal(again.load("item_experience_scores"), scores)
