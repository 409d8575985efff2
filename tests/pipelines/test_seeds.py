"""Seeds as an axis of the tapo and tor comparisons: each strategy's GRPO runs once
per seed from the one warm start, with its own checkpoints, and the comparison tables carry
one row per (strategy, seed) and the intervals over seeds."""

from pathlib import Path

import pandas as pd
import pytest
import torch
from kedro.config import OmegaConfigLoader
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from creditflow import tracking
from creditflow.datasets import CheckpointDirectoryDataset, HFModelsBySeedDataset
from creditflow.ingest import load_mathvision, load_mgsm, load_tabmwp
from creditflow.pipelines import tapo, tor
from creditflow.pipelines.comparison import evaluate_each_seed, seed_overrides, train_each_seed
from creditflow.reporting.stats import SEEDS_BASIS
from creditflow.training.checkpoint import CheckpointStore, run_store
from creditflow.training.grpo_runs import strategy_config
from tests.pipelines._params import TAPO_SMALLEST, deep_update, parameter_datasets
from tests.pipelines.tor.test_pipeline import SMALLEST as TOR_SMALLEST

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")


def _params(project_root: Path, group: str, smallest: dict, strategies: list[str]) -> dict:
    """The project's ``params:<group>`` at the smallest sizes, two seeds, ``strategies`` only."""
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    params = deep_update(loader["parameters"][group], smallest)
    params["strategies"] = {name: params["strategies"][name] for name in strategies}
    params["comparison"]["n_seeds"] = 2
    return params


class KeptMemoryDataset(MemoryDataset):
    """A MemoryDataset the runner cannot release, so the test can read intermediate outputs."""

    def _release(self) -> None:
        pass


def _catalog(group, pipeline, params, inputs: dict, root: Path, strategies) -> DataCatalog:
    datasets = {**parameter_datasets(group, params), **inputs}
    for name in pipeline.all_outputs():
        datasets[name] = KeptMemoryDataset(copy_mode="assign")  # models by reference
    datasets[f"{group}_sft_checkpoints"] = CheckpointDirectoryDataset(str(root / "sft"))
    for strategy in strategies:
        datasets[f"{group}_checkpoints_{strategy}"] = CheckpointDirectoryDataset(
            str(root / strategy)
        )
    return DataCatalog(datasets)


def _assert_two_seeds(catalog, group: str, strategies, root: Path, metric: str, split: str) -> None:
    per_seed = catalog.load(f"{group}_per_seed_comparison")
    assert per_seed["policy"].tolist() == ["sft"] + [s for s in strategies for _ in (0, 1)]
    assert per_seed["seed"].iloc[1:].tolist() == [0, 1] * len(strategies)
    table = catalog.load(f"{group}_comparison").set_index("policy")
    assert table.index.tolist() == ["sft", *strategies]
    trained = table.loc[list(strategies)]
    assert (trained["n_seeds"] == 2).all() and (trained["ci_basis"] == SEEDS_BASIS).all()
    for what in ("gain", "vs_baseline"):
        for stat in ("", "_se", "_ci_low", "_ci_high"):
            assert f"{metric}_{what}{stat}_{split}" in table.columns, (what, stat)
    gain = trained[[f"{metric}_gain_ci_low_{split}", f"{metric}_gain_{split}"]]
    gain = gain.join(trained[f"{metric}_gain_ci_high_{split}"])
    assert gain.notna().all().all()
    assert (gain.iloc[:, 0] <= gain.iloc[:, 1]).all() and (gain.iloc[:, 1] <= gain.iloc[:, 2]).all()
    # The baseline (the first strategy) is not compared with itself.
    assert trained[f"{metric}_vs_baseline_ci_low_{split}"].isna().tolist() == [True, False]
    for strategy in strategies:
        policies = catalog.load(f"{group}_policies_{strategy}")
        assert list(policies) == [0, 1] and policies[0] is not policies[1]
        metrics = catalog.load(f"{group}_{strategy}_metrics")
        assert metrics.groupby("seed")["step"].apply(list).to_dict() == {0: [1, 2], 1: [1, 2]}
        results = catalog.load(f"{group}_results_{strategy}")
        assert results["seed"].value_counts().to_dict() == {
            0: len(results) // 2,
            1: len(results) // 2,
        }
        # One checkpoint run per seed: the seed is part of each run's fingerprint.
        runs = sorted(p for p in (root / strategy).iterdir() if p.is_dir())
        assert len(runs) == 2, runs
        assert all(
            [c.name for c in sorted(r.glob("step-*"))] == ["step-000001", "step-000002"]
            for r in runs
        )


@pytest.mark.slow
def test_two_tapo_seeds_give_two_rows_per_strategy_and_intervals(project_root, raw_data, tmp_path):
    torch.set_num_threads(1)
    strategies = ["grpo_sum", "tapo"]  # the baseline first
    params = _params(project_root, "tapo", TAPO_SMALLEST, strategies)
    mgsm = load_mgsm(raw_data / "mgsm", ["en", "de"], max_rows=1)
    pipeline = tapo.create_pipeline(strategies)
    inputs = {"mgsm_problems": MemoryDataset(mgsm), "tapo_source_problems": MemoryDataset(None)}
    catalog = _catalog("tapo", pipeline, params, inputs, tmp_path / "ckpt", strategies)
    SequentialRunner().run(pipeline, catalog)
    _assert_two_seeds(catalog, "tapo", strategies, tmp_path / "ckpt", "eval_reward", "seen")
    assert "eval_reward_gain_ci_high_unseen" in catalog.load("tapo_comparison")


