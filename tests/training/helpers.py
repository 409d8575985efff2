"""Small builders shared by the engine tests."""

import copy

import torch

from creditflow.rollout import LanguagePolicy
from creditflow.training import GRPOConfig, GRPOTrainer
from creditflow.training.grpo_runs import grpo_policy, sampling_settings


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
        policy = grpo_policy(model, tokenizer, config)
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


# The fixed update the 1- and 2-process tests compare: B = 4 prompts x 2 = 8 rows.
TWO_PROCESS_UPDATE = {
    "prompts_per_step": 4,
    "group_size": 2,
    "max_new_tokens": 8,
    "max_grad_norm": 0.5,
}


def fixed_global_update(model, tokenizer, prompts):
    """The fixed global batch (4 prompts x 2, sampled with seed 0) and seeded advantages, and
    one 1-process optimizer step on all of it: ``(inputs, single_model, single_metrics)``, with
    ``inputs`` the model, tokenizer, prompts, batch and advantages a multi-process run gets."""
    sampler = make_trainer(model, tokenizer, prompts, **TWO_PROCESS_UPDATE)
    torch.manual_seed(0)
    batch = sampler.policy.sample(prompts[:4], group_size=2)
    g = torch.Generator().manual_seed(1)
    advantages = torch.randn(batch.completion_ids.shape, generator=g) * batch.completion_mask
    inputs = {
        "model": model,
        "tokenizer": tokenizer,
        "prompts": prompts,
        "batch": batch,
        "advantages": advantages,
    }
    single_model = copy.deepcopy(model).train()
    single = make_trainer(single_model, tokenizer, prompts, **TWO_PROCESS_UPDATE)
    metrics = single.optimizer_step(batch, advantages, batch.completion_mask, None)
    return inputs, single_model, metrics


def spy(monkeypatch, obj, name: str) -> list[tuple]:
    """Record the positional arguments of every call of ``obj.name`` (still calling it)."""
    calls, original = [], getattr(obj, name)

    def recording(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, recording)
    return calls
