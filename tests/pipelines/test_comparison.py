"""The per-strategy comparisons are modular pipelines: one namespace per strategy of YAML."""

from pathlib import Path

import pandas as pd
import pytest
import yaml
from kedro.config import OmegaConfigLoader
from kedro.io import DataCatalog, MemoryDataset

from creditflow.errors import ConfigError
from creditflow.hooks.parameter_check import ParameterCheckHook
from creditflow.pipelines import tapo, tor
from creditflow.pipelines.comparison import configured_strategies, labelled_tables
from creditflow.pipelines.parameter_blocks import StrategyComparison, check_baseline
from tests.pipelines._params import deep_update

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")


@pytest.mark.parametrize(("group", "module"), [("tapo", tapo), ("tor", tor)])
def test_every_configured_strategy_is_a_namespace_with_train_and_evaluate(group, module):
    strategies = configured_strategies(group)
    pipeline = module.create_pipeline()
    namespaces = {n.namespace for n in pipeline.nodes} - {None}
    assert namespaces == set(strategies)
    for name in strategies:
        nodes = pipeline.only_nodes_with_namespaces([name]).nodes
        assert sorted(n.name for n in nodes) == [
            f"{name}.evaluate_{group}_policy",
            f"{name}.train_{group}_policy",
        ]
        # Stable dataset names: the catalog patterns and the docs keep working.
        outputs = set().union(*(n.outputs for n in nodes))
        assert f"{group}_policies_{name}" in outputs and f"{group}_results_{name}" in outputs
        assert f"params:{group}.strategies.{name}" in pipeline.inputs()


def test_a_strategy_added_only_in_yaml_joins_the_comparison(tmp_path: Path, project_root: Path):
    conf = tmp_path / "conf"
    (conf / "base").mkdir(parents=True)
    (conf / "local").mkdir()
    params = yaml.safe_load((project_root / "conf/base/parameters_tapo.yml").read_text())
    params["tapo"]["strategies"]["tapo_alpha_08"] = {
        "advantage": {"name": "tapo", "alpha": 0.8},
        "rewards": {"translation": 1.0, "reasoning": 1.0},
    }
    (conf / "base" / "parameters_tapo.yml").write_text(yaml.safe_dump(params))
    strategies = configured_strategies("tapo", conf_source=conf)
    assert strategies[-1] == "tapo_alpha_08"
    pipeline = tapo.create_pipeline(strategies)
    assert "tapo_alpha_08.train_tapo_policy" in {n.name for n in pipeline.nodes}
    compare = next(n for n in pipeline.nodes if n.name == "compare_tapo_strategies")
    assert "tapo_results_tapo_alpha_08" in compare.inputs


def test_a_strategy_the_pipeline_lacks_fails_the_comparison_loudly():
    table = pd.DataFrame({"seed": [0], "x": [1.0]})
    tables = {"results/grpo_sum": table, "metrics/grpo_sum": table}
    evaluations, metrics = labelled_tables({"grpo_sum": {}}, table.drop(columns="seed"), tables)
    assert evaluations["policy"].tolist() == ["sft", "grpo_sum"]
    assert evaluations["seed"].isna().tolist() == [True, False]  # the warm start has no seed
    assert metrics["strategy"].tolist() == ["grpo_sum"]
    with pytest.raises(ValueError, match=r"\['extra'\] are in the parameters but not in the"):
        labelled_tables({"grpo_sum": {}, "extra": {}}, table, tables)
    # Tables saved before the comparisons had seeds fail, naming them.
    old = {**tables, "results/grpo_sum": table.drop(columns="seed")}
    with pytest.raises(ValueError, match=r"\['results/grpo_sum'\] have no 'seed' column"):
        labelled_tables({"grpo_sum": {}}, table, old)


@pytest.mark.parametrize(
    ("yaml_text", "match"),
    [
        ("tapo: {seed: 0}\n", "no strategies under tapo.strategies"),
        ("tapo: {strategies: {alpha.8: {}}}\n", r"\['alpha.8'\] .* cannot be Kedro namespaces"),
    ],
)
def test_no_or_badly_named_strategies_are_clear_errors(tmp_path: Path, yaml_text, match):
    (tmp_path / "base").mkdir()
    (tmp_path / "local").mkdir()
    (tmp_path / "base" / "parameters_tapo.yml").write_text(yaml_text)
    with pytest.raises(ValueError, match=match):
        configured_strategies("tapo", conf_source=tmp_path)


def _project_params(project_root: Path, group: str) -> dict:
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    return loader["parameters"][group]


