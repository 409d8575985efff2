"""The leaderboard (creditflow.reporting.leaderboard, reporting.robust, benchmarks/leaderboard.py)
on hand-made per-seed tables: the robust aggregates against direct computations, the paired
gains against hand-computed ones, the default point read once, and the script end to end."""

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import mannwhitneyu, trim_mean

from creditflow.reporting.leaderboard import KNOBS, gym_leaderboard, gym_scores, markdown
from creditflow.reporting.robust import (
    interquartile_mean,
    probability_of_improvement,
    stratified_bootstrap,
)
from creditflow.tasks.credit_gym import GymKnobs

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = {"decisive_fraction": 0.2, "conflict": 0.25, "perception": 0.5, "fork_entropy": 0.5,
            "noise": 0.0}  # fmt: skip


def _gym_table(shift: dict[str, float], seeds: int = 4) -> pd.DataFrame:
    """A two-knob sweep (conflict 0, 0.25, 0.5; noise 0, 0.25) whose default point appears
    under both knobs; final_reward = 0.4 + the strategy's shift + seed noise."""
    rng = np.random.default_rng(0)
    rows = []
    for knob, doses in {"conflict": [0.0, 0.25, 0.5], "noise": [0.0, 0.25]}.items():
        for dose in doses:
            point = {**DEFAULTS, knob: dose}
            for seed in range(seeds):
                noise = rng.normal(0, 0.01)
                for strategy, delta in shift.items():
                    rows.append(
                        {
                            "knob": knob,
                            "dose": dose,
                            "strategy": strategy,
                            "seed": seed,
                            **point,
                            "final_reward": 0.4 + delta + noise + 0.01 * seed,
                            "recovery/auc@first": 0.5 + delta,
                            "recovery/pooled_spearman@first": delta,
                        }  # fmt: skip
                    )
    return pd.DataFrame(rows)


def test_the_robust_aggregates_equal_their_definitions():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(7, 3)), rng.normal(size=(5, 3))
    assert interquartile_mean(x) == pytest.approx(trim_mean(x.ravel(), 0.25))
    by_task = [mannwhitneyu(x[:, t], y[:, t]).statistic / (7 * 5) for t in range(3)]
    assert probability_of_improvement(x, y) == pytest.approx(np.mean(by_task))
    point, low, high = stratified_bootstrap(interquartile_mean, x, reps=500)
    assert low <= point <= high and low < high
    assert stratified_bootstrap(interquartile_mean, x, reps=500) == (point, low, high)  # seeded


def test_the_default_point_counts_once_and_the_gains_pair_by_seed():
    table = _gym_table({"grpo": 0.0, "better": 0.05, "worse": -0.05})
    scores = gym_scores(table)
    assert scores["grpo"].shape == (4, 4)  # 5 (knob, dose) rows, 4 distinct worlds
    board = gym_leaderboard(table, DEFAULTS, reps=300).set_index("method")
    # The seed noise is shared by the strategies: every paired difference is the shift.
    assert board.loc["better", "gain"] == pytest.approx(0.05)
    assert board.loc["worse", "gain"] == pytest.approx(-0.05)
    assert board.loc["better", "p_improve"] > 0.5 > board.loc["worse", "p_improve"]
    assert board.loc["better", "recovery_auc"] == pytest.approx(0.55)
    assert np.isnan(board.loc["grpo", "gain"])
    assert "| credit_gym | better | 4 |" in markdown(board.reset_index())


def test_the_script_writes_the_board(tmp_path):
    gym = tmp_path / "gym.csv"
    _gym_table({"grpo": 0.0, "tapo": 0.02}).to_csv(gym, index=False)
    tapo = tmp_path / "tapo.csv"
    rows = [{"policy": "sft", "seed": None, "eval_reward_seen": 0.1}]
    for seed in range(3):
        rows += [
            {"policy": "grpo_sum", "seed": seed, "eval_reward_seen": 0.5 + 0.01 * seed},
            {"policy": "shuffled", "seed": seed, "eval_reward_seen": 0.4 + 0.02 * seed},
        ]
    pd.DataFrame(rows).to_csv(tapo, index=False)
    out = tmp_path / "board.md"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/leaderboard.py"), "--gym", str(gym),
         "--testbed", f"tapo={tapo}", "--reps", "200", "--out", str(out)],
        check=True, capture_output=True, cwd=ROOT,
    )  # fmt: skip
    board = pd.read_csv(out.with_suffix(".csv"))
    assert set(board["bench"]) == {"credit_gym", "tapo"}
    shuffled = board[(board["bench"] == "tapo") & (board["method"] == "shuffled")].iloc[0]
    assert shuffled["gain"] == pytest.approx(-0.09)  # -0.10, -0.09, -0.08 per seed
    assert "positive control" in shuffled["verdicts"]


def test_the_knobs_are_the_gyms():
    assert sorted(KNOBS) == sorted(field.name for field in fields(GymKnobs))
