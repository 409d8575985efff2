"""Kedro run of the whole ``tapo`` pipeline at the smallest sizes, on MemoryDatasets."""

from pathlib import Path

import pandas as pd
import pytest
import torch
from kedro.config import OmegaConfigLoader
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure

from creditflow.datasets import CheckpointDirectoryDataset
from creditflow.ingest import load_mgsm
from creditflow.pipelines.comparison import configured_strategies
from creditflow.pipelines.tapo import create_pipeline
from tests.pipelines._params import TAPO_SMALLEST, deep_update, parameter_datasets

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

# The compared strategies, as the pipeline reads them from conf/base/parameters_tapo.yml.
STRATEGIES = tuple(configured_strategies("tapo"))


@pytest.fixture(scope="module")
def tapo_params(project_root: Path) -> dict:
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    return deep_update(loader["parameters"]["tapo"], TAPO_SMALLEST)


class KeptMemoryDataset(MemoryDataset):
    """A MemoryDataset the runner cannot release, so the test can read intermediate outputs."""

    def _release(self) -> None:
        pass


def _catalog(pipeline, params: dict, mgsm: pd.DataFrame, checkpoint_root: Path) -> DataCatalog:
    datasets = {**parameter_datasets("tapo", params), "mgsm_problems": MemoryDataset(mgsm)}
    for name in pipeline.all_outputs():
        # Models are kept by reference, as the style guide asks (no deep copies of nn.Modules).
        datasets[name] = KeptMemoryDataset(copy_mode="assign")
    datasets["tapo_sft_checkpoints"] = CheckpointDirectoryDataset(str(checkpoint_root / "sft"))
    for strategy in STRATEGIES:
        datasets[f"tapo_checkpoints_{strategy}"] = CheckpointDirectoryDataset(
            str(checkpoint_root / strategy)
        )
    return DataCatalog(datasets)


@pytest.mark.slow
def test_tapo_pipeline_runs_end_to_end_and_resumes(tapo_params, shared_data, tmp_path):
    torch.set_num_threads(1)
    mgsm = load_mgsm(shared_data / "mgsm", ["en", "de", "zh"], max_rows=2)
    pipeline = create_pipeline()
    catalog = _catalog(pipeline, tapo_params, mgsm, tmp_path / "ckpt")
    SequentialRunner().run(pipeline, catalog)

    table = catalog.load("tapo_comparison")
    assert table["policy"].tolist() == ["sft", *STRATEGIES]
    for column in (
        "accuracy_seen",
        "accuracy_unseen",
        "chrf_seen",
        "format_rate",
        "mgsm_accuracy",
        "train_sign_conflict_rate",
        "eval_reward_seen",
        "eval_reward_unseen",
        "sampled_accuracy_seen",
        "eval_reward_gain_seen",
        "eval_reward_gain_se_seen",
    ):
        assert column in table.columns
    assert (
        table[["accuracy_seen", "format_rate", "mgsm_accuracy", "sampled_accuracy_seen"]]
        .apply(lambda c: c.between(0, 1))
        .all()
        .all()
    )
    assert isinstance(catalog.load("tapo_reward_curves"), Figure)

    metrics = catalog.load("tapo_tapo_metrics")
    assert len(metrics) == 2
    for key in (
        "reward/total",
        "reward/translation",
        "reward/reasoning",
        "adv/sign_conflict_rate",
        "actor/clip_frac",
        "actor/kl",
        "actor/entropy",
        "completion/length",
        "time/rollout_s",
        "time/update_s",
    ):
        assert key in metrics.columns, key
    results = catalog.load("tapo_results_tapo")
    assert set(results["dataset"]) == {"synthetic", "mgsm"}
    assert set(results.loc[results["dataset"] == "synthetic", "language"]) == set(
        tapo_params["tasks"]["languages"]
    )
    # Each strategy trains its own copy: the shared warm start is never modified in place.
    sft_model = catalog.load("tapo_sft_policy")
    assert all(catalog.load(f"tapo_policy_{s}") is not sft_model for s in STRATEGIES)
    tapo = catalog.load("tapo_policy_tapo").state_dict()

    # Same inputs again: every GRPO node finds its finished checkpoint and does not retrain.
    checkpoints = sorted((tmp_path / "ckpt" / "tapo").glob("*/step-*"))
    assert [p.name for p in checkpoints] == ["step-000001", "step-000002"]
    rerun = _catalog(pipeline, tapo_params, mgsm, tmp_path / "ckpt")
    train_nodes = pipeline.only_nodes(
        "build_tapo_tasks",
        "train_tapo_tokenizer",
        "build_tapo_policy",
        "warm_start_tapo_policy",
        "tapo.train_tapo_policy",
    )
    SequentialRunner().run(train_nodes, rerun)
    again = rerun.load("tapo_tapo_metrics")
    pd.testing.assert_frame_equal(again, metrics)
    retrained = rerun.load("tapo_policy_tapo").state_dict()
    assert all(torch.equal(tapo[k], retrained[k]) for k in tapo)
