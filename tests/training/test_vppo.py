"""VPPO (creditflow.algorithms.vppo, training.strategies.vppo, docs/methods/vppo.md): a slow
loop written from the paper and the authors' description against the vectorised weights, hand
cases, the strategy contract (its batch-wide scale over two simulated processes), and a GRPO
step on the tiny Qwen2.5-VL."""

# The VL fixtures are imported from the rollout tests and requested by name as parameters.
# ruff: noqa: F811

import math

import pytest
import torch

from creditflow.algorithms import top_share_per_row, trajectory_scale, vppo_weights
from creditflow.errors import ConfigError
from creditflow.testing import check_token_weight_strategy
from creditflow.training import GRPOConfig, GRPOTrainer
from creditflow.training.grpo_runs import grpo_policy
from tests.rollout.test_vision_policy import (  # noqa: F401 - fixtures are found by name
    make_vl_model,
    tor_tasks,
    vl_processor,
    vl_prompts,
)
from tests.training.helpers import length_reward, make_trainer


def _reference(degraded, logp, mask, share, scaling_min):
    """Completion by completion, token by token."""
    B, T = logp.shape
    dep = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                d = min(max(float(degraded[b, t] - logp[b, t]), -20.0), 20.0)
                dep[b, t] = min(max(math.exp(d) - d - 1, 0.0), 10.0)
    scores = {b: float(dep[b].sum()) / int(mask[b].sum()) for b in range(B) if mask[b].sum()}
    low, high = min(scores.values()), max(scores.values())
    norm = {b: min(max((s - low) / (high - low), 0.0), 1.0) for b, s in scores.items()}
    top = scaling_min + (1 - scaling_min) / (sum(norm.values()) / len(norm) + 1e-8)
    weights = torch.zeros(B, T, dtype=torch.float64)
    for b in scores:
        valid = [t for t in range(T) if mask[b, t]]
        keep = math.ceil(share * len(valid))
        ranked = sorted(valid, key=lambda t: (-float(dep[b, t]), t))[:keep]
        for t in ranked:
            weights[b, t] = scaling_min + norm[b] * (top - scaling_min)
    return weights


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("share", [0.2, 0.5])
def test_equals_the_slow_reference_loop(seed, share):
    g = torch.Generator().manual_seed(seed)
    B, T = 8, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    degraded = logp + torch.randn(B, T, generator=g, dtype=torch.float64)
    weights, _ = vppo_weights(degraded, logp, mask, share, 0.8)
    torch.testing.assert_close(weights, _reference(degraded, logp, mask, share, 0.8))


def test_hand_cases():
    # ceil(0.2 * 3) = 1 token of three; a tie keeps the earlier position.
    chosen = top_share_per_row(torch.tensor([[0.5, 0.5, 0.1]]), torch.ones(1, 3), 0.2)
    assert chosen.tolist() == [[True, False, False]]
    # Scores 0, 0.5, 1 -> normalised the same, mean 0.5 -> scales 0.8, 1.0, 1.2 (mean 1).
    dep = torch.tensor([[0.0], [0.5], [1.0]])
    scale = trajectory_scale(dep, torch.ones(3, 1), 0.8)
    torch.testing.assert_close(scale, torch.tensor([0.8, 1.0, 1.2], dtype=torch.float64))
    # Scores that span nothing: every scale 1.
    assert trajectory_scale(torch.ones(2, 2), torch.ones(2, 2)).tolist() == [1.0, 1.0]


def test_vppo_keeps_the_strategy_contract():
    check_token_weight_strategy("vppo", {"name": "vppo", "token_share": 0.3})
    check_token_weight_strategy("vppo", {"name": "vppo", "shaping": False})


def test_a_vision_language_grpo_run_with_vppo(make_vl_model, vl_processor, vl_prompts):
    config = GRPOConfig.from_params(
        {"steps": 1, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6,
         "rewards": {"length": 1.0}, "warmup_steps": 0, "checkpoint_every": 0,
         "log_samples_every": 0, "token_weights": {"name": "vppo"}}
    )  # fmt: skip
    policy = grpo_policy(make_vl_model(), vl_processor, config)
    history = GRPOTrainer(policy, vl_prompts, length_reward, config, progress=False).train().history
    assert 0 < history[0]["weights/vppo_kept"] <= 0.5  # ceil(0.2 n) of each completion's n


def test_a_text_policy_is_refused_before_training(make_model, tapo_tokenizer, tapo_prompts):
    with pytest.raises(ConfigError, match="token_weights 'vppo' needs"):
        make_trainer(make_model(), tapo_tokenizer, tapo_prompts, token_weights={"name": "vppo"})
