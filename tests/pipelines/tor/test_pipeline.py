"""Kedro run of the whole ``tor`` pipeline at the smallest sizes, on MemoryDatasets."""

from pathlib import Path

import pandas as pd
import pytest
import torch
from kedro.config import OmegaConfigLoader
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure

from creditflow.datasets import CheckpointDirectoryDataset
from creditflow.ingest import load_mathvision, load_tabmwp
from creditflow.pipelines.comparison import configured_strategies
from creditflow.pipelines.tor import create_pipeline, nodes
from creditflow.pipelines.tor.nodes import choice_question
from creditflow.rollout import VisionLanguagePolicy
from creditflow.training.checkpoint import CheckpointStore
from tests.pipelines._params import SMALLEST_TINY_DECODER, deep_update, parameter_datasets

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

# The compared strategies with the ablations, as the pipeline reads them from
# conf/base/parameters_tor.yml and conf/tor_ablations/parameters_tor.yml.
ABLATIONS_ENV = "tor_ablations"
STRATEGIES = tuple(configured_strategies("tor", env=ABLATIONS_ENV))

SMALLEST = {
    "tasks": {"n_train": 6, "n_eval": 3},
    "tokenizer": {"vocab_size": 300},
    "policy": {"tiny": {**SMALLEST_TINY_DECODER, "vision_depth": 1}},
    "sft": {"steps": 2, "batch_size": 3, "warmup_steps": 1},
    "grpo": {
        "steps": 2,
        "prompts_per_step": 2,
        "group_size": 2,
        "max_new_tokens": 6,
        "checkpoint_every": 1,
        "log_samples_every": 1,
    },
    "evaluation": {
        "max_new_tokens": 4,
        "batch_size": 8,
        "tabmwp_max": 2,
        "mathvision_max": 2,
        "samples_per_problem": 2,
    },
}


@pytest.fixture(scope="module")
def tor_params(project_root: Path) -> dict:
    loader = OmegaConfigLoader(
        str(project_root / "conf"),
        base_env="base",
        default_run_env=ABLATIONS_ENV,
        merge_strategy={"parameters": "soft"},
    )
    return deep_update(loader["parameters"]["tor"], SMALLEST)


class KeptMemoryDataset(MemoryDataset):
    """A MemoryDataset the runner cannot release, so the test can read intermediate outputs."""

    def _release(self) -> None:
        pass


def _catalog(
    pipeline, params: dict, real: dict[str, pd.DataFrame], root: Path, source=None
) -> DataCatalog:
    """``source``: what ``hooks.task_source.TaskSourceHook`` puts under ``tor_source_problems`` in
    a session (None for ``synthetic``, else the catalog source's table)."""
    datasets = parameter_datasets("tor", params)
    datasets.update({name: MemoryDataset(frame) for name, frame in real.items()})
    datasets["tor_source_problems"] = MemoryDataset(source)
    for name in pipeline.all_outputs():
        datasets[name] = KeptMemoryDataset(copy_mode="assign")  # models by reference
    datasets["tor_sft_checkpoints"] = CheckpointDirectoryDataset(str(root / "sft"))
    for strategy in STRATEGIES:
        datasets[f"tor_checkpoints_{strategy}"] = CheckpointDirectoryDataset(str(root / strategy))
    return DataCatalog(datasets)


