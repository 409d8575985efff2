"""Kedro slice test of the ``reranker_grpo`` pipeline: page-level GRPO, KL, resume."""

import numpy as np
import pytest
import torch
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure

from creditflow.chain.reranker.policy import parse_rankings
from creditflow.datasets import CheckpointDirectoryDataset
from creditflow.pipelines.reranker_grpo import create_pipeline
from tests.pipelines._experience_chain import deep_update, slice_catalog, smallest_params

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]


def _catalog(pipeline, params, root):
    catalog = slice_catalog(pipeline, params)
    catalog["reranker_grpo_checkpoints"] = CheckpointDirectoryDataset(str(root))
    return catalog


def test_page_grpo_trains_from_the_yaug_reranker_and_resumes(tmp_path, capfd):
    params = smallest_params()
    pipeline = create_pipeline()
    catalog = _catalog(pipeline, params, tmp_path)
    start = {k: v.clone() for k, v in catalog.load("reranker_yaug").state_dict().items()}
    SequentialRunner().run(pipeline, catalog)
    # Its progress bar says which loop it is (the engine's default label is "GRPO[...]").
    assert "page GRPO[" in capfd.readouterr().err

    metrics = catalog.load("reranker_grpo_metrics")
    assert metrics["step"].tolist() == [1, 2]
    # Every step's page reward is the alpha / beta mix of its parts, averaged; R_old is the
    # clicks + long views the click model fitted to the logs expects, over the best page's.
    reward = params["reranker_grpo"]["reward"]
    mix = reward["alpha"] * metrics["reward/r_old"] + reward["beta"] * metrics["reward/exp_ndcg"]
    torch.testing.assert_close(
        torch.tensor(metrics["reward/page"].to_numpy()), torch.tensor(mix.to_numpy())
    )
    assert metrics["reward/r_old"].between(0, 1).all()
    assert (metrics["reward/clicks"] > 0).all() and (metrics["reward/long_views"] >= 0).all()
    # k3 >= 0 up to float rounding; the policy starts at the reference, so the KL starts near 0.
    assert (metrics["actor/kl"] > -1e-6).all() and (metrics["actor/entropy"] > 0).all()
    trained = catalog.load("reranker_page_grpo").state_dict()
    assert [k for k in start if not torch.equal(trained[k], start[k])], "GRPO changed nothing"
    unchanged = catalog.load("reranker_yaug").state_dict()
    assert all(torch.equal(unchanged[k], v) for k, v in start.items()), "trained in place"
    samples = catalog.load("reranker_grpo_samples")
    L = len(catalog.load("query_logs_train")["candidates"].iloc[0])
    assert len(parse_rankings(list(samples["completion"]), L)) == len(samples) > 0
    assert isinstance(catalog.load("reranker_grpo_reward_curves"), Figure)
    fit = catalog.load("logged_click_model_fit")
    assert set(fit["split"]) == {"fit", "validation", "cross_validation"}
    assert (fit["click_loglik"] < 0).all()
    assert "configured" in set(fit["model"])

    # Page GRPO, its R_old-only control and each R_old variant share the store, one run each
    # (their rewards differ).
    runs = 2 + len(params["reranker_grpo"]["r_old_variants"])
    assert len(list(tmp_path.iterdir())) == runs
    assert [p.name for p in sorted(tmp_path.glob("*/step-*"))] == [
        "step-000001",
        "step-000002",
    ] * runs
    variants = catalog.load("reranker_page_grpo_r_old_variants")
    assert sorted(variants) == sorted(params["reranker_grpo"]["r_old_variants"])
    # Same inputs again: the node finds the finished checkpoint and does not retrain.
    again = _catalog(pipeline, params, tmp_path)
    rerun = pipeline.only_nodes("fit_click_model_on_logs", "train_reranker_page_grpo")
    SequentialRunner().run(rerun, again)
    assert again.load("reranker_grpo_metrics").equals(metrics)
    resumed = again.load("reranker_page_grpo").state_dict()
    assert all(torch.equal(resumed[k], v) for k, v in trained.items())


def test_page_grpo_rejects_derived_grpo_keys(tmp_path):
    params = deep_update(smallest_params(), {"reranker_grpo": {"grpo": {"max_new_tokens": 3}}})
    pipeline = create_pipeline().only_nodes("train_reranker_page_grpo")
    with pytest.raises(ValueError, match=r"must not set \['max_new_tokens'\]"):
        SequentialRunner().run(pipeline, _catalog(pipeline, params, tmp_path))


def test_the_r_old_only_control_trains_on_r_old_alone(tmp_path):
    params = smallest_params()
    pipeline = create_pipeline().only_nodes(
        "fit_click_model_on_logs", "train_reranker_page_grpo", "train_reranker_page_grpo_r_old_only"
    )
    catalog = _catalog(pipeline, params, tmp_path)
    SequentialRunner().run(pipeline, catalog)
    control = params["reranker_grpo"]["controls"]["r_old_only"]
    assert (control["alpha"], control["beta"]) == (1.0, 0.0)
    metrics = catalog.load("reranker_grpo_r_old_only_metrics")
    assert metrics["step"].tolist() == [1, 2]
    # The experience term is still measured but weighs 0: the page reward is R_old itself.
    torch.testing.assert_close(
        torch.tensor(metrics["reward/page"].to_numpy()),
        torch.tensor(metrics["reward/r_old"].to_numpy()),
    )
    assert not np.allclose(metrics["reward/page"], metrics["reward/exp_ndcg"])
    # The method, from the same start, mixes in the experience term: another run.
    method = catalog.load("reranker_grpo_metrics")
    beta = params["reranker_grpo"]["reward"]["beta"]
    assert beta > 0 and not np.allclose(method["reward/page"], method["reward/r_old"])
    trained = catalog.load("reranker_page_grpo_r_old_only").state_dict()
    start = catalog.load("reranker_yaug").state_dict()
    assert [k for k in start if not torch.equal(trained[k], start[k])], "GRPO changed nothing"
    method_weights = catalog.load("reranker_page_grpo").state_dict()
    assert not all(torch.equal(trained[k], method_weights[k]) for k in trained)
