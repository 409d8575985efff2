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
from creditflow.ingest import load_gsm8k, load_mgsm
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


def _catalog(
    pipeline, params: dict, mgsm: pd.DataFrame, checkpoint_root: Path, source=None
) -> DataCatalog:
    """``source``: what ``hooks.task_source.TaskSourceHook`` puts under ``tapo_source_problems``
    in a session (None for ``synthetic``, else the catalog source's table)."""
    datasets = {
        **parameter_datasets("tapo", params),
        "mgsm_problems": MemoryDataset(mgsm),
        "tapo_source_problems": MemoryDataset(source),
    }
    for name in pipeline.all_outputs():
        # Models are kept by reference, as the style guide asks (no deep copies of nn.Modules).
        datasets[name] = KeptMemoryDataset(copy_mode="assign")
    datasets["tapo_sft_checkpoints"] = CheckpointDirectoryDataset(str(checkpoint_root / "sft"))
    for strategy in STRATEGIES:
        datasets[f"tapo_checkpoints_{strategy}"] = CheckpointDirectoryDataset(
            str(checkpoint_root / strategy)
        )
    return DataCatalog(datasets)


def test_the_conflict_variant_reaches_the_synthetic_tasks(tapo_params):
    params = deep_update(tapo_params, {"tasks": {"variant": "conflict"}})
    tasks = ("tapo_train_tasks", "tapo_eval_tasks")
    catalog = DataCatalog(
        {
            **parameter_datasets("tapo", params),
            "tapo_source_problems": MemoryDataset(None),
            **{name: KeptMemoryDataset() for name in tasks},
        }
    )
    SequentialRunner().run(create_pipeline().only_nodes("build_tapo_tasks"), catalog)
    for name in tasks:
        # One distractor per problem, in the English reference the translation reward reads.
        assert catalog.load(name)["question_en"].str.count("'s neighbor buys ").eq(1).all(), name


@pytest.mark.slow
def test_tapo_pipeline_runs_end_to_end_and_resumes(tapo_params, raw_data, tmp_path):
    torch.set_num_threads(1)
    mgsm = load_mgsm(raw_data / "mgsm", ["en", "de", "zh"], max_rows=2)
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
    # The credit inspector records steps 1 and 2 (first, middle and last of 2) of every
    # strategy, the same first completions under each at step 1, and renders them.
    credit = {s: catalog.load(f"tapo_credit_{s}") for s in STRATEGIES}
    assert all(sorted(table["step"].unique()) == [1, 2] for table in credit.values())
    first = [tuple(t.loc[t["step"] == 1, "token_id"]) for t in credit.values()]
    assert len(set(first)) == 1
    assert "Token credit by strategy" in catalog.load("tapo_token_credit_html")
    assert isinstance(catalog.load("tapo_token_credit_plot"), Figure)

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
    assert all(catalog.load(f"tapo_policies_{s}")[0] is not sft_model for s in STRATEGIES)
    tapo = catalog.load("tapo_policies_tapo")[0].state_dict()

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
    pd.testing.assert_frame_equal(rerun.load("tapo_credit_tapo"), credit["tapo"])
    retrained = rerun.load("tapo_policies_tapo")[0].state_dict()
    assert all(torch.equal(tapo[k], retrained[k]) for k in tapo)


# A catalog source at the smallest sizes, without the SFT warm start.
CATALOG_SOURCE = {"sft": {"steps": 0}, "tasks": {"heldout_fraction": 0.25, "max_eval_problems": 2}}


@pytest.mark.slow
def test_tapo_trains_on_a_catalog_source_without_sft(tapo_params, raw_data, tmp_path):
    """GSM8K train as the source (English only), ``sft.steps: 0``: training rows and held-out
    rows are disjoint problem ids, the held-out rows are the evaluation (sampled as the
    synthetic ones are), MGSM is still evaluated, and the table has today's columns."""
    torch.set_num_threads(1)
    params = deep_update(
        tapo_params,
        {**CATALOG_SOURCE, "tasks": {**CATALOG_SOURCE["tasks"], "source": "gsm8k_train_problems"}},
    )
    gsm8k = load_gsm8k(raw_data / "gsm8k", "train", max_rows=8)
    mgsm = load_mgsm(raw_data / "mgsm", ["en", "de"], max_rows=1)
    pipeline = create_pipeline()
    catalog = _catalog(pipeline, params, mgsm, tmp_path / "ckpt", source=gsm8k)
    SequentialRunner().run(pipeline, catalog)

    train, held_out = catalog.load("tapo_train_tasks"), catalog.load("tapo_eval_tasks")
    assert len(train) == 6 and len(held_out) == 2  # 8 ids, 25 % held out
    assert not set(train["id"]) & set(held_out["id"])
    assert (train["reasoning_en"] == "").all()  # no reasoning column: the answer format alone
    # sft.steps 0: the warm start is the initial policy's weights.
    initial, warm = catalog.load("tapo_initial_policy"), catalog.load("tapo_sft_policy")
    assert all(torch.equal(v, warm.state_dict()[k]) for k, v in initial.state_dict().items())
    assert len(catalog.load("tapo_sft_metrics")) == 0

    results = catalog.load("tapo_results_tapo")
    assert results.groupby("dataset").size().to_dict() == {"gsm8k_train_problems": 2, "mgsm": 2}
    sampled = results["sampled/reward/reasoning"].notna()
    assert sampled.tolist() == (results["dataset"] == "gsm8k_train_problems").tolist()
    table = catalog.load("tapo_comparison")
    assert table["policy"].tolist() == ["sft", *STRATEGIES]
    assert "language" not in table.columns  # one language: one row per policy
    for column in (
        "accuracy_seen",
        "chrf_seen",
        "format_rate",
        "mgsm_accuracy",
        "eval_reward_seen",
    ):
        assert table[column].notna().all(), column
    assert table["accuracy_unseen"].isna().all()  # every language of a catalog source is seen
    assert len(catalog.load("tapo_tapo_metrics")) == 2


