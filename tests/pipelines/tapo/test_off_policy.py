"""One-step off-policy GRPO (``grpo.max_staleness: 1``) through the ``tapo`` pipeline's own
node at the smallest sizes: the second process samples, the node trains, and its metrics say
which batches were drawn one update behind."""

# The tapo_params fixture is imported from the pipeline test and requested by name.
# ruff: noqa: F811

import pytest
import torch
from kedro.runner import SequentialRunner

from creditflow.pipelines.tapo import create_pipeline
from tests.pipelines.tapo.test_pipeline import _catalog, tapo_params  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")


@pytest.mark.slow
def test_max_staleness_1_trains_through_the_tapo_node(tapo_params, tmp_path):
    torch.set_num_threads(1)
    params = {
        **tapo_params,
        "grpo": {**tapo_params["grpo"], "max_staleness": 1, "steps": 3},
    }
    pipeline = create_pipeline().only_nodes(
        "build_tapo_tasks",
        "train_tapo_tokenizer",
        "build_tapo_policy",
        "warm_start_tapo_policy",
        "grpo_sum.train_tapo_policy",
    )
    catalog = _catalog(pipeline, params, None, tmp_path / "ckpt")
    SequentialRunner().run(pipeline, catalog)

    metrics = catalog.load("tapo_grpo_sum_metrics")
    # Step 1 samples the starting weights; steps 2 and 3 the weights one update behind.
    assert list(metrics["rollout/staleness"]) == [0.0, 1.0, 1.0]
    assert (metrics["time/rollout_wait_s"] >= 0).all()
    (state,) = (tmp_path / "ckpt" / "grpo_sum").glob("*/step-000003/trainer_state.pt")
    assert torch.load(state, weights_only=False)["config"]["max_staleness"] == 1