@pytest.mark.slow
def test_tor_pipeline_runs_end_to_end(tor_params, raw_data, tmp_path):
    torch.set_num_threads(1)
    real = {
        "tabmwp_problems": load_tabmwp(raw_data / "tabmwp_numeric300", max_rows=3),
        # The first rows of testmini are free-form; 12 rows include multiple choice ones.
        "mathvision_problems": load_mathvision(raw_data / "mathvision_testmini", max_rows=12)
        .sort_values("choices", key=lambda c: -c.map(len))
        .reset_index(drop=True),
    }
    pipeline = create_pipeline(STRATEGIES)
    assert pipeline.inputs() == {
        "params:tor",
        "tor_source_problems",
        "tabmwp_problems",
        "mathvision_problems",
    } | {f"tor_checkpoints_{s}" for s in STRATEGIES} | {
        f"params:tor.strategies.{s}" for s in STRATEGIES
    } | {"tor_sft_checkpoints"}
    catalog = _catalog(pipeline, tor_params, real, tmp_path / "ckpt")
    SequentialRunner().run(pipeline, catalog)

    table = catalog.load("tor_comparison")
    assert table["policy"].tolist() == ["sft", *STRATEGIES]
    assert table[["n_synthetic", "n_tabmwp", "n_mathvision"]].iloc[0].tolist() == [3, 2, 2]
    accuracy = table[
        [
            "accuracy_synthetic",
            "sampled_accuracy_synthetic",
            "accuracy_tabmwp",
            "accuracy_mathvision",
        ]
    ]
    assert accuracy.apply(lambda c: c.between(0, 1)).all().all()
    # Only the task source's rows are sampled; the real sets are scored greedily.
    assert "sampled_accuracy_tabmwp" not in table
    intervals = table.set_index("policy").loc[list(STRATEGIES)]
    for column in ("accuracy_gain_synthetic", "sampled_accuracy_gain_ci_low_synthetic"):
        assert intervals[column].notna().all(), column
    trained = table.set_index("policy").loc[list(STRATEGIES)]
    # Only the ToR runs select tokens; plain GRPO has no selection statistics.
    assert trained["reasoning_frac"].isna().tolist() == [True] + [False] * 4
    assert (trained.loc["tor", ["reasoning_frac", "perception_frac"]] >= 0.3).all()
    assert trained.loc["uniform", "step_overhead_vs_uniform"] == 0.0
    assert isinstance(catalog.load("tor_reward_curves"), Figure)
    # The credit inspector: ToR's rows carry its image log-prob difference and entropy and
    # weigh some tokens 0; uniform's weigh every token 1 and compute neither.
    tor_credit, uniform_credit = catalog.load("tor_credit_tor"), catalog.load("tor_credit_uniform")
    assert tor_credit["image_logp_diff"].notna().all() and tor_credit["entropy"].notna().all()
    assert set(tor_credit["weight"].unique()) <= {0.0, 0.5, 1.0, 1.5}
    assert (uniform_credit["weight"] == 1.0).all() and uniform_credit["entropy"].isna().all()
    assert set(tor_credit["segment"]) == {"other"}  # ToR's answers have no translation
    assert isinstance(catalog.load("tor_token_credit_plot"), Figure)

    metrics = catalog.load("tor_tor_metrics")
    assert len(metrics) == 2
    for key in (
        "reward/total",
        "reward/reasoning",
        "tor/reasoning_frac",
        "tor/perception_frac",
        "tor/overlap_frac",
        "tor/entropy_selected",
        "tor/sensitivity_unselected",
        "time/no_image_pass_s",
        "actor/entropy",
    ):
        assert key in metrics.columns, key
    assert "time/no_image_pass_s" not in catalog.load("tor_uniform_metrics").columns
    # The reasoning-only ablation gives T_p no weight but still reports its selection.
    assert (catalog.load("tor_tor_reasoning_only_metrics")["tor/perception_frac"] > 0).all()

    results = catalog.load("tor_results_tor")
    assert results.groupby("dataset").size().to_dict() == {
        "mathvision": 2,
        "synthetic": 3,
        "tabmwp": 2,
    }
    sampled = results.groupby("dataset")["sampled/reward/reasoning"].count().to_dict()
    assert sampled == {"mathvision": 0, "synthetic": 3, "tabmwp": 0}
    # The mean of 2 samples per problem: 0, 0.5 or 1.
    assert set(results["sampled/reward/reasoning"].dropna()) <= {0.0, 0.5, 1.0}
    mc = results[results["dataset"] == "mathvision"]
    # The MATH-Vision rows shown are multiple choice, with their options in the prompt.
    assert mc["prompt"].str.contains("Choices: A, B, C, D, E").all()
    assert set(mc["answer"]) <= set("ABCDE")
    # Each strategy trains its own copy from the same warm start.
    sft_model = catalog.load("tor_sft_policy")
    assert all(catalog.load(f"tor_policies_{s}")[0] is not sft_model for s in STRATEGIES)
    # train_vision_encoder: false: SFT and GRPO leave the ViT at its initial weights and
    # train the patch merger (and the language model).
    initial = dict(catalog.load("tor_initial_policy").named_parameters())
    for model in (sft_model, catalog.load("tor_policies_uniform")[0]):
        weights = dict(model.named_parameters())
        patch = "model.visual.patch_embed.proj.weight"
        merger = "model.visual.merger.mlp.0.weight"
        torch.testing.assert_close(weights[patch], initial[patch], rtol=0, atol=0)
        assert not torch.equal(weights[merger], initial[merger])
    checkpoints = sorted((tmp_path / "ckpt" / "tor").glob("*/step-*"))
    assert [p.name for p in checkpoints] == ["step-000001", "step-000002"]


