"""README "A real checkpoint with LoRA", as documented: a ``conf/local/parameters_tapo.yml`` of only the
keys that change (a local checkpoint, LoRA by its rank, no SFT) beside conf/base, and
``--params`` for the budget, on the command line of a copy of the project."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from creditflow.errors import ConfigError
from tests.kedro_project import (
    NodeCounter,
    NodeIO,
    checkout_copy,
    kedro_cli,
    save_mgsm_problems,
    save_tiny_checkpoint,
)

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")


def readme_recipe(project_root: Path) -> dict:
    """The conf/local file README "A real checkpoint with LoRA" shows (its first yaml block),
    the same as docs/howto/real_checkpoints.md's."""
    readme = (project_root / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**A real checkpoint with LoRA.**") :]
    guide = (project_root / "docs/howto/real_checkpoints.md").read_text(encoding="utf-8")
    recipe, guide_recipe = (_first_yaml_block(text) for text in (section, guide))
    assert recipe == guide_recipe, "README and docs/howto/real_checkpoints.md differ"
    return recipe


def _first_yaml_block(text: str) -> dict:
    block = text[text.index("```yaml\n") + len("```yaml\n") :]
    return yaml.safe_load(block[: block.index("```")])


# A tiny budget on the command line (each a `--params` item).
TINY_BUDGET = (
    "tapo.tasks.n_train_per_language=6",
    "tapo.tasks.n_eval_per_language=2",
    "tapo.grpo.steps=2",
    "tapo.grpo.prompts_per_step=2",
    "tapo.grpo.group_size=2",
    "tapo.grpo.max_new_tokens=10",
    "tapo.evaluation.max_new_tokens=10",
    "tapo.evaluation.mgsm_max_per_language=1",
    "tapo.evaluation.samples_per_problem=2",
    "tapo.torch_threads=1",
)


@pytest.fixture
def project(project_root: Path, tmp_path: Path) -> Path:
    """A copy of the project with the recipe's conf/local file naming a tiny Qwen2 saved with
    ``save_pretrained``, and the one saved MGSM table the evaluation reads."""
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny-qwen2")
    project = checkout_copy(project_root, tmp_path / "project")
    recipe = readme_recipe(project_root)
    recipe["tapo"]["policy"]["name_or_path"] = str(
        checkpoint
    )  # a tiny stand-in for the README's checkpoint
    local = yaml.safe_dump(recipe)
    (project / "conf/local/parameters_tapo.yml").write_text(local, encoding="utf-8")
    save_mgsm_problems(project)
    return project


def test_the_readme_recipe_holds_only_the_keys_that_change(project_root):
    assert readme_recipe(project_root) == {
        "tapo": {
            "policy": {
                "source": "pretrained",
                "name_or_path": "data/06_models/pretrained/smollm2-135m-instruct",
                "lora": {"r": 8},
            },
            "sft": {"steps": 0},
        }
    }


@pytest.mark.slow
def test_the_documented_recipe_runs_the_tapo_pipeline(project):
    result = kedro_cli(project, "run", "--pipelines", "tapo", "--params", ",".join(TINY_BUDGET))
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, output[-3000:]
    (manifest,) = (project / "data/08_reporting/run_manifests").glob("*.json")
    run = json.loads(manifest.read_text())
    assert run["status"] == "completed"
    policy = run["parameters"]["tapo"]["policy"]
    assert policy["source"] == "pretrained" and policy["lora"] == {"r": 8}
    assert run["parameters"]["tapo"]["grpo"]["steps"] == 2  # --params
    assert run["parameters"]["tapo"]["grpo"]["group_size"] == 2
    # The policy is the checkpoint with LoRA adapters: the saved initial policy is an adapter
    # that names the checkpoint as its base (nothing of the base copied).
    (initial,) = (project / "data/06_models/tapo_initial_policy").glob("*/tapo_initial_policy")
    adapter = json.loads((initial / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(project.parent / "tiny-qwen2")
    assert adapter["r"] == 8 and adapter["lora_alpha"] == 16 and not (initial / "base").exists()
    assert " trainable parameters of " in output  # the adapter's size, logged
    # Every strategy trained its 2 steps and was evaluated; the table compares them.
    base = yaml.safe_load((project / "conf/base/parameters_tapo.yml").read_text())
    strategies = list(base["tapo"]["strategies"])  # conf/base's, the recipe keeps them
    for strategy in strategies:
        (metrics,) = (project / f"data/08_reporting/tapo_{strategy}_metrics.parquet").glob("*/*")
        assert pd.read_parquet(metrics)["step"].tolist() == [1, 2], strategy
    (table,) = (project / "data/08_reporting/tapo_comparison.csv").glob("*/*")
    assert pd.read_csv(table)["policy"].tolist() == ["sft", *strategies]


def test_with_the_recipe_file_params_on_another_group_still_work(project, monkeypatch):
    monkeypatch.chdir(project)  # relative catalog paths resolve in the copy
    bootstrap_project(project)
    io = NodeIO()
    overrides = {"annotation": {"items": {"n_items": 3, "image_size": 32}}}
    with KedroSession.create(project_path=project, runtime_params=overrides) as session:
        session._hook_manager.register(io)
        session.run(pipeline_names=["annotation"], node_names=["generate_items"])
    assert len(io.outputs["generate_items"]["catalogue_items"]) == 3


def test_with_the_recipe_file_a_misspelt_group_fails_before_any_node(project, monkeypatch):
    monkeypatch.chdir(project)
    bootstrap_project(project)
    counter = NodeCounter()
    overrides = {"tpao": {"grpo": {"steps": 2}}}
    with KedroSession.create(project_path=project, runtime_params=overrides) as session:
        session._hook_manager.register(counter)
        with pytest.raises(ConfigError, match=r"unknown parameter group `tpao` \(did you mean"):
            session.run(pipeline_names=["tapo"])
    assert counter.started == []