@pytest.mark.slow
def test_two_tor_seeds_give_two_rows_per_strategy_and_intervals(project_root, raw_data, tmp_path):
    torch.set_num_threads(1)
    strategies = ["uniform", "tor"]
    smallest = deep_update(TOR_SMALLEST, {"evaluation": {"tabmwp_max": 1, "mathvision_max": 1}})
    params = _params(project_root, "tor", smallest, strategies)
    inputs = {
        "tabmwp_problems": MemoryDataset(load_tabmwp(raw_data / "tabmwp_numeric300", max_rows=1)),
        "mathvision_problems": MemoryDataset(
            load_mathvision(raw_data / "mathvision_testmini", max_rows=1)
        ),
        "tor_source_problems": MemoryDataset(None),
    }
    pipeline = tor.create_pipeline(strategies)
    catalog = _catalog("tor", pipeline, params, inputs, tmp_path / "ckpt", strategies)
    SequentialRunner().run(pipeline, catalog)
    _assert_two_seeds(catalog, "tor", strategies, tmp_path / "ckpt", "accuracy", "synthetic")


def test_seeds_count_up_from_the_strategy_seed_and_one_seed_keeps_the_config():
    params = {"comparison": {"n_seeds": 3}, "grpo": {"seed": 5, "steps": 2}}
    assert [s for s, _ in seed_overrides(params, {})] == [5, 6, 7]
    assert [o["seed"] for _, o in seed_overrides(params, {"seed": 0})] == [0, 1, 2]
    one = {**params, "comparison": {"n_seeds": 1}}
    assert seed_overrides(one, {"beta": 0.0}) == [(5, {"beta": 0.0, "seed": 5})]


def test_each_seed_has_its_own_checkpoint_run(tmp_path):
    """The checkpoint store keys a run on its config, which holds the GRPO seed: two seeds of
    one strategy never resume each other's run."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    params = {
        "comparison": {"n_seeds": 2},
        "grpo": {"steps": 1, "rewards": {"reasoning": 1.0}},
        "reward_functions": ["reasoning"],
    }
    store = CheckpointStore(tmp_path)
    runs = []
    for _, overrides in seed_overrides(params, {}):
        config, _ = strategy_config(params, overrides)
        runs.append(run_store(store, model, config.to_dict(), ["prompt"]).directory)
    assert runs[0] != runs[1] and runs[0].parent == runs[1].parent == tmp_path


def test_train_and_evaluate_each_seed_label_every_row_with_its_seed():
    calls = []

    def train(params, overrides):
        calls.append(overrides["seed"])
        metrics = pd.DataFrame({"step": [1, 2], "reward/total": [0.0, overrides["seed"]]})
        credit = pd.DataFrame({"step": [1], "token": [str(overrides["seed"])]})
        return f"model-{overrides['seed']}", metrics, pd.DataFrame(), credit

    params = {"comparison": {"n_seeds": 2}, "grpo": {"seed": 3}}
    policies, metrics, samples, credit = train_each_seed(train, params, {})
    assert calls == [3, 4] and policies == {3: "model-3", 4: "model-4"}
    assert metrics.columns[0] == "seed" and metrics["seed"].tolist() == [3, 3, 4, 4]
    assert samples.empty
    assert credit.to_dict("list") == {"seed": [3, 4], "step": [1, 1], "token": ["3", "4"]}
    results = evaluate_each_seed(policies, lambda model: pd.DataFrame({"who": [model]}))
    assert results.to_dict("list") == {"seed": [3, 4], "who": ["model-3", "model-4"]}


@pytest.mark.parametrize("group", ["tapo", "tor"])
def test_the_catalog_keeps_every_seed_policy_and_the_per_seed_table(project_root, group):
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    catalog = DataCatalog.from_config(loader["catalog"])
    policies = catalog.get(f"{group}_policies_uniform")
    assert isinstance(policies, HFModelsBySeedDataset)
    assert str(policies._filepath).endswith(f"data/06_models/{group}_policies_uniform")
    assert type(catalog.get(f"{group}_per_seed_comparison")).__name__ == "AtomicCSVDataset"


def test_each_seed_logs_its_live_steps_under_its_own_prefix():
    """Two seeds of one node log steps 1..N each; MLflow keys them apart by a seed prefix."""
    prefixes = []

    def train(params, overrides):
        prefixes.append(tracking.active_step_logger().prefix)
        return None, pd.DataFrame({"step": [1]}), pd.DataFrame()

    node_logger = tracking.StepLogger(
        tracking_uri="sqlite:///unused.db", run_id="r", prefix="tapo_x"
    )
    params = {"comparison": {"n_seeds": 2}, "grpo": {"seed": 0}}
    with tracking.logging_steps(node_logger):
        train_each_seed(train, params, {})
        assert tracking.active_step_logger() is node_logger
        train_each_seed(train, {**params, "comparison": {"n_seeds": 1}}, {})
    assert prefixes == ["tapo_x/seed_0", "tapo_x/seed_1", "tapo_x"]
