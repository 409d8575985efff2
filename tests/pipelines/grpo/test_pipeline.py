"""``kedro run --pipelines grpo`` in a Kedro session at the smallest sizes: on the synthetic
default, and on a user's JSON lines file of chat prompts declared in conf/local/catalog.yml,
with a TRL-style reward (by import path) that reads one of the file's columns."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from kedro.framework.session import KedroSession

from creditflow.errors import TaskSourceError
from tests.kedro_project import NodeCounter, copy_project

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

SMALLEST = {
    "torch_threads": 1,
    "tasks": {"n_train": 48, "n_eval": 4, "max_eval_problems": 4},
    "policy": {"tiny": {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64}},
    "sft": {"steps": 3, "batch_size": 8},
    "grpo": {"steps": 2, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 3},
    "evaluation": {"samples_per_problem": 2, "max_new_tokens": 3},
}


def difficulty_bonus(completions, difficulty, **kwargs):
    """A TRL-style reward reading the source's ``difficulty`` column; None (does not apply)
    where the row has none."""
    return [None if d is None else 0.1 * d for d in difficulty]


MY_PROMPTS = """\
my_prompts:
  type: pandas.JSONDataset
  filepath: data/01_raw/my_prompts.jsonl
  load_args: {lines: true, dtype: false}
  metadata: {task_schema: prompts}
"""


@pytest.fixture
def project(project_root: Path, tmp_path: Path, monkeypatch) -> Path:
    copy_project(project_root, tmp_path, monkeypatch)
    (tmp_path / "conf/local/catalog.yml").write_text(MY_PROMPTS, encoding="utf-8")
    (tmp_path / "data/01_raw").mkdir(parents=True)
    return tmp_path


def _write_prompts(project: Path, rows: list[dict]) -> None:
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    (project / "data/01_raw/my_prompts.jsonl").write_text(lines, encoding="utf-8")


def _rows(n: int) -> list[dict]:
    """Chat prompts with a system turn, and plain text ones; difficulty blank on some."""
    rows = []
    for i in range(n):
        question = f"What is {i} + 1?"
        prompt = (
            [
                {"role": "system", "content": "Reply with a number."},
                {"role": "user", "content": question},
            ]
            if i % 2
            else question
        )
        difficulty = None if i % 3 == 0 else i % 4
        rows.append(
            {
                "id": f"q{i}",
                "prompt": prompt,
                "answer": str(i + 1),
                "completion": str(i + 1),
                "difficulty": difficulty,
            }
        )
    return rows


def _run(project: Path, params: dict, counter: NodeCounter | None = None) -> str:
    runtime = {"grpo": params, "tracking": {"enabled": False}}
    with KedroSession.create(project_path=project, runtime_params=runtime) as session:
        if counter is not None:
            session._hook_manager.register(counter)
        session.run(pipeline_names=["grpo"])
        return session.session_id


def _saved(project: Path, path: str, run_id: str) -> Path:
    folder = project / path
    return folder / run_id / folder.name


@pytest.mark.slow
def test_the_grpo_pipeline_compares_its_strategies_on_the_synthetic_prompts(project):
    torch.set_num_threads(1)
    run_id = _run(project, SMALLEST)
    table = pd.read_csv(_saved(project, "data/08_reporting/grpo_comparison.csv", run_id))
    assert table["policy"].tolist() == ["sft", "grpo", "dr_grpo"]
    assert table["n_eval"].tolist() == [4, 4, 4]
    dr_grpo = table.set_index("policy").loc["dr_grpo"]
    assert (
        dr_grpo["eval_reward_vs_baseline_ci_low_heldout"]
        <= dr_grpo["eval_reward_vs_baseline_heldout"]
    )
    assert table["eval_reward"].between(0, 1).all()
    for strategy in ("grpo", "dr_grpo"):
        metrics = pd.read_parquet(
            _saved(project, f"data/08_reporting/grpo_{strategy}_metrics.parquet", run_id)
        )
        assert metrics["step"].tolist() == [1, 2]
        assert "reward/exact_match" in metrics
    held_out = pd.read_json(
        _saved(project, "data/05_model_input/grpo_eval_tasks.jsonl", run_id), lines=True
    )
    results = pd.read_parquet(
        _saved(project, "data/07_model_output/grpo_results_grpo.parquet", run_id)
    )
    assert results["id"].tolist() == held_out["id"].tolist()
    assert {"reward/exact_match", "sampled/reward/exact_match"} <= set(results)


@pytest.mark.slow
def test_a_users_jsonl_of_chat_prompts_runs_through_the_catalog(project):
    torch.set_num_threads(1)
    _write_prompts(project, _rows(20))
    reward = "tests.pipelines.grpo.test_pipeline:difficulty_bonus"
    params = {
        **SMALLEST,
        "tasks": {"source": "my_prompts", "heldout_fraction": 0.25, "max_eval_problems": 5},
        "reward_functions": ["exact_match", reward],
    }
    run_id = _run(project, params)
    train = pd.read_json(
        _saved(project, "data/05_model_input/grpo_train_tasks.jsonl", run_id),
        lines=True,
        dtype=False,
    )
    assert len(train) == 15 and any(isinstance(p, list) for p in train["prompt"])
    results = pd.read_parquet(
        _saved(project, "data/07_model_output/grpo_results_sft.parquet", run_id)
    )
    assert len(results) == 5
    difficulty = {row["id"]: row["difficulty"] for row in _rows(20)}
    expected = [0.0 if difficulty[i] is None else 0.1 * difficulty[i] for i in results["id"]]
    assert results[f"reward/{reward}"].tolist() == pytest.approx(expected)
    table = pd.read_csv(_saved(project, "data/08_reporting/grpo_comparison.csv", run_id))
    assert table["policy"].tolist() == ["sft", "grpo", "dr_grpo"]
    assert f"sampled_{reward}" in table


def test_a_bad_row_of_the_users_prompts_fails_the_first_node_naming_it(project):
    rows = _rows(6)
    rows[4]["prompt"] = [{"role": "user", "text": "What is 4 + 1?"}]
    _write_prompts(project, rows)
    counter = NodeCounter()
    with pytest.raises(TaskSourceError, match=r"task source `my_prompts`, row 4, column `prompt`"):
        _run(project, {"tasks": {"source": "my_prompts"}}, counter)
    assert counter.started == ["build_grpo_tasks"]  # nothing trained
