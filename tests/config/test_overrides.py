"""Overrides the Kedro way, each through a real ``KedroSession`` of a copy of the project: a
``conf/local`` parameters file holds only the keys it changes (merged key by key into
conf/base: settings.py), ``--params`` works beside it, a policy's source switches with a
partial override, LoRA needs only ``--params "tapo.policy.lora.r=8"``, and an unknown group or
key under ``--params`` fails before the pipelines load."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from kedro.config import OmegaConfigLoader
from kedro.framework.project import settings
from kedro.framework.session import KedroSession

import creditflow
from creditflow.errors import ConfigError
from creditflow.models.lora import is_lora_model
from creditflow.pipelines.parameters import CHAIN_GROUPS, check_parameters
from tests.kedro_project import (
    NodeCounter,
    NodeIO,
    checkout_copy,
    copy_project,
    save_tiny_checkpoint,
)

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

# The smallest tapo tasks and tiny policy the first nodes need (seconds, not minutes).
SMALL_TAPO = {
    "tasks": {"n_train_per_language": 3, "n_eval_per_language": 1},
    "tokenizer": {"vocab_size": 300},
    "policy": {
        "tiny": {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64},
    },
}
NO_TRACKING = {"tracking": {"enabled": False}}
POLICY_NODES = ["build_tapo_tasks", "train_tapo_tokenizer", "build_tapo_policy"]


@pytest.fixture
def project(project_root: Path, tmp_path: Path, monkeypatch) -> Path:
    return copy_project(project_root, tmp_path / "project", monkeypatch)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_qwen2"))


def write_local(project: Path, group: str, text: str) -> None:
    (project / f"conf/local/parameters_{group}.yml").write_text(text, encoding="utf-8")


def run(project: Path, params: dict, pipeline: str, nodes: list[str]) -> NodeIO:
    """``kedro run --pipelines <pipeline> --nodes <nodes> --params <params>``; what each node
    took and gave."""
    io = NodeIO()
    with KedroSession.create(project_path=project, runtime_params=params) as session:
        session._hook_manager.register(io)
        session.run(pipeline_names=[pipeline], node_names=nodes)
    return io


def base_group(project_root: Path, group: str) -> dict:
    text = (project_root / f"conf/base/parameters_{group}.yml").read_text(encoding="utf-8")
    return yaml.safe_load(text)[group]


# ----------------------------------------------------------------- deep merge


def test_a_conf_local_file_holds_only_the_keys_it_changes(project, project_root):
    write_local(project, "tapo", "tapo:\n  tasks: {n_train_per_language: 3}\n")
    io = run(project, {"tapo": {"grpo": {"steps": 2}}, **NO_TRACKING}, "tapo", POLICY_NODES[:1])
    params, base = io.inputs["build_tapo_tasks"]["params:tapo"], base_group(project_root, "tapo")
    assert params["tasks"]["n_train_per_language"] == 3  # conf/local
    assert params["grpo"]["steps"] == 2  # --params, on the same group
    # Everything else as conf/base has it.
    assert params["tasks"]["languages"] == base["tasks"]["languages"]
    assert params["grpo"]["learning_rate"] == base["grpo"]["learning_rate"]
    assert params["strategies"] == base["strategies"] and params["policy"] == base["policy"]
    seen = len(base["tasks"]["languages"]) - len(base["tasks"]["holdout_languages"])
    assert len(io.outputs["build_tapo_tasks"]["tapo_train_tasks"]) == 3 * seen


def test_params_on_another_group_work_beside_a_conf_local_file(project, project_root):
    write_local(project, "tapo", "tapo:\n  grpo: {steps: 3}\n")
    overrides = {"annotation": {"items": {"n_items": 3, "image_size": 32}}, **NO_TRACKING}
    io = run(project, overrides, "annotation", ["generate_items"])
    params = io.inputs["generate_items"]["params:annotation"]
    base = base_group(project_root, "annotation")
    assert params["items"] == {**base["items"], "n_items": 3, "image_size": 32}
    assert params["query_logs"] == base["query_logs"]
    assert len(io.outputs["generate_items"]["catalogue_items"]) == 3


# ----------------------------------------------------------------- switching policy.source


def test_a_partial_override_switches_the_tapo_policy_to_a_checkpoint(project, checkpoint):
    # conf/base keeps its `tiny:` block; the override names only what it changes.
    write_local(
        project,
        "tapo",
        f"tapo:\n  policy: {{source: pretrained, name_or_path: '{checkpoint}'}}\n",
    )
    io = run(project, {"tapo": {"tasks": SMALL_TAPO["tasks"]}, **NO_TRACKING}, "tapo", POLICY_NODES)
    policy = io.outputs["build_tapo_policy"]["tapo_initial_policy"]
    saved = type(policy).from_pretrained(checkpoint)
    assert policy.config.hidden_size == 32  # the checkpoint's, not base's tiny 128
    assert all(
        torch.equal(a, b) for a, b in zip(policy.parameters(), saved.parameters(), strict=True)
    )


def test_a_partial_override_switches_the_tor_policy_source(project):
    # The tor tasks node does not load the policy: the check before it is what is tested.
    write_local(project, "tor", "tor:\n  policy: {source: pretrained, name_or_path: org/vl}\n")
    overrides = {"tor": {"tasks": {"n_train": 2, "n_eval": 2}}, **NO_TRACKING}
    io = run(project, overrides, "tor", ["build_tor_tasks"])
    assert io.inputs["build_tor_tasks"]["params:tor"]["policy"]["tiny"]  # still there, ignored


POLICY_BLOCKS = [
    ("tapo", "policy"),
    ("tor", "policy"),
    ("expmodel_sft", "model"),
    ("movielens_eval", "expmodel", "model"),
]


def _nested(path: tuple[str, ...], leaf: dict) -> dict:
    for key in reversed(path):
        leaf = {key: leaf}
    return leaf


@pytest.mark.parametrize("path", POLICY_BLOCKS, ids=[".".join(p) for p in POLICY_BLOCKS])
def test_every_policy_block_switches_source_through_a_conf_local_file(project, path):
    # As the session's config loader merges it (settings.CONFIG_LOADER_ARGS).
    override = _nested(path, {"source": "pretrained", "name_or_path": "org/model"})
    write_local(project, path[0], yaml.safe_dump(override))
    loader = OmegaConfigLoader(str(project / "conf"), **settings.CONFIG_LOADER_ARGS)
    params = loader["parameters"]
    block = params
    for key in path:
        block = block[key]
    assert block["source"] == "pretrained" and "tiny" in block  # base's, merged
    check_parameters({path[0]: params[path[0]]})


# ----------------------------------------------------------------- LoRA from the command line


def test_lora_from_the_command_line_needs_only_its_rank(project, caplog):
    # --params "tapo.policy.lora.r=8" (and small sizes), with conf/base's `lora: null`.
    overrides = {"tapo": {**SMALL_TAPO, "policy": {**SMALL_TAPO["policy"], "lora": {"r": 8}}}}
    with caplog.at_level(logging.INFO, logger="creditflow.models.lora"):
        io = run(project, {**overrides, **NO_TRACKING}, "tapo", POLICY_NODES)
    policy = io.outputs["build_tapo_policy"]["tapo_initial_policy"]
    assert is_lora_model(policy)
    adapted = {
        name.split(".lora_A.")[0].rsplit(".", 1)[1]
        for name, _ in policy.named_parameters()
        if ".lora_A." in name
    }
    # Every linear layer but the output head (the default, "all-linear").
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    logged = [r.getMessage() for r in caplog.records if "trainable parameters" in r.getMessage()]
    assert len(logged) == 1 and f" {trainable} trainable parameters of " in logged[0]


# ----------------------------------------------------------------- unknown names under --params


def test_an_unknown_group_under_params_fails_before_the_pipelines_load(project):
    counter = NodeCounter()
    with KedroSession.create(
        project_path=project, runtime_params={"tpao": {"grpo": {"steps": 2}}}
    ) as session:
        session._hook_manager.register(counter)
        with pytest.raises(ConfigError) as error:
            session.run(pipeline_names=["tapo"])
    assert str(error.value).startswith(
        "--params: unknown parameter group `tpao` (did you mean `tapo`?); valid parameter "
        "groups: annotation, credit_gym, data_ingest, "
    )
    assert counter.started == []
    assert not (project / "mlruns").exists()  # before MLflow opened its store


def test_a_misspelt_key_under_params_fails_before_mlflow_opens_its_store(project):
    counter = NodeCounter()
    with KedroSession.create(
        project_path=project, runtime_params={"tapo": {"grpo": {"stpes": 2}}}
    ) as session:
        session._hook_manager.register(counter)
        with pytest.raises(
            ConfigError, match=r"tapo.grpo: unknown key `stpes` \(did you mean `steps`"
        ):
            session.run(pipeline_names=["tapo"])
    assert counter.started == [] and not (project / "mlruns").exists()


# What a fresh process holds when the --params check fails, printed for the test to read.
NO_TORCH_PROBE = """
import sys
from pathlib import Path

