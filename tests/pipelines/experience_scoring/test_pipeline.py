"""Kedro slice test of the ``experience_scoring`` pipeline at the smallest sizes."""

import numpy as np
import pandas as pd
import pytest
from kedro.runner import SequentialRunner

from creditflow.chain.world.catalogue import HIDDEN_COLUMNS
from creditflow.pipelines.experience_scoring import create_pipeline
from tests.pipelines._experience_chain import (
    chain_catalog,
    deep_update,
    slice_catalog,
    smallest_params,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]


def test_every_item_gets_one_score_from_its_cover_and_title_alone():
    params = deep_update(smallest_params(), {"expmodel_sft": {"score_mode": "item"}})
    pipeline = create_pipeline()
    catalog = slice_catalog(pipeline, params)
    SequentialRunner().run(pipeline, catalog)
    items = catalog.load("catalogue_items")
    scores = catalog.load("item_experience_scores")
    assert list(scores.columns) == ["item_id", "s_exp"]
    assert scores["item_id"].tolist() == items["item_id"].tolist()
    assert np.isfinite(scores["s_exp"]).all() and scores["s_exp"].nunique() > 1

    # The hidden columns never reach the scorer.
    garbage = items.assign(**dict.fromkeys(HIDDEN_COLUMNS, -1.0), popularity=-1.0)
    again = slice_catalog(pipeline, params, catalogue_items=garbage)
    SequentialRunner().run(pipeline, again)
    pd.testing.assert_frame_equal(again.load("item_experience_scores"), scores)


def test_query_mode_scores_every_query_and_candidate_of_the_logs():
    params = smallest_params()
    assert params["expmodel_sft"]["score_mode"] == "query"  # the default
    pipeline = create_pipeline()
    catalog = slice_catalog(pipeline, params)
    SequentialRunner().run(pipeline, catalog)
    scores = catalog.load("item_experience_scores")
    assert list(scores.columns) == ["query_text", "item_id", "s_exp"]
    logs = pd.concat([catalog.load("query_logs_train"), catalog.load("query_logs_heldout")])
    pairs = {
        (q, c) for q, cs in zip(logs["query_text"], logs["candidates"], strict=True) for c in cs
    }
    assert set(zip(scores["query_text"], scores["item_id"], strict=True)) == pairs
    assert len(scores) == len(pairs)
    assert np.isfinite(scores["s_exp"]).all()
    # The query enters the prompt: one item's scores differ across its queries.
    assert (scores.groupby("item_id")["s_exp"].nunique() > 1).any()

    # The scorer read back from its directory scores as the chain's run did.
    saved = chain_catalog().load("item_experience_scores")
    np.testing.assert_allclose(saved["s_exp"], scores["s_exp"], rtol=1e-5, atol=1e-5)

    items = catalog.load("catalogue_items")
    garbage = items.assign(**dict.fromkeys(HIDDEN_COLUMNS, -1.0), popularity=-1.0)
    again = slice_catalog(pipeline, params, catalogue_items=garbage)
    SequentialRunner().run(pipeline, again)
    pd.testing.assert_frame_equal(again.load("item_experience_scores"), scores)


def test_an_unknown_score_mode_fails_naming_the_valid_ones():
    params = deep_update(smallest_params(), {"expmodel_sft": {"score_mode": "session"}})
    pipeline = create_pipeline()
    with pytest.raises(ValueError, match="unknown score_mode 'session'; valid: query, item"):
        SequentialRunner().run(pipeline, slice_catalog(pipeline, params))