@pytest.mark.slow
def test_mgsm_as_the_source_is_its_own_evaluation_with_rows_per_language(
    tapo_params, raw_data, tmp_path
):
    """MGSM split by problem id: a held-out id is evaluated in every language and is the
    MGSM evaluation (no MGSM row that was trained on is evaluated); the table adds one row
    per (policy, language)."""
    torch.set_num_threads(1)
    params = deep_update(
        tapo_params,
        {**CATALOG_SOURCE, "tasks": {**CATALOG_SOURCE["tasks"], "source": "mgsm_problems"}},
    )
    mgsm = load_mgsm(raw_data / "mgsm", ["en", "de", "zh"], max_rows=4)
    pipeline = create_pipeline()
    catalog = _catalog(pipeline, params, mgsm, tmp_path / "ckpt", source=mgsm)
    SequentialRunner().run(pipeline, catalog)

    train_ids = set(catalog.load("tapo_train_tasks")["id"])
    results = catalog.load("tapo_results_sft")
    assert set(results["dataset"]) == {"mgsm"}
    assert len(results) == 3  # one held-out id (of 4) in 3 languages
    assert not set(results["id"]) & train_ids
    table = catalog.load("tapo_comparison")
    assert table.columns[:2].tolist() == ["policy", "language"]
    assert table.loc[table["policy"] == "sft", "language"].tolist() == ["all", "de", "en", "zh"]
    assert len(table) == 4 * (1 + len(STRATEGIES))
    overall = table[table["language"] == "all"].set_index("policy")
    # The held-out MGSM rows are both the task rows (seen) and the MGSM evaluation.
    assert (overall["mgsm_accuracy"] == overall["accuracy_seen"]).all()
    per_language = table[table["language"] != "all"]
    assert per_language["train_sign_conflict_rate"].isna().all()
    assert overall.loc[list(STRATEGIES), "train_sign_conflict_rate"].notna().all()


# Two FSDP2 processes (gloo on CPU) for every GRPO node; hf generation (lean reads whole
# parameters). docs/scale_out.md.
FSDP_DISTRIBUTED = {"num_processes": 2, "accelerate": {"fsdp": {"fsdp_version": 2}}}


@pytest.mark.slow
def test_a_grpo_node_trains_sharded_and_hands_on_a_whole_model(tapo_params, raw_data, tmp_path):
    """``tapo.grpo.distributed`` with FSDP through the ``tapo`` strategy's nodes: the trained
    policy the evaluation node reads is a plain model, and its checkpoints hold whole weights
    that a second run finds and does not retrain."""
    torch.set_num_threads(1)
    params = deep_update(tapo_params, {"grpo": {"rollout": {"name": "hf"}}})
    params["grpo"]["distributed"] = FSDP_DISTRIBUTED  # over the YAML's accelerate: null
    mgsm = load_mgsm(raw_data / "mgsm", ["en"], max_rows=1)
    pipeline = create_pipeline().to_outputs("tapo_results_tapo")
    catalog = _catalog(pipeline, params, mgsm, tmp_path / "ckpt")
    SequentialRunner().run(pipeline, catalog)

    (trained,) = catalog.load("tapo_policies_tapo").values()
    assert not any(type(p).__name__ == "DTensor" for p in trained.parameters())
    assert type(trained) is type(catalog.load("tapo_sft_policy"))
    assert len(catalog.load("tapo_results_tapo")) > 0
    (run,) = (tmp_path / "ckpt" / "tapo").glob("*/")
    assert [p.parent.name for p in sorted(run.glob("step-*/model.safetensors"))] == [
        "step-000001",
        "step-000002",
    ]
    written = {p: p.stat().st_mtime_ns for p in run.glob("step-*/COMPLETE")}
    rerun = _catalog(pipeline, params, mgsm, tmp_path / "ckpt")
    SequentialRunner().run(pipeline.to_outputs("tapo_policies_tapo"), rerun)
    assert {p: p.stat().st_mtime_ns for p in run.glob("step-*/COMPLETE")} == written
    (again,) = rerun.load("tapo_policies_tapo").values()
    retrained = again.state_dict()
    assert all(torch.equal(v, retrained[k]) for k, v in trained.state_dict().items())