from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from creditflow.errors import ConfigError

bootstrap_project(Path.cwd())
for pipeline, overrides in (
    ("tapo", {"tapo": {"grpo": {"stepz": 2}}}),
    ("tor", {"tor": {"policy": {"tiny": {"hidden_sise": 8}}}}),
):
    with KedroSession.create(project_path=Path.cwd(), runtime_params=overrides) as session:
        try:
            session.run(pipeline_names=[pipeline])
        except ConfigError as error:
            print("error:", str(error).splitlines()[-1].strip())
print("loaded:", sorted(name for name in ("torch", "transformers", "pandas") if name in sys.modules))
"""


def _fresh_python(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    source = str(Path(creditflow.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def test_a_misspelt_comparison_key_fails_without_importing_torch(project_root, tmp_path):
    # In a fresh process, as `kedro run` starts one: the check of a tapo or tor override
    # needs neither torch nor transformers (seconds to import), nor the pipelines.
    directory = checkout_copy(project_root, tmp_path / "project")
    result = _fresh_python(["-c", NO_TORCH_PROBE], directory)
    lines = [line for line in result.stdout.splitlines() if line.startswith(("error:", "loaded:"))]
    assert lines[0].startswith("error: tapo.grpo: unknown key `stepz` (did you mean `steps`?)")
    assert lines[1].startswith("error: tor.policy.tiny: unknown key `hidden_sise` (did you mean")
    # pandas comes with the task worlds' name tables (tapo languages, tor kinds).
    assert lines[2] == "loaded: ['pandas']", result.stdout


# A misspelt key under each chain group and the key its error suggests.
CHAIN_TYPOS = {
    "annotation": ("items.n_itmes", "n_items"),
    "data_ingest": ("max_rows_per_sorce", "max_rows_per_source"),
    "experience_scoring": ("batch_sise", "batch_size"),
    "expmodel_pft": ("pairs.margn", "margin"),
    "expmodel_sft": ("max_lenght", "max_length"),
    "movielens_eval": ("expmodel.teacher.min_rating", "min_ratings"),
    "reranker_eval": ("ab.drawz", "draws"),
    "reranker_grpo": ("grpo.stepz", "steps"),
    "reranker_pretrain": ("training.stpes", "steps"),
}
# The same for each chain group, through a session as `kedro run --pipelines <group> --params
# "<group>.<typo>=1"` makes one; argv[1] holds CHAIN_TYPOS.
CHAIN_NO_TORCH_PROBE = """
import json
import sys
from pathlib import Path

