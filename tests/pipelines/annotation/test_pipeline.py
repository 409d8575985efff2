"""Kedro slice test of the ``annotation`` pipeline at the smallest sizes."""

import pandas as pd
import pytest
from kedro.runner import SequentialRunner

from creditflow.chain.annotation import ANNOTATION_COLUMNS
from creditflow.chain.world.catalogue import HIDDEN_COLUMNS, SESSION_COLUMNS
from creditflow.pipelines.annotation import create_pipeline
from tests.pipelines._experience_chain import (
    as_lists,
    chain_catalog,
    deep_update,
    slice_catalog,
    smallest_params,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]


def test_annotation_pipeline_splits_logs_and_annotates_every_item():
    params = smallest_params()
    pipeline = create_pipeline()
    catalog = slice_catalog(pipeline, params)
    SequentialRunner().run(pipeline, catalog)

    items = catalog.load("catalogue_items")
    train, heldout = catalog.load("query_logs_train"), catalog.load("query_logs_heldout")
    annotations = catalog.load("item_annotations")
    assert len(items) == 40 and set(HIDDEN_COLUMNS) <= set(items.columns)
    # 80 sessions, round(0.25 * 80) = 20 held out; the two parts partition the session ids.
    assert (len(train), len(heldout)) == (60, 20)
    assert sorted([*train["session_id"], *heldout["session_id"]]) == list(range(80))
    assert train["session_id"].is_monotonic_increasing
    assert list(train.columns) == list(SESSION_COLUMNS)
    assert all(len(c) == 6 for c in [*train["candidates"], *heldout["candidates"]])
    assert tuple(annotations.columns) == ANNOTATION_COLUMNS
    assert annotations["item_id"].tolist() == items["item_id"].tolist()
    assert (annotations["status"] == "ok").all()

    # Same seeds, same tables: the file-backed chain wrote them to Parquet and read them back,
    # list columns and PNG bytes included.
    upstream = chain_catalog()
    for name, frame in (("query_logs_train", train), ("query_logs_heldout", heldout)):
        pd.testing.assert_frame_equal(as_lists(upstream.load(name)), frame)
    pd.testing.assert_frame_equal(upstream.load("catalogue_items"), items)


def test_annotate_items_rejects_an_unknown_annotator():
    params = deep_update(smallest_params(), {"annotation": {"annotator": {"name": "gpt"}}})
    pipeline = create_pipeline().only_nodes("annotate_items")
    with pytest.raises(ValueError, match="unknown annotator 'gpt'; valid: .*heuristic"):
        SequentialRunner().run(pipeline, slice_catalog(pipeline, params))
