"""Loss types through the ``tapo`` pipeline at the smallest sizes: a strategy with
``loss_type: dapo`` and DAPO's dynamic sampling, overlong punishment and truncation masking,
and one with ``loss_type: gspo``, each trained by its Kedro node."""

# The tapo_params fixture is imported from the pipeline test and requested by name.
# ruff: noqa: F811

import pytest
import torch
from kedro.runner import SequentialRunner

from creditflow.pipelines.tapo import create_pipeline
from tests.pipelines.tapo.test_pipeline import _catalog, tapo_params  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

TAPO_ADVANTAGE = {"name": "tapo", "alpha": 0.5}
STRATEGIES = {
    # TAPO's advantages (a continuous translation reward beside the reasoning one) with DAPO:
    # dynamic sampling filters on the reasoning reward alone.
    "tapo": {
        "advantage": TAPO_ADVANTAGE,
        "loss_type": "dapo",
        "dynamic_sampling": {"max_extra_rollouts": 4},
        "overlong": {"buffer": 4},
        "mask_truncated_completions": True,
    },
    "grpo_sum": {"advantage": TAPO_ADVANTAGE, "loss_type": "gspo"},
}


def _trained_config(root, strategy: str) -> dict:
    (state,) = (root / strategy).glob("*/step-000002/trainer_state.pt")
    return torch.load(state, weights_only=False)["config"]


@pytest.mark.slow
def test_dapo_with_dynamic_sampling_and_gspo_train_through_the_tapo_pipeline(tapo_params, tmp_path):
    torch.set_num_threads(1)
    params = {**tapo_params, "strategies": {**tapo_params["strategies"], **STRATEGIES}}
    pipeline = create_pipeline().only_nodes(
        "build_tapo_tasks",
        "train_tapo_tokenizer",
        "build_tapo_policy",
        "warm_start_tapo_policy",
        "tapo.train_tapo_policy",
        "grpo_sum.train_tapo_policy",
    )
    catalog = _catalog(pipeline, params, None, tmp_path / "ckpt")
    SequentialRunner().run(pipeline, catalog)

    dapo = catalog.load("tapo_tapo_metrics")
    assert len(dapo) == 2
    groups = params["grpo"]["prompts_per_step"]
    for _, row in dapo.iterrows():
        assert 0 <= row["dynamic_sampling/extra_rollouts"] <= 4
        assert row["dynamic_sampling/filled_groups"] <= groups
        assert row["dynamic_sampling/dropped_groups"] >= row["dynamic_sampling/filled_groups"]
        assert -1 <= row["reward/overlong"] <= 0
        assert 0 <= row["completion/truncated_frac"] <= 1
    config = _trained_config(tmp_path / "ckpt", "tapo")
    assert (config["agg"], config["clip_high"], config["advantage"]["name"]) == (
        "token-mean",
        0.28,
        "tapo",
    )

    gspo = catalog.load("tapo_grpo_sum_metrics")
    assert len(gspo) == 2 and "dynamic_sampling/draws" not in gspo.columns
    config = _trained_config(tmp_path / "ckpt", "grpo_sum")
    assert (config["importance_level"], config["clip_low"], config["clip_high"]) == (
        "sequence",
        3e-4,
        4e-4,
    )
    assert config["agg"] == "seq-mean-token-mean"
