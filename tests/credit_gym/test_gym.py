"""The gym on the shipped strategies: the oracle positive control recovers credit (AUC 1) and
learns faster than uniform GRPO; shuffled advantages recover nothing and do not learn; a
plugin strategy named by import path runs in the sweep."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from creditflow.reporting.credit_gym import claim_cards, dose_response
from creditflow.tasks.credit_gym import GymKnobs
from creditflow.training.gym import GymSetup, run_strategy, run_sweep

SETUP = GymSetup(
    grpo={"steps": 30, "prompts_per_step": 8, "group_size": 8, "learning_rate": 0.05,
          "warmup_steps": 0},
)  # fmt: skip
KNOBS = GymKnobs(decisive_fraction=0.2, conflict=0.25, perception=0.5, fork_entropy=0.5)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SPECS = {
    "oracle": {"oracle": True},
    "grpo": {},
    "shuffled": {"advantage": {"name": "shuffled_advantages"}},
}


@functools.cache
def _runs(name: str) -> tuple[dict, ...]:
    """Seeds 0-2 of ``SPECS[name]`` (each run once per test process)."""
    return tuple(run_strategy(SETUP, KNOBS, seed, name, SPECS[name]) for seed in (0, 1, 2))


def test_oracle_recovers_credit_and_learns_faster_than_uniform():
    oracle, uniform = _runs("oracle"), _runs("grpo")
    assert all(r["recovery/auc@first"] == 1.0 for r in oracle)
    assert all(r["recovery/auc@first"] == 0.5 for r in uniform)  # one advantage per completion
    # Pooled over completions, the oracle's credit ranks tokens better than GRPO's.
    for o, u in zip(oracle, uniform, strict=True):
        assert o["recovery/pooled_spearman@first"] > u["recovery/pooled_spearman@first"]
    gains = [o["final_reward"] - u["final_reward"] for o, u in zip(oracle, uniform, strict=True)]
    assert min(gains) > 0, gains


def test_shuffled_advantages_recover_nothing():
    shuffled, uniform = _runs("shuffled"), _runs("grpo")
    for row, grpo in zip(shuffled, uniform, strict=True):
        # Within a completion any one advantage ranks nothing (GRPO's too) ...
        assert row["recovery/auc@first"] == 0.5
        assert abs(row["recovery/spearman@first"]) < 1e-12
        # ... across completions GRPO's points the way of the oracle credit, a shuffled
        # advantage does not.
        for at in ("first", "middle", "last"):
            assert abs(row[f"recovery/pooled_spearman@{at}"]) < 0.05, row
            assert grpo[f"recovery/pooled_spearman@{at}"] > 0.08, grpo
    # credit unrelated to reward does not raise the expected reward
    assert np.mean([r["gain"] for r in shuffled]) < 0.02


def test_a_plugin_strategy_joins_the_sweep_and_gets_its_curve():
    strategies = {
        "grpo": {},
        "mine": {"token_weights": {"name": "tests.credit_gym.plugin_weights:second_half"}},
    }
    setup = GymSetup(grpo={**SETUP.grpo, "steps": 4})
    rows = run_sweep(setup, KNOBS, {"conflict": [0.0, 0.5]}, strategies, [0, 1], progress=False)
    table = dose_response(__import__("pandas").DataFrame(rows), "grpo")
    mine = table[(table["strategy"] == "mine") & (table["metric"] == "final_reward")]
    assert sorted(mine["dose"]) == [0.0, 0.5]
    assert mine["diff_mean"].notna().all()
    cards = claim_cards(__import__("pandas").DataFrame(rows), KNOBS.__dict__)
    assert set(cards["verdict"]) == {
        "not run: a strategy or knob of the card is absent from the sweep"
    }
