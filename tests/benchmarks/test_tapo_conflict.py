"""benchmarks/tapo_conflict.py: seeds.py's per-seed tables of several batches pooled per
variant, gains and differences to grpo_sum as t intervals over every run."""

import importlib.util
import sys
from pathlib import Path

import pandas as pd

from creditflow.reporting.stats import t_interval

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tapo_conflict.py"
spec = importlib.util.spec_from_file_location("bench_tapo_conflict", SCRIPT)
tapo_conflict = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = tapo_conflict
spec.loader.exec_module(tapo_conflict)


def _per_seed(gains: dict[str, list[float]], seeds: list[int]) -> pd.DataFrame:
    rows = [{"policy": "sft", "seed": None, "eval_reward_seen": 0.5}]
    for policy, values in gains.items():
        for seed, gain in zip(seeds, values, strict=True):
            rows.append(
                {
                    "policy": policy,
                    "seed": seed,
                    "eval_reward_seen": 0.5 + gain,
                    "eval_reward_gain_seen": gain,
                    "train_sign_conflict_rate": 0.1 + gain,
                }
            )
    frame = pd.DataFrame(rows)
    return frame.assign(sampled_chrf_seen=0.4, sampled_accuracy_seen=0.1)


def test_batches_pool_into_one_interval_paired_by_run(tmp_path):
    # Two batches whose seed numbers repeat (0, 1 in each): runs pair by (batch, seed).
    _per_seed({"grpo_sum": [0.01, 0.03], "tapo": [0.02, 0.05]}, [0, 1]).to_csv(
        tmp_path / "conflict_tapo_per_seed.csv", index=False
    )
    _per_seed({"grpo_sum": [0.02, 0.00], "tapo": [0.02, 0.04]}, [0, 1]).to_csv(
        tmp_path / "conflict_b_tapo_per_seed.csv", index=False
    )
    table = tapo_conflict.conflict_table(tmp_path, ["conflict"])
    rows = {line.split(" | ")[1]: line for line in table.splitlines()[2:]}
    assert set(rows) == {"sft (warm start)", "grpo_sum", "tapo"}
    # tapo - grpo_sum per run: b 0.00, 0.04; main 0.01, 0.02 (files sorted by name).
    mean, _, low, high = t_interval([0.00, 0.04, 0.01, 0.02])
    assert f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]" in rows["tapo"]
    assert " | 4 | " in rows["tapo"]
    mean, _, low, high = t_interval([0.02, 0.00, 0.01, 0.03])
    assert f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] | - |" in rows["grpo_sum"]
