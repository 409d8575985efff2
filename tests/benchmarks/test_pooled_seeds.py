"""benchmarks/pooled_seeds.py: seeds.py's tor per-seed tables of several batches (one warm start,
different GRPO seeds) pooled, gains and differences to uniform as t intervals over seeds."""

import doctest
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from creditflow.reporting.stats import t_interval

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "pooled_seeds.py"
spec = importlib.util.spec_from_file_location("bench_pooled_seeds", SCRIPT)
pooled_seeds = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = pooled_seeds
spec.loader.exec_module(pooled_seeds)


def _per_seed(accuracy: dict[str, list[float]], seeds: list[int], sft: float = 0.4):
    rows = [{"policy": "sft", "seed": None, "accuracy_synthetic": sft}]
    for policy, values in accuracy.items():
        for seed, value in zip(seeds, values, strict=True):
            rows.append(
                {
                    "policy": policy,
                    "seed": seed,
                    "accuracy_synthetic": value,
                    "train_reward_first": 0.3,
                    "train_reward_last": 0.35,
                }
            )
    return pd.DataFrame(rows)


def cell(values: list[float]) -> str:
    """The expected cell: the interval and, for a null, (t(0.975) + t(0.8)) * se."""
    mean, se, low, high = t_interval(values)
    text = f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"
    if low <= 0 <= high:
        df = len(values) - 1
        mde = (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * se
        text += f" not detectable (MDE {mde:.3f})"
    return text


def test_batches_pool_into_one_interval_paired_by_seed(tmp_path):
    _per_seed({"tor": [0.43, 0.44], "uniform": [0.42, 0.45]}, [0, 1]).to_csv(
        tmp_path / "a_tor_per_seed.csv", index=False
    )
    _per_seed({"uniform": [0.41], "tor": [0.45]}, [2]).to_csv(
        tmp_path / "b_tor_per_seed.csv", index=False
    )
    table = pooled_seeds.pooled_table(pooled_seeds.pooled_per_seed(tmp_path))
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert list(rows) == ["sft", "uniform", "tor"]  # the baseline first
    # gains over sft 0.4: uniform 0.02, 0.05, 0.01; tor 0.03, 0.04, 0.05;
    # tor - uniform by seed: 0.01, -0.01, 0.04.
    assert f"| 3 | 0.427 | {cell([0.02, 0.05, 0.01])} | - | 0.300 / 0.350 |" in rows["uniform"]
    assert (
        f"| 3 | 0.440 | {cell([0.03, 0.04, 0.05])} | {cell([0.01, -0.01, 0.04])} |" in rows["tor"]
    )
    assert "| sft | - | 0.400 |" in rows["sft"]


def test_different_warm_starts_or_repeated_seeds_are_refused(tmp_path):
    _per_seed({"uniform": [0.42]}, [0]).to_csv(tmp_path / "a_tor_per_seed.csv", index=False)
    _per_seed({"uniform": [0.42]}, [1], sft=0.38).to_csv(
        tmp_path / "b_tor_per_seed.csv", index=False
    )
    with pytest.raises(ValueError, match="warm starts differ"):
        pooled_seeds.pooled_table(pooled_seeds.pooled_per_seed(tmp_path))
    _per_seed({"uniform": [0.42]}, [0]).to_csv(tmp_path / "b_tor_per_seed.csv", index=False)
    with pytest.raises(ValueError, match=r"seeds \[0\] occur in several batches"):
        pooled_seeds.pooled_table(pooled_seeds.pooled_per_seed(tmp_path))
    with pytest.raises(FileNotFoundError, match="run seeds.py --out"):
        pooled_seeds.pooled_per_seed(tmp_path / "missing")


def test_the_sampled_accuracy_is_pooled_beside_the_greedy_one(tmp_path):
    per_seed = _per_seed({"uniform": [0.42, 0.45], "tor": [0.43, 0.44]}, [0, 1])
    sampled = {"sft": 0.30, "uniform": [0.33, 0.35], "tor": [0.32, 0.36]}
    per_seed["sampled_accuracy_synthetic"] = [
        sampled["sft"],
        *sampled["uniform"],
        *sampled["tor"],
    ]
    per_seed.to_csv(tmp_path / "a_tor_per_seed.csv", index=False)
    table = pooled_seeds.pooled_table(pooled_seeds.pooled_per_seed(tmp_path))
    lines = table.splitlines()
    assert lines[0].startswith("| policy | n seeds | greedy accuracy |")
    assert "| sampled accuracy | gain over sft [95 % CI] | vs uniform [95 % CI] |" in lines[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    assert "| sft | - | 0.400 | - | - | 0.300 | - | - | - |" == rows["sft"]
    # sampled: uniform gains 0.03, 0.05; tor 0.02, 0.06, tor - uniform -0.01, +0.01.
    assert f"| 0.340 | {cell([0.03, 0.05])} | - |" in rows["uniform"]
    assert f"| 0.340 | {cell([0.02, 0.06])} | {cell([-0.01, 0.01])} |" in rows["tor"]


def test_tapo_batches_pool_against_grpo_sum_on_both_language_sets(tmp_path):
    for name, seeds, values in (("a", [0, 1], [0.70, 0.72]), ("b", [2], [0.71])):
        rows = [
            {"policy": "sft", "seed": None, "eval_reward_seen": 0.68, "eval_reward_unseen": 0.3}
        ]
        for policy, shift in (("grpo_sum", 0.0), ("dapo", 0.01)):
            rows += [
                {
                    "policy": policy,
                    "seed": seed,
                    "eval_reward_seen": value + shift,
                    "eval_reward_unseen": 0.3,
                    "train_reward_first": 0.8,
                    "train_reward_last": 0.9,
                }
                for seed, value in zip(seeds, values, strict=True)
            ]
        pd.DataFrame(rows).to_csv(tmp_path / f"{name}_tapo_per_seed.csv", index=False)
    table = pooled_seeds.pooled_table(pooled_seeds.pooled_per_seed(tmp_path, "tapo"), "tapo")
    lines = table.splitlines()
    assert lines[0].startswith("| policy | n seeds | eval reward seen | gain over sft [95 % CI] |")
    assert "| vs grpo_sum [95 % CI] | eval reward unseen |" in lines[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    assert list(rows) == ["sft", "grpo_sum", "dapo"]
    # dapo - grpo_sum is +0.01 in every seed: a zero-width interval above 0.
    assert "| 3 | 0.720 | " in rows["dapo"] and "+0.010 [+0.010, +0.010]" in rows["dapo"]
    with pytest.raises(FileNotFoundError, match="_tor_per_seed.csv"):
        pooled_seeds.pooled_per_seed(tmp_path, "tor")


def test_doctests():
    assert doctest.testmod(pooled_seeds).failed == 0
