"""Small builders shared by the engine tests."""

import torch

from creditflow.rollout import LanguagePolicy
from creditflow.training import GRPOConfig, GRPOTrainer
from creditflow.training.grpo_runs import language_policy, sampling_settings


def length_reward(completions: list[str], prompt_index: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"length": torch.tensor([float(len(c)) for c in completions])}


def make_trainer(
    model,
    tokenizer,
    prompts,
    reward_fn=length_reward,
    checkpoints=None,
    accelerator=None,
    backend=None,
    **overrides,
) -> GRPOTrainer:
    """A trainer of ``model`` with small defaults (2 steps of 2 prompts x 4, 8 new tokens);
    ``backend``: a rollout backend object (default: the one ``rollout`` names)."""
    params = {
        "steps": 2,
        "prompts_per_step": 2,
        "group_size": 4,
        "max_new_tokens": 8,
        "rewards": {"length": 1.0},
        "learning_rate": 1e-2,
        "warmup_steps": 0,
        "checkpoint_every": 0,
        "log_samples_every": 0,
        **overrides,
    }
    config = GRPOConfig.from_params(params)
    if backend is None:
        policy = language_policy(model, tokenizer, config)
    else:
        policy = LanguagePolicy(model, tokenizer, sampling_settings(config), backend=backend)
    return GRPOTrainer(
        policy,
        prompts,
        reward_fn,
        config,
        checkpoints=checkpoints,
        progress=False,
        accelerator=accelerator,
    )


def spy(monkeypatch, obj, name: str) -> list[tuple]:
    """Record the positional arguments of every call of ``obj.name`` (still calling it)."""
    calls, original = [], getattr(obj, name)

    def recording(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, recording)
    return calls