@pytest.mark.slow
def test_tor_trains_on_tabmwp_as_its_source(tor_params, raw_data, tmp_path):
    """TabMWP as the source, split by problem id: the held-out TabMWP rows are the
    TabMWP evaluation (no trained-on row is evaluated), MATH-Vision is still evaluated, and
    the table has today's columns."""
    torch.set_num_threads(1)
    tasks = {"source": "tabmwp_problems", "heldout_fraction": 0.25, "max_eval_problems": 2}
    params = deep_update(tor_params, {"tasks": tasks})
    tabmwp = load_tabmwp(raw_data / "tabmwp_numeric300", max_rows=8)
    real = {
        "tabmwp_problems": tabmwp,
        "mathvision_problems": load_mathvision(raw_data / "mathvision_testmini", max_rows=2),
    }
    pipeline = create_pipeline(STRATEGIES)
    catalog = _catalog(pipeline, params, real, tmp_path / "ckpt", source=tabmwp)
    SequentialRunner().run(pipeline, catalog)

    train, held_out = catalog.load("tor_train_tasks"), catalog.load("tor_eval_tasks")
    assert len(train) == 6 and len(held_out) == 2
    assert not set(train["id"]) & set(held_out["id"])
    results = catalog.load("tor_results_tor")
    assert results.groupby("dataset").size().to_dict() == {"mathvision": 2, "tabmwp": 2}
    assert set(results.loc[results["dataset"] == "tabmwp", "id"]) == set(held_out["id"])
    table = catalog.load("tor_comparison")
    assert table["policy"].tolist() == ["sft", *STRATEGIES]
    assert table[["n_synthetic", "n_tabmwp", "n_mathvision"]].iloc[0].tolist() == [0, 2, 2]
    assert table[["accuracy_tabmwp", "accuracy_mathvision"]].notna().all().all()
    assert len(catalog.load("tor_tor_metrics")) == 2


def test_the_default_compares_uniform_and_tor_and_one_environment_adds_the_ablations():
    assert configured_strategies("tor") == ["uniform", "tor"]
    assert STRATEGIES == (
        "uniform",
        "tor",
        "tor_reasoning_only",
        "tor_perception_only",
        "tor_overlap_reasoning",
    )


def test_choice_question_lists_the_options_by_letter():
    assert choice_question("How many?\n<image1>", []) == "How many?"
    assert choice_question("Which?<image2>", ["A", "B"]) == (
        "Which?\nChoices: A, B. Answer with the letter of the correct choice."
    )
    assert choice_question("Pick", ["x", "y", "z"]) == (
        "Pick\nChoices: (A) x (B) y (C) z. Answer with the letter of the correct choice."
    )


def test_the_cache_budgets_reach_every_policy_the_nodes_build(tor_params, monkeypatch, tmp_path):
    """``tor.kept_mib`` in MiB becomes each VisionLanguagePolicy's byte budgets: in the SFT,
    the GRPO run and the evaluation; a budget left out keeps the policy's default."""
    assert nodes._cache_bytes({"kept_mib": {"prompts": 0, "vit_states": 2}}) == {
        "prompt_cache_bytes": 0,
        "vision_cache_bytes": 2 * 2**20,
    }
    assert nodes._cache_bytes({"kept_mib": {"prompts": 1}}) == {"prompt_cache_bytes": 2**20}
    assert nodes._cache_bytes({}) == {}
    built = []
    original = VisionLanguagePolicy.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append((self._encodings.max_bytes, self.vision_features.max_bytes))

    monkeypatch.setattr(VisionLanguagePolicy, "__init__", spy)
    params = deep_update(tor_params, {"kept_mib": {"prompts": 0, "vit_states": 3}})
    params = deep_update(params, {"evaluation": {"tabmwp_max": 0, "mathvision_max": 0}})
    train, held_out = nodes.build_tor_tasks(None, params)
    processor = nodes.train_tor_processor(train, params)
    model = nodes.build_tor_policy(processor, params)
    store = CheckpointStore(tmp_path / "ckpt")
    model, _ = nodes.warm_start_tor_policy(model, processor, train, store, params)
    model, *_ = nodes.train_tor_policy(model, processor, train, store, params, {"seed": 0})
    no_real = pd.DataFrame(columns=["id", "question", "answer", "choices", "image_path"])
    nodes.evaluate_tor_policy(model, processor, held_out, no_real, no_real, params)
    assert len(built) >= 3 and set(built) == {(0, 3 * 2**20)}
