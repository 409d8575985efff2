"""The parameter schemas (creditflow.config.schema, creditflow.pipelines.parameters) and the
hook that runs them before a run's first node: every probe of the fail-fast issue fails in
seconds, naming the key, with a suggestion where a key is misspelt."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest
from kedro.config import OmegaConfigLoader
from kedro.framework.project import configure_project
from kedro.framework.session import KedroSession

from creditflow.config.schema import (
    check_group,
    dataclass_block,
    problems,
    signature_block,
    unknown_keys_message,
)
from creditflow.errors import ConfigError
from creditflow.pipeline_registry import register_pipelines
from creditflow.pipelines.chain_parameters import CHAIN_SCHEMAS
from creditflow.pipelines.parameters import CHAIN_GROUPS, GROUPS, all_schemas, check_parameters
from creditflow.training.grpo_runs import check_comparison_params
from creditflow.training.strategies import validate_strategies
from tests.kedro_project import NodeCounter, copy_project


@pytest.fixture(scope="module")
def conf_params(project_root: Path) -> dict:
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    return dict(loader["parameters"])


def _groups_read_by_pipelines() -> set[str]:
    configure_project("creditflow")  # find_pipelines needs the package configured
    groups = set()
    for pipeline in register_pipelines().values():
        for name in pipeline.inputs():
            if name.startswith("params:"):
                groups.add(name.removeprefix("params:").split(".")[0])
    return groups


def test_every_group_a_pipeline_reads_has_a_schema_and_the_shipped_conf_passes(conf_params):
    groups = _groups_read_by_pipelines()
    assert groups <= GROUPS, sorted(groups - GROUPS)
    check_parameters({group: conf_params[group] for group in groups})


def _set(params: dict, dotted: str, value) -> dict:
    params = copy.deepcopy(params)
    *parents, key = dotted.split(".")
    node = params
    for part in parents:
        node = node[part]
    node[key] = value
    return params


# Each hostile-input probe (and one of each kind per chain group): the key set, its value, and
# what the error must say.
PROBES = [
    ("tapo.bogus_top", 1, r"tapo: unknown key `bogus_top`; valid keys: comparison, evaluation"),
    (
        "tapo.tasks.n_train_per_langauge",
        5,
        r"tapo.tasks: unknown key `n_train_per_langauge` \(did you mean `n_train_per_language`",
    ),
    (
        "tapo.evaluation.samples_per_probem",
        2,
        r"tapo.evaluation: unknown key `samples_per_probem` \(did you mean `samples_per_problem`",
    ),
    ("tapo.grpo.stpes", 5, r"tapo.grpo: unknown key `stpes` \(did you mean `steps`"),
    ("tapo.grpo.steps", "abc", r"tapo.grpo.steps: input should be a valid integer, got 'abc'"),
    ("tapo.grpo.group_size", 2.5, r"tapo.grpo.group_size: .*integer, got 2.5 \(float\)"),
    ("tapo.grpo.beta", True, r"tapo.grpo.beta: input should be a valid number, got True"),
    # YAML's `.inf` and `.nan` are floats to the loader: refused wherever they are written.
    ("tapo.grpo.beta", float("inf"), r"tapo.grpo.beta: input should be a finite number"),
    ("tapo.sft.learning_rate", float("nan"), r"tapo.sft.learning_rate: .*finite number"),
    ("tapo.strategies.tapo.beta", float("inf"), r"tapo.strategies.tapo.beta: .*finite number"),
    ("tapo.policy.tiny.hiden_size", 8, r"tapo.policy.tiny: unknown key `hiden_size` \(did you"),
    ("tapo.tasks.languages", ["en", "xx"], r"tapo.tasks.languages.1: unknown language 'xx'"),
    ("tapo.tasks.variant", "hard", r"tapo.tasks.variant: unknown variant 'hard'; valid: conflict"),
    ("tapo.tasks.holdout_languages", ["ja"], r"tapo.tasks: holdout_languages \['ja'\] are not"),
    ("tapo.reward_functions", ["reasonnig"], r"tapo.reward_functions.0: unknown reward"),
    ("tapo.strategies.tapo.stpes", 3, r"tapo.strategies.tapo: unknown key `stpes`"),
    ("tapo.sft.batch_size", 0, r"tapo.sft: batch_size must be >= 1, got 0"),
    ("tor.evaluation.tabmwp_mx", 3, r"tor.evaluation: unknown key `tabmwp_mx` \(did you mean"),
    ("tor.policy.tiny.hidden_size", "64", r"tor.policy.tiny.hidden_size: .*got '64' \(str\)"),
    ("tor.tasks.kinds", ["count"], r"tor.tasks.kinds.0: unknown problem kind 'count'"),
    # Seeds and the baseline of a comparison.
    ("tapo.comparison.n_sedes", 5, r"tapo.comparison: unknown key `n_sedes` \(did you mean"),
    ("tapo.comparison.n_seeds", 0, r"tapo.comparison.n_seeds: .*greater than or equal to 1"),
    ("tor.comparison.n_seeds", 2.0, r"tor.comparison.n_seeds: .*integer"),
    (
        "tor.comparison.baseline",
        "unifrom",
        r"tor: comparison.baseline 'unifrom' is not a strategy; valid: tor, .*uniform",
    ),
    # Task sources: the split's knobs; the source's name is checked against the
    # catalog by hooks.task_source.TaskSourceHook (tests/config/test_task_sources.py).
    ("tapo.tasks.heldout_fraction", 1.0, r"tapo.tasks.heldout_fraction: .*less than 1"),
    ("tapo.tasks.max_eval_problems", 0, r"tapo.tasks.max_eval_problems: .*greater than or equal"),
    ("tapo.tasks.source", 3, r"tapo.tasks.source: input should be a valid string"),
    (
        "tor.tasks.sorce",
        "tabmwp_problems",
        r"tor.tasks: unknown key `sorce` \(did you mean `source`",
    ),
    ("tor.tasks.split_seed", 1.5, r"tor.tasks.split_seed: .*integer"),
    ("annotation.items.n_itmes", 3, r"annotation.items: unknown key `n_itmes` \(did you mean"),
    ("annotation.bogus", 1, r"annotation: unknown key `bogus`"),
    ("annotation.query_logs.heldout_fraction", 1.5, r"annotation.query_logs.heldout_fraction"),
    (
        "annotation.annotator.options",
        {"api_key": "sk-x"},
        r"annotation.annotator: options.api_key: secrets do not belong in parameters",
    ),
    ("annotation.annotator.options", {"temperture": 1}, r"unknown heuristic annotator option"),
    (
        "annotation.annotator",
        {"name": "openai", "options": {"base_url": "http://x", "model": "m", "step_deadline_s": 0}},
        r"annotation.annotator: options: step_deadline_s must be a finite number > 0, got 0",
    ),
    (
        "annotation.annotator",
        {"name": "openai", "options": {"base_url": "h", "model": "m", "max_reply_bytes": 1.5}},
        r"options: max_reply_bytes must be a finite number > 0, got 1.5",
    ),
    ("data_ingest.bogus", 1, r"data_ingest: unknown key `bogus`"),
    (
        "data_ingest.shared_data_dir",
        "old/data",
        r"data_ingest: `shared_data_dir` is now `raw_data_dir`",
    ),
    ("experience_scoring.bogus", 1, r"experience_scoring: unknown key `bogus`"),
    ("expmodel_sft.bogus", 1, r"expmodel_sft: unknown key `bogus`"),
    ("expmodel_sft.sft", {}, r"expmodel_sft: `sft` is now `training \(and max_length\)`"),
    ("expmodel_sft.training.lr", 0.1, r"expmodel_sft.training: `lr` is now `learning_rate`"),
    (
        "expmodel_sft.score_mode",
        "session",
        r"expmodel_sft.score_mode: unknown score_mode 'session'; valid: item, query",
    ),
    ("expmodel_pft.bogus", 1, r"expmodel_pft: unknown key `bogus`"),
    ("expmodel_pft.pairs.margn", 1.0, r"expmodel_pft.pairs: unknown key `margn` \(did you mean"),
    ("expmodel_pft.pft.lam", -1.0, r"expmodel_pft.pft: lam must be a number >= 0"),
    ("movielens_eval.bogus", 1, r"movielens_eval: unknown key `bogus`"),
    ("reranker_eval.bogus", 1, r"reranker_eval: unknown key `bogus`"),
    ("reranker_grpo.bogus", 1, r"reranker_grpo: unknown key `bogus`"),
    ("reranker_grpo.grpo.minibatch_size", 7, r"reranker_grpo.grpo: minibatch_size \(7\) must"),
    ("reranker_grpo.grpo.rewards", {"x": 1.0}, r"reranker_grpo.grpo: .*must not set"),
    ("reranker_pretrain.bogus", 1, r"reranker_pretrain: unknown key `bogus`"),
    ("reranker_pretrain.training.stpes", 3, r"reranker_pretrain.training: unknown key `stpes`"),
    ("reranker_pretrain.model.n_heads", 5, r"reranker_pretrain.model: d_model \(32\) must be"),
    ("reranker_pretrain.features.exclude", ["clicks"], r"unknown feature 'clicks'"),
    ("reranker_pretrain.rerankers", {"yaug": {"use_exp_scores": True}}, r"must define \['click'"),
    (
        "annotation.click_model.quality_weight",
        1.0,
        r"annotation.click_model: unknown key `quality_weight` \(did you mean `quality`",
    ),
    ("annotation.click_model.exposure_depth", [5, 3], r"exposure_depth must be \(lo, hi\)"),
    ("annotation.logging_ranker.noise", -1.0, r"annotation.logging_ranker: noise must be >= 0"),
    ("reranker_eval.ab.method", "mc", r"reranker_eval.ab.method: unknown A/B method 'mc'"),
    ("reranker_eval.ab.sweep.quality_weights", [], r"reranker_eval.ab.sweep.quality_weights"),
    ("reranker_grpo.reward.r_old", "clicks", r"unknown r_old source 'clicks'"),
    ("reranker_grpo.reward.online_user_budget", "many", r"online_user_budget: input should be"),
    ("reranker_grpo.validation.fraction", 1.0, r"validation.fraction: input should be less"),
    ("reranker_grpo.reward.gain_mode", "linear", r"unknown gain mode 'linear'"),
    (
        "reranker_grpo.controls.r_old_olny",
        {"alpha": 1.0, "beta": 0.0},
        r"reranker_grpo.controls: unknown key `r_old_olny` \(did you mean `r_old_only`",
    ),
    (
        "reranker_grpo.controls.r_old_only.beta",
        0.1,
        r"reranker_grpo.controls.r_old_only: beta is 0.1: .* its beta must be 0",
    ),
    ("reranker_grpo.controls.r_old_only.alpha", 0.0, r"r_old_only.alpha: input should be greater"),
    (
        "reranker_pretrain.controls.shuffled_exp.sede",
        1,
        r"reranker_pretrain.controls.shuffled_exp: unknown key `sede` \(did you mean `seed`",
    ),
    (
        "reranker_pretrain.rerankers.extra",
        {"use_exp_scores": True},
        r"rerankers \['extra'\] are not trained",
    ),
    (
        "movielens_eval.expmodel.teacher.min_rating",
        3,
        r"unknown key `min_rating` \(did you mean `min_ratings`\?\)",
    ),
    ("movielens_eval.expmodel.sft.steps", -1, r"sft steps must be >= 0"),
    ("movielens_eval.expmodel.pft.lam", -1, r"movielens_eval.expmodel.pft: lam must be"),
    ("movielens_eval.expmodel.pairs.margin", "big", r"expmodel.pairs.margin: input should be"),
]


@pytest.mark.parametrize(("key", "value", "message"), PROBES, ids=[p[0] for p in PROBES])
def test_each_broken_parameter_is_named_with_what_is_wrong(conf_params, key, value, message):
    group = key.split(".")[0]
    params = _set(conf_params, key, value)
    with pytest.raises(ConfigError, match=message):
        check_parameters({group: params[group]})


@pytest.mark.parametrize("alpha", [True, float("inf")])
def test_a_strategy_option_is_typed_as_strictly_as_a_grpo_field(conf_params, alpha):
    params = _set(conf_params, "tapo.strategies.tapo.advantage", {"name": "tapo", "alpha": alpha})
    with pytest.raises(ConfigError, match=r"advantage.alpha must be in \[0, 1\], got"):
        check_comparison_params("tapo", params["tapo"], ["tapo"])


def test_the_openai_annotators_bounds_pass_when_in_range(conf_params):
    options = {"base_url": "http://x", "model": "m", "credentials": "openai_annotator"}
    options |= {"request_deadline_s": 2, "step_deadline_s": 7.5, "max_reply_bytes": 4096}
    params = _set(conf_params, "annotation.annotator", {"name": "openai", "options": options})
    check_parameters({"annotation": params["annotation"]})


def test_all_problems_of_all_groups_come_in_one_error(conf_params):
    params = _set(conf_params, "tapo.bogus_top", 1)
    params = _set(params, "tapo.grpo.steps", "abc")
    params = _set(params, "annotation.items.n_itmes", 3)
    with pytest.raises(ConfigError) as error:
        check_parameters({g: params[g] for g in ("tapo", "annotation")})
    lines = str(error.value).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == [
        "tapo",
        "tapo.grpo.steps",
        "annotation.items",
    ]


def test_a_group_without_a_schema_is_reported():
    with pytest.raises(ConfigError, match="newgroup: no schema"):
        check_parameters({"newgroup": {}})


def test_unknown_keys_message_suggests_only_close_keys():
    assert unknown_keys_message(["sedd", "zzz"], ["seed", "steps"]) == (
        "unknown keys `sedd` (did you mean `seed`?), `zzz`; valid keys: seed, steps"
    )


@dataclass
class _Config:
    steps: int
    names: tuple[str, ...] = ("a",)
    rate: float = 0.1
    extra: dict = field(default_factory=dict)
    RENAMED: ClassVar[dict[str, str]] = {"n": "steps"}


def _check(values: dict) -> None:
    if values.get("steps", 1) > 100:
        raise ConfigError("steps must be <= 100")


def test_dataclass_block_takes_fields_types_defaults_renames_and_checks():
    block = dataclass_block(_Config, check=_check)
    assert problems("g", {"steps": 3, "names": ["x", "y"], "rate": 1}, block) == []
    assert problems("g", {}, block) == ["g.steps: missing: set it in parameters"]
    assert problems("g", {"n": 3}, block) == [
        "g: `n` is now `steps`: move the setting in your parameters",
        "g.steps: missing: set it in parameters",
    ]
    assert problems("g", {"steps": 300}, block) == ["g: steps must be <= 100"]
    assert problems("g", {"steps": 3, "names": "xy"}, block)[0].startswith("g.names: input")
    partial = dataclass_block(_Config, partial=True, check=_check)
    assert problems("g", {}, partial) == [] and problems("g", {"rate": 2}, partial) == []
    with pytest.raises(ConfigError, match="g.rate: input should be a valid number"):
        check_group("g", {"rate": "fast"}, partial)


def test_signature_block_is_the_keyword_options_of_a_function():
    def sessions(ratings, items, n: int = 3, *, cuts: tuple[float, float] = (0.3, 0.6)):
        return ratings

    block = signature_block(sessions, taken=("ratings", "items"))
    assert problems("s", {"n": 4, "cuts": [0.2, 0.5]}, block) == []
    assert problems("s", {"ratings": 1}, block) == ["s: unknown key `ratings`; valid keys: cuts, n"]


@pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")
def test_a_session_run_with_a_misspelt_key_fails_before_its_first_node(
    project_root: Path, tmp_path: Path, monkeypatch
):
    copy_project(project_root, tmp_path, monkeypatch)
    counter = NodeCounter()
    overrides = {"tapo": {"tasks": {"n_train_per_langauge": 3}}, "annotation": {"bogus": 1}}
    with KedroSession.create(project_path=tmp_path, runtime_params=overrides) as session:
        session._hook_manager.register(counter)
        with pytest.raises(ConfigError, match=r"tapo.tasks: unknown key `n_train_per_langauge`"):
            session.run(pipeline_names=["tapo"])
    assert counter.started == []
    assert not (tmp_path / "data").exists() or not any(
        p.is_file() and "run_manifests" not in str(p) for p in (tmp_path / "data").rglob("*")
    )


def test_page_grpo_strategies_are_asked_before_the_first_node_only(conf_params):
    # The strategies are torch modules: the --params check (no torch) leaves an unknown one to
    # the check before the first node, which names it.
    params = _set(conf_params, "reranker_grpo.grpo.advantage", {"name": "grpoo"})
    check_parameters({"reranker_grpo": params["reranker_grpo"]})
    with pytest.raises(
        ConfigError, match=r"reranker_grpo.grpo: unknown advantage strategy 'grpoo'"
    ):
        check_parameters(
            {"reranker_grpo": params["reranker_grpo"]}, validate_strategies=validate_strategies
        )


@pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")
def test_a_session_run_with_an_unknown_page_grpo_strategy_fails_before_its_first_node(
    project_root: Path, tmp_path: Path, monkeypatch
):
    copy_project(project_root, tmp_path, monkeypatch)
    counter = NodeCounter()
    overrides = {"reranker_grpo": {"grpo": {"advantage": {"name": "grpoo"}}}}
    with KedroSession.create(project_path=tmp_path, runtime_params=overrides) as session:
        session._hook_manager.register(counter)
        with pytest.raises(ConfigError, match=r"unknown advantage strategy 'grpoo'"):
            session.run(pipeline_names=["reranker_grpo"])
    assert counter.started == []


def test_the_chain_groups_are_the_chain_schemas():
    assert set(CHAIN_SCHEMAS) == CHAIN_GROUPS
    assert set(all_schemas()) == GROUPS and None not in all_schemas().values()
