"""benchmarks/seeds.py: its --params parsing and the markdown it writes; the run
itself is a KedroSession of the tapo / tor pipelines (tests/pipelines/test_seeds.py)."""

import doctest
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def seeds():
    spec = importlib.util.spec_from_file_location("bench_seeds", BENCHMARKS / "seeds.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_doctests(seeds):
    assert doctest.testmod(seeds).failed == 0


def test_params_merge_under_the_seed_count(seeds):
    extra = seeds.parse_params("tapo.grpo.steps=2,tapo.comparison.baseline=tapo")
    params = seeds.merged(extra, {"tapo": {"comparison": {"n_seeds": 5}}})
    assert params == {
        "tapo": {"grpo": {"steps": 2}, "comparison": {"baseline": "tapo", "n_seeds": 5}}
    }
    with pytest.raises(ValueError, match="not key=value"):
        seeds.parse_params("tapo.grpo.steps")


def test_the_markdown_shows_intervals_and_never_invents_one(seeds):
    table = pd.DataFrame(
        {
            "policy": ["sft", "uniform", "tor"],
            "n_seeds": [pd.NA, 5, 5],
            "ci_basis": [None, "seeds", "seeds"],
            "accuracy_synthetic": [0.1, 0.2, 0.25],
            "accuracy_gain_synthetic": [np.nan, 0.1, 0.15],
            "accuracy_gain_ci_low_synthetic": [np.nan, 0.05, np.nan],
            "accuracy_gain_ci_high_synthetic": [np.nan, 0.15, np.nan],
            "accuracy_vs_baseline_synthetic": [np.nan, np.nan, 0.05],
            "accuracy_vs_baseline_ci_low_synthetic": [np.nan, np.nan, -0.01],
            "accuracy_vs_baseline_ci_high_synthetic": [np.nan, np.nan, 0.11],
            "accuracy_tabmwp": [0.0, 0.0, 0.05],
        }
    )
    lines = seeds.markdown_table("tor", table).splitlines()
    assert lines[0].startswith("| policy | n_seeds | ci_basis | accuracy_synthetic |")
    assert lines[2] == "| sft |  |  | 0.100 | - | - | 0.000 |"
    assert lines[3] == "| uniform | 5 | seeds | 0.200 | +0.100 [+0.050, +0.150] | - | 0.000 |"
    assert (
        lines[4]
        == "| tor | 5 | seeds | 0.250 | +0.150 [no interval] | +0.050 [-0.010, +0.110] | 0.050 |"
    )


def test_the_tor_markdown_adds_the_sampled_accuracy_where_it_was_measured(seeds):
    table = pd.DataFrame(
        {
            "policy": ["sft", "uniform"],
            "n_seeds": [pd.NA, 5],
            "ci_basis": [None, "seeds"],
            "accuracy_synthetic": [0.5, 0.5],
            "accuracy_gain_synthetic": [np.nan, 0.0],
            "sampled_accuracy_synthetic": [0.4, 0.45],
            "sampled_accuracy_gain_synthetic": [np.nan, 0.05],
            "sampled_accuracy_gain_ci_low_synthetic": [np.nan, 0.02],
            "sampled_accuracy_gain_ci_high_synthetic": [np.nan, 0.08],
        }
    )
    lines = seeds.markdown_table("tor", table).splitlines()
    assert "| accuracy_synthetic | gain over sft, synthetic | vs baseline, synthetic | " in lines[0]
    assert "| sampled_accuracy_synthetic | gain over sft, synthetic |" in lines[0]
    assert lines[3] == (
        "| uniform | 5 | seeds | 0.500 | +0.000 [no interval] | - "
        "| 0.450 | +0.050 [+0.020, +0.080] | - |"
    )


def test_a_null_is_read_with_its_minimum_detectable_effect(seeds):
    row = pd.Series(
        {
            "accuracy_vs_baseline_synthetic": 0.002,
            "accuracy_vs_baseline_ci_low_synthetic": -0.010,
            "accuracy_vs_baseline_ci_high_synthetic": 0.014,
            "accuracy_vs_baseline_mde_synthetic": 0.0171,
            "accuracy_gain_synthetic": 0.03,
            "accuracy_gain_ci_low_synthetic": 0.01,
            "accuracy_gain_ci_high_synthetic": 0.05,
            "accuracy_gain_mde_synthetic": 0.02,
        }
    )
    assert (
        seeds.cell(row, "accuracy_vs_baseline_synthetic")
        == "+0.002 [-0.010, +0.014] not detectable (MDE 0.017)"
    )
    # an interval that excludes 0 is not a null: no MDE
    assert seeds.cell(row, "accuracy_gain_synthetic") == "+0.030 [+0.010, +0.050]"


def test_strategies_file_replaces_the_groups_strategies_in_the_scratch_copy(seeds, tmp_path):
    conf = tmp_path / "conf/base"
    conf.mkdir(parents=True)
    (conf / "parameters_tapo.yml").write_text(
        "tapo:\n  seed: 3\n  strategies:\n    grpo_sum: {advantage: {name: grpo}}\n"
        "    tapo: {advantage: {name: tapo}}\n"
    )
    seeds.replace_strategies(tmp_path, [BENCHMARKS / "conf/tapo_loss_types.yml"])
    written = yaml.safe_load((conf / "parameters_tapo.yml").read_text())
    assert written["tapo"]["seed"] == 3
    assert list(written["tapo"]["strategies"]) == ["grpo_sum", "dapo", "gspo"]
    assert written["tapo"]["strategies"]["gspo"]["loss_type"] == "gspo"
    assert written["tapo"]["comparison"]["baseline"] == "grpo_sum"
    bad = tmp_path / "bad.yml"
    bad.write_text("tpao: {x: {}}\n")
    with pytest.raises(SystemExit, match="tpao"):
        seeds.replace_strategies(tmp_path, [bad])


def test_several_strategies_files_join_in_order_and_a_clash_is_an_error(seeds, tmp_path):
    conf = tmp_path / "conf/base"
    conf.mkdir(parents=True)
    (conf / "parameters_tapo.yml").write_text("tapo:\n  strategies:\n    x: {}\n")
    files = [BENCHMARKS / "conf/tapo_loss_types.yml", BENCHMARKS / "conf/claims.yml"]
    # claims.yml also names tor strategies: left alone when only tapo runs
    seeds.replace_strategies(tmp_path, files, groups=["tapo"])
    written = yaml.safe_load((conf / "parameters_tapo.yml").read_text())
    assert list(written["tapo"]["strategies"]) == [
        "grpo_sum", "dapo", "gspo", "tapo", "shuffled", "high_entropy_20", "low_entropy_80"
    ]  # fmt: skip
    clash = tmp_path / "clash.yml"
    clash.write_text("tapo:\n  grpo_sum: {advantage: {name: tapo}}\n")
    with pytest.raises(SystemExit, match="grpo_sum is defined differently"):
        seeds.replace_strategies(tmp_path, [files[0], clash], groups=["tapo"])
