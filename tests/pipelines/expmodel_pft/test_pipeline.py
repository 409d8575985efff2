"""Kedro slice test of the ``expmodel_pft`` pipeline at the smallest sizes."""

import math

import pytest
import torch
from kedro.runner import SequentialRunner

from creditflow.chain.expmodel.scorer import ExpScorer
from creditflow.datasets import CheckpointDirectoryDataset
from creditflow.errors import ConfigError
from creditflow.pipelines.expmodel_pft import create_pipeline
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


@pytest.mark.parametrize("score_mode", ["query", "item"])
def test_expmodel_pft_pairs_come_from_long_tail_sessions_and_the_scorer_trains(
    tmp_path, score_mode
):
    params = smallest_params()
    pipeline = create_pipeline()
    # The chain ran in the default query mode; item mode learns from the item annotations.
    item_annotations = chain_catalog().load("item_annotations")
    replace = {"expmodel_annotations": item_annotations} if score_mode == "item" else {}
    catalog = slice_catalog(pipeline, params, **replace)
    catalog["expmodel_pft_checkpoints"] = CheckpointDirectoryDataset(str(tmp_path))
    sft_before = {k: v.clone() for k, v in catalog.load("expmodel_sft_model").state_dict().items()}
    SequentialRunner().run(pipeline, catalog)

    pairs = catalog.load("expmodel_preference_pairs")
    sessions = catalog.load("query_logs_train").set_index("session_id")
    annotations = catalog.load("expmodel_annotations")
    assert 0 < len(pairs) <= params["expmodel_pft"]["pairs"]["max_pairs"]
    if score_mode == "query":
        # A > B for the session's query: each item's annotation for that query.
        overall = annotations.set_index(["query_text", "item_id"])["overall"]
        assert list(pairs.columns) == ["query_text", "pos_item", "neg_item", "session_id"]
    else:
        overall = item_annotations.set_index("item_id")["overall"]
        assert list(pairs.columns) == ["pos_item", "neg_item", "session_id"]
    for pair in pairs.to_dict("records"):
        session = sessions.loc[pair["session_id"]]
        assert session["query_frequency_band"] == "tail"
        assert {pair["pos_item"], pair["neg_item"]} <= set(session["candidates"])
        if score_mode == "query":
            assert pair["query_text"] == session["query_text"]
            pos, neg = (overall[session["query_text"], pair[s]] for s in ("pos_item", "neg_item"))
        else:
            pos, neg = overall[pair["pos_item"]], overall[pair["neg_item"]]
        assert pos - neg >= 1.0 - 1e-9

    metrics = catalog.load("expmodel_pft_metrics")
    assert metrics["step"].tolist() == [1, 2]
    assert metrics["pft/loss"].map(math.isfinite).all()
    heldout = metrics["pft/heldout_accuracy"]
    # Measured once, after training: NaN on the earlier steps (MLflow skips NaN cells).
    assert heldout.iloc[:-1].isna().all() and 0.0 <= heldout.iloc[-1] <= 1.0

    scorer = catalog.load("expmodel_scorer")
    assert isinstance(scorer, ExpScorer)
    assert scorer.head.weight.abs().sum() > 0, "the head starts at 0 and must have trained"
    # from_generator shares the backbone: the node must copy the SFT model first.
    sft_after = catalog.load("expmodel_sft_model").state_dict()
    assert all(torch.equal(sft_after[k], v) for k, v in sft_before.items())
    # The file-backed chain saved the scorer as a directory ExpScorer.from_pretrained reads.
    saved = chain_catalog().load("expmodel_scorer")
    assert isinstance(saved, ExpScorer) and not saved.training


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"training": {"lr": 0.1}}, "`lr` is now `learning_rate`"),
        ({"training": {"batch_size": "abc"}}, "`batch_size` must be int"),
        ({"pft": {"steps": 2}}, r"unknown PFT option\(s\) \['steps'\]"),
    ],
)
def test_train_expmodel_pft_rejects_a_broken_config(tmp_path, overrides, message):
    params = deep_update(smallest_params(), {"expmodel_pft": overrides})
    pipeline = create_pipeline().only_nodes("train_expmodel_pft")
    catalog = slice_catalog(pipeline, params)
    catalog["expmodel_pft_checkpoints"] = CheckpointDirectoryDataset(str(tmp_path))
    with pytest.raises(ConfigError, match=message):
        SequentialRunner().run(pipeline, catalog)
    assert list(tmp_path.iterdir()) == []  # it failed before anything trained
