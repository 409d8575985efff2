"""Page-level GRPO's entry point: the engine's GRPOTrainer on the reranker policy with the page
reward."""

from __future__ import annotations

import copy

import torch

from creditflow.chain.reranker.model import PointerReranker
from creditflow.chain.reranker.page_reward import PageReward
from creditflow.chain.reranker.policy import RerankerPolicy
from creditflow.config.grpo import (
    GRPOConfig,
)
from creditflow.training.checkpoint import (
    CheckpointStore,
    content_digest,
    run_store,
)
from creditflow.training.grpo import GRPOResult, GRPOTrainer


# ---------------------------------------------------------------- reranker (page-level GRPO)
def run_page_grpo(
    model: PointerReranker,
    features: torch.Tensor,
    mask: torch.Tensor,
    reward: PageReward,
    config: GRPOConfig,
    checkpoints: CheckpointStore | None,
) -> tuple[PointerReranker, GRPOResult]:
    """Page-level GRPO (docs/methods/experience.md, step 5, ``chain.reranker.page_reward``) on a copy of ``model``: prompts are
    session indices of ``features`` ``(N, L, F)`` / ``mask`` ``(N, L)``, the policy samples
    rankings at ``config.temperature``; with ``config.beta > 0`` the engine keeps a frozen copy
    of the starting reranker as the KL reference. Resumes from ``checkpoints`` when a run with
    the same starting weights, sessions, rewards and config left one there."""
    policy_model = copy.deepcopy(model)
    reward_tensors, reward_key = reward.run_key()
    data_key = [content_digest(t) for t in (features, mask, *reward_tensors)]
    checkpoints = run_store(checkpoints, policy_model, config.run_key(), data_key, reward_key)
    policy = RerankerPolicy(policy_model, features, mask, temperature=config.temperature)
    trainer = GRPOTrainer(
        policy, list(range(len(features))), reward, config, checkpoints, desc="page GRPO"
    )
    result = trainer.train()
    return policy_model.eval(), result