def test_a_strategy_added_after_the_pipeline_was_built_fails_before_the_first_node(
    project_root: Path,
):
    pipeline = tapo.create_pipeline()
    params = _project_params(project_root, "tapo")
    catalog = DataCatalog({"params:tapo": MemoryDataset(params)})
    ParameterCheckHook().before_pipeline_run(pipeline, catalog)  # all built: passes
    params["strategies"]["extra"] = {}  # as --params tapo.strategies.extra... would add it
    catalog = DataCatalog({"params:tapo": MemoryDataset(params)})
    with pytest.raises(ValueError, match=r"\['extra'\] are in the parameters but not in the"):
        ParameterCheckHook().before_pipeline_run(pipeline, catalog)
    # A run of one namespace has no comparison node: nothing to check.
    ParameterCheckHook().before_pipeline_run(pipeline.only_nodes_with_namespaces(["tapo"]), catalog)
    # Pipelines without a comparison (or without the parameters) are left alone.
    ParameterCheckHook().before_pipeline_run(pipeline, DataCatalog({}))


def test_sft_is_not_a_strategy_name(tmp_path: Path):
    (tmp_path / "base").mkdir()
    (tmp_path / "local").mkdir()
    (tmp_path / "base" / "parameters_tor.yml").write_text("tor: {strategies: {sft: {}}}\n")
    with pytest.raises(ValueError, match="may not define 'sft'"):
        configured_strategies("tor", conf_source=tmp_path)


@pytest.mark.parametrize(
    ("group", "override", "message"),
    [
        ("tapo", {"grpo": {"stpes": 5}}, r"tapo.grpo: unknown key `stpes` \(did you mean `steps`"),
        (
            "tapo",
            {"strategies": {"tapo": {"advantage": {"alpah": 0.3}}}},
            r"tapo.strategies.tapo .*unknown \['alpah'\] \(did you mean 'alpha' for 'alpah'\?\)",
        ),
        ("tapo", {"grpo": {"steps": "abc"}}, r"tapo.grpo.steps: .*valid integer, got 'abc'"),
        ("tapo", {"grpo": {"group_size": 2.5}}, r"tapo.grpo.group_size: .*integer, got 2.5"),
        ("tapo", {"sft": {"stpes": 5}}, r"tapo.sft: unknown key `stpes`"),
        ("tapo", {"grpo": {"minibatch_size": 7}}, r"tapo.strategies.grpo_sum .*must divide"),
        ("tor", {"strategies": {"tor": {"token_weights": {"alpha_p": 2}}}}, "alpha_p must be in"),
    ],
)
def test_a_broken_strategy_config_fails_before_the_first_node(
    project_root: Path, group, override, message
):
    module = {"tapo": tapo, "tor": tor}[group]
    params = deep_update(_project_params(project_root, group), override)
    catalog = DataCatalog({f"params:{group}": MemoryDataset(params)})
    with pytest.raises(ConfigError, match=message):
        ParameterCheckHook().before_pipeline_run(module.create_pipeline(), catalog)


def test_a_strategy_needing_the_image_pass_runs_only_where_the_policy_has_one(project_root):
    # The tor pipeline's train nodes say their policy is vision-language (a tag the parameter
    # check reads); the tapo pipeline's text policy has no no-image pass for ToR to call.
    from creditflow.pipelines.comparison import IMAGE_PASS_TAG  # noqa: PLC0415

    assert all(
        IMAGE_PASS_TAG in n.tags
        for n in tor.create_pipeline().nodes
        if n.name.endswith("_policy") and n.name.split(".")[-1].startswith("train_")
    )
    assert not any(IMAGE_PASS_TAG in n.tags for n in tapo.create_pipeline().nodes)
    params = _project_params(project_root, "tapo")
    params["strategies"]["tapo"]["token_weights"] = {"name": "tor"}
    catalog = DataCatalog({"params:tapo": MemoryDataset(params)})
    with pytest.raises(ConfigError, match=r"tapo.strategies.tapo .*the tapo pipeline's policy"):
        ParameterCheckHook().before_pipeline_run(tapo.create_pipeline(), catalog)


def test_an_environment_leaves_a_base_strategy_out_by_setting_it_to_null(tmp_path: Path):
    (tmp_path / "base").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "local").mkdir()
    base = {"grpo": {"strategies": {"grpo": {"advantage": {"name": "grpo"}}, "dr_grpo": {}}}}
    (tmp_path / "base" / "parameters_grpo.yml").write_text(yaml.safe_dump(base, sort_keys=False))
    (tmp_path / "bench" / "parameters_grpo.yml").write_text(
        "grpo:\n  strategies:\n    dr_grpo: null\n"
    )
    assert configured_strategies("grpo", conf_source=tmp_path) == ["grpo", "dr_grpo"]
    assert configured_strategies("grpo", conf_source=tmp_path, env="bench") == ["grpo"]
    # The left-out strategy's tables are not expected in the comparison.
    table = pd.DataFrame({"seed": [0], "x": [1.0]})
    tables = {"results/grpo": table, "metrics/grpo": table}
    evaluations, _ = labelled_tables({"grpo": {}, "dr_grpo": None}, table, tables)
    assert evaluations["policy"].tolist() == ["sft", "grpo"]
    # Nor may it be the baseline.
    with pytest.raises(ValueError, match="baseline 'dr_grpo' is not a strategy; valid: grpo"):
        check_baseline(
            "grpo", StrategyComparison(n_seeds=1, baseline="dr_grpo"), {"grpo": {}, "dr_grpo": None}
        )
