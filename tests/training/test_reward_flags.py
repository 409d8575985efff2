"""Reward flags and reward options in the engine: the reasoning reward's flags
reach the step metrics as counts, and reward options reach the reward functions, checked
before training."""

import pytest
import torch

from creditflow.errors import ConfigError
from creditflow.training.evaluation import score_completions
from creditflow.training.grpo_runs import build_grpo_config
from creditflow.training.rewards import BoundRewards
from tests.training.helpers import make_trainer, spy

HOSTILE = "\\boxed{9^{9^{9^{9}}}}"


def length_and_odd(completions: list[str], prompt_index: torch.Tensor) -> dict[str, torch.Tensor]:
    lengths = torch.tensor([float(len(c)) for c in completions])
    return {"length": lengths, "length/odd": lengths % 2}


def test_a_flag_is_counted_and_never_rewarded(
    make_model, tapo_tokenizer, tapo_prompts, monkeypatch
):
    trainer = make_trainer(make_model(), tapo_tokenizer, tapo_prompts, reward_fn=length_and_odd)
    seen = spy(monkeypatch, trainer, "reward_fn")
    metrics = trainer.step(0)
    rewards = length_and_odd(*seen[0])
    assert metrics["reward/length/odd"] == rewards["length/odd"].sum().item()  # a count
    assert metrics["reward/length"] == pytest.approx(rewards["length"].mean().item())
    assert metrics["reward/total"] == pytest.approx(rewards["length"].mean().item())


def test_text_rewards_return_each_reward_and_its_flags():
    rewards = BoundRewards(["format", "reasoning"], ["Q0", "Q1"], ["3", "7"])
    out = rewards(["\\boxed{7}", HOSTILE, "\\boxed{3}"], torch.tensor([1, 1, 0]))
    assert set(out) == {
        "format",
        "reasoning",
        "reasoning/rejected",
        "reasoning/timed_out",
        "reasoning/over_budget",
    }
    assert out["reasoning"].tolist() == [1.0, 0.0, 1.0]
    assert out["reasoning/rejected"].tolist() == [0.0, 1.0, 0.0]
    assert out["reasoning/timed_out"].tolist() == [0.0, 0.0, 0.0]
    # Evaluation tables keep one column per reward.
    table = score_completions([HOSTILE], ["Q0"], ["3"], ["format", "reasoning"])
    assert list(table.columns) == ["reward/format", "reward/reasoning"]


def test_text_rewards_pass_the_options_on():
    rewards = BoundRewards(["reasoning"], ["Q"], ["12345"], {"reasoning": {"max_answer_chars": 4}})
    out = rewards(["\\boxed{12345}"], torch.tensor([0]))
    assert out["reasoning"].tolist() == [0.0]
    assert out["reasoning/rejected"].tolist() == [1.0]
    with pytest.raises(ValueError, match=r"options for rewards \['format'\]"):
        BoundRewards(["reasoning"], ["Q"], ["1"], {"format": {}})
    with pytest.raises(ValueError, match="unknown option"):
        BoundRewards(["reasoning"], ["Q"], ["1"], {"reasoning": {"budget": 1.0}})


GRPO = {"steps": 1, "prompts_per_step": 2, "group_size": 2}


def test_build_grpo_config_checks_the_reward_options():
    config = build_grpo_config(
        {**GRPO, "reward_options": {"reasoning": {"budget_s": 10.0}}}, ["format", "reasoning"]
    )
    assert config.reward_options == {"reasoning": {"budget_s": 10.0}}
    assert build_grpo_config(dict(GRPO), ["reasoning"]).reward_options == {}
    with pytest.raises(ConfigError, match=r"reward_options names reward 'translation'.*not"):
        build_grpo_config({**GRPO, "reward_options": {"translation": {}}}, ["reasoning"])
    with pytest.raises(ConfigError, match=r"reward_options.reasoning: unknown option.*budget_s"):
        build_grpo_config({**GRPO, "reward_options": {"reasoning": {"budget": 1}}}, ["reasoning"])
    with pytest.raises(ConfigError, match=r"reward_options.reasoning: budget_s must be > 0"):
        build_grpo_config(
            {**GRPO, "reward_options": {"reasoning": {"budget_s": -1}}}, ["reasoning"]
        )
