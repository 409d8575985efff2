"""`kedro run --env smoke --pipelines NAME` on a fresh clone with no data: the comparison
pipelines run end to end on their synthetic worlds, the real-data evaluation rows skipped with
one line saying how to add them."""

import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.kedro_project import checkout_copy, kedro_cli

COMPARISONS = ["tapo", "tor", "grpo"]


@pytest.fixture(scope="module")
def fresh_clone(project_root: Path, tmp_path_factory) -> Path:
    project = checkout_copy(project_root, tmp_path_factory.mktemp("clone") / "creditflow")
    shutil.copytree(project_root / "conf/smoke", project / "conf/smoke")
    return project


@pytest.mark.parametrize("pipeline", COMPARISONS)
def test_a_fresh_clone_runs_each_comparison_in_the_smoke_environment(fresh_clone, pipeline):
    done = kedro_cli(fresh_clone, "run", "--env", "smoke", "--pipelines", pipeline)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    path = fresh_clone / f"data/08_reporting/{pipeline}_comparison.csv"
    if path.is_dir():  # a versioned dataset: its one version
        (path,) = path.glob(f"*/{pipeline}_comparison.csv")
    table = pd.read_csv(path)
    assert len(table) >= 2  # the warm start and the strategies
    if pipeline != "grpo":  # grpo reads no real data set
        assert "has no saved version: the evaluation skips its rows" in done.stdout + done.stderr


def test_a_fresh_clone_runs_the_experience_chain_in_the_smoke_environment(fresh_clone):
    # A bare `kedro run` is the chain, from the synthetic catalogue to the A/B table.
    done = kedro_cli(fresh_clone, "run", "--env", "smoke")
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    (table,) = (fresh_clone / "data/08_reporting/reranker_evaluation.csv").glob("*/*.csv")
    assert len(pd.read_csv(table)) >= 2


def test_a_fresh_clone_runs_the_credit_gym_at_the_smoke_budget_with_a_plugin_from_conf_local(
    fresh_clone,
):
    """The smoke environment's gym budget, written to conf/local with a strategy of one's own
    (a module in the project's src/, named by import path) added to the sweep: the run scores
    it at every dose beside the shipped strategies, and draws its curve."""
    smoke = yaml.safe_load((fresh_clone / "conf/smoke/parameters.yml").read_text())
    gym = smoke["credit_gym"]
    gym["grpo"]["steps"] = 4
    gym["strategies"] = {"mine": {"token_weights": {"name": "my_gym_plugin:second_half"}}}
    (fresh_clone / "conf/local/parameters_credit_gym.yml").write_text(
        yaml.safe_dump({"credit_gym": gym})
    )
    shutil.copy(
        Path(__file__).parent / "credit_gym/plugin_weights.py", fresh_clone / "src/my_gym_plugin.py"
    )
    try:
        done = kedro_cli(fresh_clone, "run", "--pipelines", "credit_gym")
    finally:
        (fresh_clone / "conf/local/parameters_credit_gym.yml").unlink()
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    (curves,) = (fresh_clone / "data/08_reporting/credit_gym_dose_response.csv").glob("*/*.csv")
    table = pd.read_csv(curves)
    # every knob swept at its two smoke doses, every strategy scored, the plugin at each dose
    assert table.groupby("knob")["dose"].nunique().to_dict() == {
        knob: 2 for knob in ("conflict", "decisive_fraction", "fork_entropy", "noise", "perception")
    }
    assert {"oracle", "grpo", "shuffled_advantages", "mine"} <= set(table["strategy"])
    mine = table[(table["strategy"] == "mine") & (table["metric"] == "final_reward")]
    assert len(mine) == 10 and mine["mean"].notna().all()
    assert list((fresh_clone / "data/08_reporting/credit_gym_dose_response.png").glob("*/*.png"))
