"""``kedro run --pipelines grpo`` in a Kedro session at the smallest sizes: on the synthetic
default, and on docs/howto/any_prompt_set.md's example as written: a JSON lines file of chat
and text prompts declared in conf/local/catalog.yml, with a TRL-style reward in a file outside
the repository (by import path) that reads one of the file's columns."""

from __future__ import annotations

import json
import re
import sys
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


def documented(project_root: Path) -> tuple[dict[str, str], list[dict]]:
    """docs/howto/any_prompt_set.md's files: the code blocks whose first line names their file
    (``# my_rewards.py``), by that name, and the rows of its JSON lines block."""
    page = (project_root / "docs/howto/any_prompt_set.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```(?:python|yaml)\n# (\S+)\n(.*?)```", page, flags=re.DOTALL)
    (lines,) = re.findall(r"```json\n(.*?)```", page, flags=re.DOTALL)
    return dict(blocks), [json.loads(line) for line in lines.splitlines()]


@pytest.fixture
def project(project_root: Path, tmp_path: Path, monkeypatch) -> Path:
    copy_project(project_root, tmp_path, monkeypatch)
    (tmp_path / "data/01_raw").mkdir(parents=True)
    return tmp_path


@pytest.fixture
def own_prompts(project: Path, project_root: Path, tmp_path_factory, monkeypatch) -> list[dict]:
    """The page's catalog entry, parameters and reward module in place, and its JSON lines
    file with 18 more rows like its own (chat prompts, with and without a system turn;
    max_chars null on some).
    Returns the rows."""
    files, rows = documented(project_root)
    for name in ("conf/local/catalog.yml", "conf/local/parameters_grpo.yml"):
        (project / name).write_text(files[name], encoding="utf-8")
    outside = tmp_path_factory.mktemp("outside")  # beside the project, not in it
    (outside / "my_rewards.py").write_text(files["my_rewards.py"], encoding="utf-8")
    monkeypatch.syspath_prepend(str(outside))
    for i in range(18):
        chat = [{"role": "system", "content": "Reply with a number."}]
        question = f"What is {i} + 1?"
        prompt = (
            [*chat, {"role": "user", "content": question}]
            if i % 2
            else chat[1:] + [{"role": "user", "content": question}]
        )
        limit = None if i % 3 == 0 else i % 4
        rows.append(
            {
                "id": f"n{i}",
                "prompt": prompt,
                "answer": str(i + 1),
                "completion": str(i + 1),
                "max_chars": limit,
            }
        )
    _write_prompts(project, rows)
    yield rows
    sys.modules.pop("my_rewards", None)  # the next test's folder is another


def _write_prompts(project: Path, rows: list[dict]) -> None:
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    (project / "data/01_raw/my_prompts.jsonl").write_text(lines, encoding="utf-8")


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
    credit = pd.read_parquet(_saved(project, "data/08_reporting/grpo_credit_grpo.parquet", run_id))
    assert len(credit) and (project / "data/08_reporting/grpo_token_credit.png").is_dir()
    held_out = pd.read_json(
        _saved(project, "data/05_model_input/grpo_eval_tasks.jsonl", run_id), lines=True
    )
    results = pd.read_parquet(
        _saved(project, "data/07_model_output/grpo_results_grpo.parquet", run_id)
    )
    assert results["id"].tolist() == held_out["id"].tolist()
    assert {"reward/exact_match", "sampled/reward/exact_match"} <= set(results)


@pytest.mark.slow
def test_the_documented_jsonl_of_chat_prompts_runs_through_the_catalog(project, own_prompts):
    torch.set_num_threads(1)
    params = {**SMALLEST, "tasks": {"heldout_fraction": 0.25, "max_eval_problems": 5}}
    run_id = _run(project, params)
    train = pd.read_json(
        _saved(project, "data/05_model_input/grpo_train_tasks.jsonl", run_id),
        lines=True,
        dtype=False,
    )
    assert len(train) == 15 and all(isinstance(p, list) for p in train["prompt"])
    results = pd.read_parquet(
        _saved(project, "data/07_model_output/grpo_results_sft.parquet", run_id)
    )
    assert len(results) == 5
    # The page's reward read each row's max_chars: 1 within it, 0 over it, 0 where null.
    reward = "reward/my_rewards:within_budget"
    limits = {row["id"]: row["max_chars"] for row in own_prompts}
    for row_id, completion, score in zip(
        results["id"], results["completion"], results[reward], strict=True
    ):
        limit = limits[row_id]
        assert score == (0.0 if limit is None else float(len(completion) <= limit)), row_id
    table = pd.read_csv(_saved(project, "data/08_reporting/grpo_comparison.csv", run_id))
    assert table["policy"].tolist() == ["sft", "grpo", "dr_grpo"]
    assert "sampled_my_rewards:within_budget" in table


def test_a_bad_row_of_the_users_prompts_fails_the_first_node_naming_it(project, own_prompts):
    own_prompts[4]["prompt"] = [{"role": "user", "text": "What is 4 + 1?"}]
    _write_prompts(project, own_prompts)
    counter = NodeCounter()
    with pytest.raises(TaskSourceError, match=r"task source `my_prompts`, row 4, column `prompt`"):
        _run(project, {}, counter)
    assert counter.started == ["build_grpo_tasks"]  # nothing trained
