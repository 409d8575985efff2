"""The ExpModel's train / unseen split through the Kedro nodes: no unseen item reaches SFT or
PFT, and the evaluation reports s_exp on the unseen items."""

import importlib

import pytest
from kedro.runner import SequentialRunner

from creditflow.chain.expmodel import data as expmodel_data
from creditflow.datasets import CheckpointDirectoryDataset
from creditflow.pipelines import expmodel_pft, expmodel_sft
from tests.pipelines._experience_chain import chain_catalog, slice_catalog, smallest_params

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]


def _recording(monkeypatch, name: str, seen: dict) -> None:
    """Replace ``creditflow.chain.expmodel.<stage>.<name>`` (``sft.train_expmodel_sft`` /
    ``pft.train_expmodel_pft``) by a wrapper that keeps its arguments, then trains."""
    stage = importlib.import_module(
        f"creditflow.chain.expmodel.{name.removeprefix('train_expmodel_')}"
    )
    original = getattr(stage, name)

    def wrapper(*args, **kwargs):
        seen[name] = args
        return original(*args, **kwargs)

    monkeypatch.setattr(stage, name, wrapper)


def test_no_unseen_item_reaches_sft_or_pft(tmp_path, monkeypatch):
    params = smallest_params()
    seen: dict = {}
    _recording(monkeypatch, "train_expmodel_sft", seen)
    _recording(monkeypatch, "train_expmodel_pft", seen)
    sft = expmodel_sft.create_pipeline()
    catalog = slice_catalog(sft, params)
    catalog["expmodel_sft_checkpoints"] = CheckpointDirectoryDataset(str(tmp_path / "sft"))
    SequentialRunner().run(sft, catalog)
    split = catalog.load("expmodel_item_split")
    pft = expmodel_pft.create_pipeline()
    pft_catalog = slice_catalog(
        pft,
        params,
        expmodel_item_split=split,
        expmodel_sft_model=catalog.load("expmodel_sft_model"),
        expmodel_processor=catalog.load("expmodel_processor"),
    )
    pft_catalog["expmodel_pft_checkpoints"] = CheckpointDirectoryDataset(str(tmp_path / "pft"))
    SequentialRunner().run(pft, pft_catalog)

    items = catalog.load("catalogue_items")
    fraction = params["expmodel_sft"]["item_split"]["unseen_fraction"]
    unseen = expmodel_data.split_ids(split, expmodel_data.UNSEEN)
    assert split["item_id"].tolist() == items["item_id"].tolist()
    assert len(unseen) == round(fraction * len(items)) > 0
    _, _, sft_items, _ = seen["train_expmodel_sft"]
    assert set(sft_items["item_id"]) == set(items["item_id"]) - unseen
    _, _, _, pft_pairs = seen["train_expmodel_pft"]
    assert len(pft_pairs) > 0
    assert not (set(pft_pairs["pos_item"]) | set(pft_pairs["neg_item"])) & unseen
    # The pairs table keeps the unseen items' pairs: the evaluation reads them.
    pairs = pft_catalog.load("expmodel_preference_pairs")
    assert len(pairs) > len(pft_pairs)


def test_evaluation_reports_every_target_on_unseen_items():
    upstream = chain_catalog()
    table = upstream.load("expmodel_evaluation")
    assert table["target"].tolist() == list(
        (
            "quality",
            "sharpness",
            "exposure",
            "noise",
            "title_informativeness",
            "relevance",
            "query_quality",
        )
    )
    split = upstream.load("expmodel_item_split")
    per_item = table[table["target"] != "query_quality"]
    # Query mode scores the items the logs hold (per (query, item)); every one is counted once.
    scored = set(upstream.load("item_experience_scores")["item_id"])
    unseen = set(split.loc[split["split"] == expmodel_data.UNSEEN, "item_id"])
    assert (per_item["unseen_items"] == len(unseen & scored)).all()
    # The query row counts (query, candidate) pairs of the logs, those of unseen items apart.
    query_row = table.set_index("target").loc["query_quality"]
    assert query_row["items"] > query_row["unseen_items"] > 0
    assert table["kendall_tau_unseen"].between(-1, 1).all()
    assert table["kendall_tau_in_sample"].between(-1, 1).all()