from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from creditflow.errors import ConfigError

bootstrap_project(Path.cwd())
for group, (dotted, _) in json.loads(sys.argv[1]).items():
    overrides = 1
    for key in reversed([group, *dotted.split(".")]):
        overrides = {key: overrides}
    with KedroSession.create(project_path=Path.cwd(), runtime_params=overrides) as session:
        try:
            session.run(pipeline_names=[group])
        except ConfigError as error:
            print("error:", str(error).splitlines()[-1].strip())
print("loaded:", sorted(name for name in ("torch", "transformers") if name in sys.modules))
"""


def test_the_chain_schemas_import_neither_torch_nor_transformers(tmp_path):
    probe = (
        "import sys\n"
        "import creditflow.pipelines.chain_parameters\n"
        "print(sorted(name for name in ('torch', 'transformers') if name in sys.modules))\n"
    )
    assert _fresh_python(["-c", probe], tmp_path).stdout.strip() == "[]"


def test_a_misspelt_chain_key_fails_without_importing_torch(project_root, tmp_path):
    # As the comparison keys above: every chain group's --params typo fails with a "did you
    # mean" before torch or transformers load.
    assert set(CHAIN_TYPOS) == CHAIN_GROUPS
    directory = checkout_copy(project_root, tmp_path / "project")
    result = _fresh_python(["-c", CHAIN_NO_TORCH_PROBE, json.dumps(CHAIN_TYPOS)], directory)
    lines = [line for line in result.stdout.splitlines() if line.startswith(("error:", "loaded:"))]
    expected = []
    for group, (dotted, suggestion) in CHAIN_TYPOS.items():
        *parents, key = dotted.split(".")
        where = ".".join([group, *parents])
        expected.append(f"error: {where}: unknown key `{key}` (did you mean `{suggestion}`?)")
    assert len(lines) == len(expected) + 1, result.stdout
    for line, start in zip(lines[:-1], expected, strict=True):
        assert line.startswith(start), (line, start)
    assert lines[-1] == "loaded: []", result.stdout


def test_a_group_of_a_conf_local_file_is_a_group_for_params(project):
    # A group only conf/local defines is known; it has no schema, and no node reads it.
    write_local(project, "mine", "mine:\n  knob: 1\n")
    overrides = {"mine": {"knob": 2}, "annotation": {"items": {"n_items": 2}}, **NO_TRACKING}
    io = run(project, overrides, "annotation", ["generate_items"])
    assert len(io.outputs["generate_items"]["catalogue_items"]) == 2
