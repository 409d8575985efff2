"""GDPO's advantage (algorithms.decoupled_group_advantages, the ``gdpo`` strategy): a
hand-computed case, and TRL's own ``normalize_then_sum`` branch (TRL 1.16, the ``bench``
extra), read from its source and run on the same rewards, in float64."""

import inspect
import re
import textwrap
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from creditflow.algorithms import decoupled_group_advantages, group_zscore
from creditflow.errors import ConfigError
from creditflow.testing import check_advantage_strategy
from creditflow.training.grpo_runs import build_grpo_config, check_distributed


def test_a_hand_computed_case():
    # One group of 3, two rewards of weight 1 and 2. Reward a: [1, 0, 0] -> mean 1/3, std
    # sqrt(1/3) -> z = [2, -1, -1] / sqrt(3); reward b: [0, 1, 1] -> z = [-2, 1, 1] / sqrt(3).
    # Sum a + 2b = [-2, 1, 1] / sqrt(3) (before the batch z-score).
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    weights = torch.tensor([1.0, 2.0], dtype=torch.float64)
    expected = torch.tensor([-2.0, 1.0, 1.0], dtype=torch.float64) / 3**0.5
    got = decoupled_group_advantages(rewards, weights, 3, eps=0.0, batch_scale=False)
    assert_close(got, expected)
    # Its batch z-score: mean 0, unbiased std sqrt((4 + 1 + 1) / 3 / 2) = 1, so unchanged.
    got = decoupled_group_advantages(rewards, weights, 3, eps=0.0)
    assert_close(got, expected)
    # Scaled rewards give the same advantages: each reward is normalised on its own.
    scaled = rewards * torch.tensor([10.0, 0.1], dtype=torch.float64)
    assert_close(decoupled_group_advantages(scaled, weights, 3, eps=0.0), expected)


def test_one_reward_without_batch_scale_is_grpos_group_zscore():
    rewards = torch.tensor([[0.2], [0.9], [0.4], [0.4], [1.0], [0.0]], dtype=torch.float64)
    got = decoupled_group_advantages(rewards, torch.tensor([1.0]), 2, batch_scale=False)
    assert_close(got, group_zscore(rewards[:, 0], 2, eps=1e-4))


def test_a_reward_constant_in_a_group_adds_nothing_there():
    rewards = torch.tensor([[1.0, 0.3], [1.0, 0.7], [0.0, 0.5], [1.0, 0.5]])
    got = decoupled_group_advantages(rewards, torch.ones(2), 2, batch_scale=False)
    only_b = decoupled_group_advantages(rewards[:, 1:], torch.ones(1), 2, batch_scale=False)
    only_a = decoupled_group_advantages(rewards[:, :1], torch.ones(1), 2, batch_scale=False)
    assert_close(got[:2], only_b[:2])  # group 1: a is constant
    assert_close(got[2:], only_a[2:])  # group 2: b is constant


def _trl_normalize_then_sum():
    """TRL's ``normalize_then_sum`` branch of ``GRPOTrainer._generate_and_score_completions``,
    as its source stands, as a function of the rewards."""
    trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    source = inspect.getsource(trainer.GRPOTrainer._generate_and_score_completions)
    branch = re.search(
        r'elif self\.multi_objective_aggregation == "normalize_then_sum":\n(.*?)\n\s+else:',
        source,
        re.DOTALL,
    )
    assert branch, "TRL's normalize_then_sum branch moved: re-read it"
    body = textwrap.dedent(branch.group(1))

    def advantages(rewards_per_func, weights, num_generations):
        scope = {
            "torch": torch,
            "nanstd": trainer.nanstd,
            "rewards_per_func": rewards_per_func,
            "num_generations": num_generations,
            "device": rewards_per_func.device,
            "unscorable_mask": torch.isnan(rewards_per_func).all(dim=1),
            "self": SimpleNamespace(
                reward_funcs=[None] * rewards_per_func.shape[1], reward_weights=weights
            ),
        }
        exec(body, scope)  # noqa: S102 - TRL's own lines, to check against them
        return scope["advantages"]

    return advantages


@pytest.mark.parametrize("seed", range(4))
def test_gdpo_is_trls_normalize_then_sum(seed):
    trl_advantages = _trl_normalize_then_sum()
    gen = torch.Generator().manual_seed(seed)
    G, K = 4, 3
    rewards = torch.rand(5 * G, K, generator=gen, dtype=torch.float64)
    rewards[:G, 0] = 1.0  # a reward constant in one group
    rewards[G : 2 * G] = (rewards[G : 2 * G] > 0.5).double()  # binary rewards
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    expected = trl_advantages(rewards, weights, G)
    # TRL's nanstd computes Bessel's factor count / (count - 1) in float32, so its float64
    # result carries that factor's rounding (about 2e-8, relative).
    assert_close(decoupled_group_advantages(rewards, weights, G), expected, atol=0, rtol=1e-7)


def test_the_strategy_and_its_batch_statistics_are_checked_before_training():
    rewards = ["format", "reasoning"]
    config = build_grpo_config(
        {"advantage": {"name": "gdpo"}, "rewards": {"format": 1.0, "reasoning": 1.0}}, rewards
    )
    with pytest.raises(ConfigError, match="normalises over the whole batch"):
        check_distributed({"num_processes": 2}, config)
    per_group = build_grpo_config(
        {"advantage": {"name": "gdpo", "batch_scale": False}, "rewards": {"reasoning": 1.0}},
        rewards,
    )
    check_distributed({"num_processes": 2}, per_group)  # group statistics only: allowed
    with pytest.raises(ConfigError, match="batch_scale must be true or false"):
        build_grpo_config({"advantage": {"name": "gdpo", "batch_scale": 1}}, rewards)


def test_without_the_batch_z_score_it_keeps_the_whole_strategy_contract():
    # group statistics only: the same on any split of the batch into whole groups
    check_advantage_strategy("gdpo", {"name": "gdpo", "batch_scale": False})
