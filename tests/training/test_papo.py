"""PAPO's implicit perception loss (creditflow.algorithms.papo, training.papo,
docs/methods/papo.md): the divergence by hand and its clip, the masking's rate, the loss in a
vision-language GRPO run, and a text policy refused before training."""

# The VL fixtures are imported from the rollout tests and requested by name as parameters.
# ruff: noqa: F811

import math

import pytest
import torch

from creditflow.algorithms.papo import masked_pixels, perception_divergence, perception_loss
from creditflow.errors import ConfigError
from creditflow.training import GRPOConfig, GRPOTrainer
from creditflow.training.grpo_runs import grpo_policy
from tests.rollout.test_vision_policy import (  # noqa: F401 - fixtures are found by name
    make_vl_model,
    tor_tasks,
    vl_processor,
    vl_prompts,
)
from tests.training.helpers import length_reward, make_trainer


def test_the_divergence_by_hand_and_its_clip():
    logp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    masked = torch.tensor([[-1.0, -1.5, -4.0]], requires_grad=True)
    # delta = masked - logp: 0, -0.5, -3 -> exp(d) - d - 1 = 0, 0.10653, 2.04979 -> clip 0.2
    d = perception_divergence(logp, masked, clip=0.2)
    expected = [0.0, math.exp(-0.5) - 0.5, 0.2]
    assert d[0].tolist() == pytest.approx(expected, abs=1e-6)
    loss, metrics = perception_loss(logp, masked, torch.ones(1, 3), weight=0.5, clip=0.2)
    assert float(loss.detach()) == pytest.approx(-0.5 * sum(expected) / 3, abs=1e-6)
    assert metrics["actor/perception_kl"] == pytest.approx(sum(expected) / 3, abs=1e-6)
    loss.backward()
    # The clipped token pushes no more: its gradient is 0 on both sides.
    assert masked.grad[0, 2] == 0 and logp.grad[0, 2] == 0
    # d/d masked of -w/3 (exp(d) - d - 1) = -w/3 (exp(d) - 1) at d = -0.5
    assert float(masked.grad[0, 1]) == pytest.approx(-0.5 / 3 * (math.exp(-0.5) - 1), abs=1e-6)


def test_masking_zeroes_about_the_ratio_and_only_that():
    pixels = torch.rand(200, 50) + 1.0  # no value is 0 before masking
    masked = masked_pixels(pixels, 0.3, torch.Generator().manual_seed(0))
    zeroed = (masked == 0).float().mean().item()
    assert abs(zeroed - 0.3) < 0.02
    kept = masked != 0
    assert torch.equal(masked[kept], pixels[kept])


def _vl_run(make_vl_model, vl_processor, vl_prompts, perception):
    config = GRPOConfig.from_params(
        {"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6,
         "rewards": {"length": 1.0}, "warmup_steps": 0, "checkpoint_every": 0,
         "log_samples_every": 0, "learning_rate": 1e-2, "perception": perception}
    )  # fmt: skip
    model = make_vl_model()
    policy = grpo_policy(model, vl_processor, config)
    history = GRPOTrainer(policy, vl_prompts, length_reward, config, progress=False).train().history
    return history, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_vision_language_run_adds_the_term_and_weight_zero_trains_as_without(
    make_vl_model, vl_processor, vl_prompts
):
    plain, plain_weights = _vl_run(make_vl_model, vl_processor, vl_prompts, None)
    zero, zero_weights = _vl_run(make_vl_model, vl_processor, vl_prompts, {"weight": 0.0})
    on, on_weights = _vl_run(
        make_vl_model, vl_processor, vl_prompts, {"weight": 1.0, "mask_ratio": 0.5, "clip": 5.0}
    )
    assert all(h["actor/perception_kl"] >= 0 for h in on)
    assert "actor/perception_kl" not in plain[0]
    # Weight 0: the masked forward runs, and the update is the plain one bit for bit (the
    # loop seeds torch's stream every step, so the masking's draws change nothing after it).
    assert [h["actor/loss"] for h in zero] == [h["actor/loss"] for h in plain]
    assert all(torch.equal(zero_weights[k], plain_weights[k]) for k in plain_weights)
    assert any(not torch.equal(on_weights[k], plain_weights[k]) for k in plain_weights)


def test_a_text_policy_is_refused_before_training(make_model, tapo_tokenizer, tapo_prompts):
    with pytest.raises(ConfigError, match="perception .* takes no pictures"):
        make_trainer(make_model(), tapo_tokenizer, tapo_prompts, perception={"weight": 0.1})


@pytest.mark.parametrize(
    ("perception", "message"),
    [
        ({"weight": -1.0}, "perception.weight"),
        ({"mask_ratio": 0.0}, "perception.mask_ratio"),
        ({"ratio": 0.3}, "unknown perception option"),
    ],
)
def test_bad_options_fail_naming_the_key(perception, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(perception=perception)
