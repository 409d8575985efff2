"""Kedro slice test of the ``reranker_pretrain`` pipeline at the smallest sizes."""

import math

import pytest
import torch
from kedro.runner import SequentialRunner

from creditflow.chain.config import FEATURE_NAMES
from creditflow.chain.reranker.model import PointerReranker
from creditflow.datasets import CheckpointDirectoryDataset
from creditflow.errors import ConfigError
from creditflow.pipelines.reranker_pretrain import create_pipeline
from creditflow.pipelines.reranker_pretrain.pipeline import RERANKERS, SHUFFLED
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


def _run(pipeline, params, root, **replace):
    catalog = slice_catalog(pipeline, params, **replace)
    catalog["reranker_pretrain_checkpoints"] = CheckpointDirectoryDataset(str(root))
    SequentialRunner().run(pipeline, catalog)
    return catalog


def test_every_reranker_pretrains_and_only_the_exp_ones_read_experience_scores(tmp_path):
    params = smallest_params()
    pipeline = create_pipeline()
    catalog = _run(pipeline, params, tmp_path / "first")
    # One run per reranker, the shuffled-s_exp control's too (its targets and features differ).
    assert len(list((tmp_path / "first").iterdir())) == 5
    for kind in RERANKERS:
        model = catalog.load(f"reranker_{kind}")
        assert isinstance(model, PointerReranker) and not model.training
        assert model.config.n_features == len(FEATURE_NAMES)
        metrics = catalog.load(f"reranker_pretrain_{kind}_metrics")
        assert metrics["step"].tolist() == [1, 2, 3]
        assert (metrics["reranker"] == kind).all()
        assert metrics["pretrain/nll"].map(math.isfinite).all()
    shuffled = catalog.load(f"reranker_{SHUFFLED}")
    assert isinstance(shuffled, PointerReranker) and not shuffled.training
    assert (catalog.load(f"reranker_pretrain_{SHUFFLED}_metrics")["reranker"] == SHUFFLED).all()
    yaug = catalog.load("reranker_yaug").state_dict()
    assert not all(torch.equal(yaug[k], v) for k, v in shuffled.state_dict().items())
    # The file-backed chain trained the same weights and reads them back from safetensors.
    saved = chain_catalog().load("reranker_yaug").state_dict()
    for name, value in catalog.load("reranker_yaug").state_dict().items():
        torch.testing.assert_close(saved[name], value)

    # Reversed scores change what the s_exp readers see (their score features; the targets
    # are the same tables) but not the rerankers without s_exp inputs, nor the control, which
    # reads the shuffled scores only.
    scores = catalog.load("item_experience_scores")
    reversed_scores = scores.assign(s_exp=-scores["s_exp"])
    other = _run(pipeline, params, tmp_path / "other", item_experience_scores=reversed_scores)
    for kind, same in (
        ("click", True),
        ("yaug_no_exp", True),
        ("yaug", False),
        ("click_exp", False),
        (SHUFFLED, True),
    ):
        before = catalog.load(f"reranker_{kind}").state_dict()
        after = other.load(f"reranker_{kind}").state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before) is same, kind


def test_an_old_lr_key_fails_before_anything_trains(tmp_path):
    params = deep_update(smallest_params(), {"reranker_pretrain": {"training": {"lr": 3e-3}}})
    with pytest.raises(ConfigError, match="`lr` is now `learning_rate`"):
        _run(create_pipeline(), params, tmp_path)
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []
