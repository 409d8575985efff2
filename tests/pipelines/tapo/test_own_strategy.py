"""docs/extending.md, as documented: a strategy and a reward in files outside the repository
(the page's own code blocks, written to a temporary folder on PYTHONPATH), added to the tapo
comparison by a conf/local file alone, run with ``kedro run --pipelines tapo``; and broken
import paths failing before the first node, naming the key."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from creditflow.errors import ConfigError
from creditflow.testing import check_advantage_strategy, check_reward, check_token_weight_strategy
from tests.kedro_project import NodeCounter, checkout_copy, kedro_cli, save_mgsm_problems
from tests.pipelines._params import TAPO_SMALLEST

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

LOCAL_PARAMETERS = "conf/local/parameters_tapo.yml"


def documented_files(project_root: Path) -> dict[str, str]:
    """The code blocks of docs/extending.md whose first line names their file
    (``# my_credit/strategies.py``), by that name."""
    page = (project_root / "docs/extending.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```(?:python|yaml)\n# (\S+)\n(.*?)```", page, flags=re.DOTALL)
    return {name: body for name, body in blocks}


def _flat(prefix: str, tree: dict) -> list[str]:
    """``--params`` items of a nested dict (``tapo.grpo.steps=2``)."""
    items = []
    for key, value in tree.items():
        if isinstance(value, dict):
            items += _flat(f"{prefix}.{key}", value)
        else:
            items.append(f"{prefix}.{key}={value}")
    return items


# The tiny budget on the command line, as the page's run had it.
TINY_BUDGET = ",".join([*_flat("tapo", TAPO_SMALLEST), "tapo.torch_threads=1"])


@pytest.fixture
def plugins(project_root: Path, tmp_path: Path) -> Iterator[Path]:
    """The page's ``my_credit`` package in a folder outside the repository."""
    folder = tmp_path / "outside"
    (folder / "my_credit").mkdir(parents=True)
    (folder / "my_credit/__init__.py").write_text("", encoding="utf-8")
    files = documented_files(project_root)
    for name in ("my_credit/strategies.py", "my_credit/rewards.py", "my_credit/advantages.py"):
        (folder / name).write_text(files[name], encoding="utf-8")
    yield folder
    for module in [m for m in sys.modules if m.split(".")[0] == "my_credit"]:
        del sys.modules[module]  # the next test's folder is another


@pytest.fixture
def project(project_root: Path, tmp_path: Path) -> Path:
    """A copy of the project with the page's conf/local file and the MGSM table it evaluates."""
    project = checkout_copy(project_root, tmp_path / "project")
    local = documented_files(project_root)[LOCAL_PARAMETERS]
    (project / LOCAL_PARAMETERS).write_text(local, encoding="utf-8")
    save_mgsm_problems(project)
    return project


def test_the_documented_strategy_and_reward_keep_the_contract(plugins, monkeypatch):
    monkeypatch.syspath_prepend(str(plugins))
    from my_credit.rewards import brevity  # noqa: PLC0415 - written by the fixture
    from my_credit.strategies import HIGH_ENTROPY_ONLY  # noqa: PLC0415

    weights = check_token_weight_strategy(HIGH_ENTROPY_ONLY, {"name": "high", "fraction": 0.2})
    assert 0 < weights.sum() <= 0.2 * 16 * 12 + 1  # ceil(20 % of the valid tokens)
    assert check_reward("my_credit.rewards:brevity") == check_reward(brevity)
    advantages = check_advantage_strategy("my_credit.advantages:centred_reward")
    assert advantages.abs().sum() > 0


@pytest.mark.slow
def test_a_strategy_and_reward_outside_the_repository_run_in_the_tapo_comparison(
    project, plugins, monkeypatch
):
    monkeypatch.setenv("PYTHONPATH", f"{plugins}:{os.environ.get('PYTHONPATH', '')}")
    result = kedro_cli(project, "run", "--pipelines", "tapo", "--params", TINY_BUDGET)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, output[-3000:]
    base = yaml.safe_load((project / "conf/base/parameters_tapo.yml").read_text())
    added = list(yaml.safe_load((project / LOCAL_PARAMETERS).read_text())["tapo"]["strategies"])
    assert added == ["high_entropy", "grpo_brief"]
    (table,) = (project / "data/08_reporting/tapo_comparison.csv").glob("*/*")
    rows = pd.read_csv(table)
    assert rows["policy"].tolist() == ["sft", *base["tapo"]["strategies"], *added]
    for strategy in added:
        (metrics,) = (project / f"data/08_reporting/tapo_{strategy}_metrics.parquet").glob("*/*")
        metrics = pd.read_parquet(metrics)
        assert metrics["step"].tolist() == [1, 2], strategy
        assert metrics["reward/my_credit.rewards:brevity"].lt(0).all()  # computed every step
    (high,) = (project / "data/08_reporting/tapo_high_entropy_metrics.parquet").glob("*/*")
    selected = pd.read_parquet(high)["high_entropy/selected_frac"]
    assert selected.between(0.2, 0.5).all(), selected.tolist()  # ceil(20 %) of few tokens
    (results,) = (project / "data/07_model_output/tapo_results_grpo_brief.parquet").glob("*/*")
    assert "reward/my_credit.rewards:brevity" in pd.read_parquet(results).columns


@pytest.mark.parametrize(
    ("replace", "expected"),
    [
        (
            ("my_credit.strategies:HIGH", "my_credit.strategys:HIGH"),
            r"tapo\.strategies\.high_entropy .*token_weights\.name: "
            r"'my_credit\.strategys:HIGH_ENTROPY_ONLY': no module named 'my_credit\.strategys'",
        ),
        (
            ('"my_credit.rewards:brevity"]', '"my_credit.rewards:brevty"]'),
            r"tapo\.reward_functions\.3: 'my_credit\.rewards:brevty': 'my_credit\.rewards' has "
            r"no attribute 'brevty'",
        ),
    ],
    ids=["strategy module", "reward attribute"],
)
def test_a_broken_path_fails_before_the_first_node_naming_the_key(
    project, plugins, monkeypatch, replace, expected
):
    monkeypatch.syspath_prepend(str(plugins))
    local = project / LOCAL_PARAMETERS
    text = local.read_text(encoding="utf-8")
    assert replace[0] in text
    local.write_text(text.replace(replace[0], replace[1]), encoding="utf-8")
    monkeypatch.chdir(project)
    bootstrap_project(project)
    counter = NodeCounter()
    with KedroSession.create(project_path=project) as session:
        session._hook_manager.register(counter)
        with pytest.raises(ConfigError, match=expected):
            session.run(pipeline_names=["tapo"])
    assert counter.started == []
