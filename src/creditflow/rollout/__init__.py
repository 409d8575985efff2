"""Policies that sample completions and score them: the rollout side of the GRPO engine."""

from creditflow.rollout.batch import Policy, RolloutBatch
from creditflow.rollout.language_policy import (
    LanguagePolicy,
    SamplingSettings,
    completion_mask_from_eos,
)

__all__ = [
    "LanguagePolicy",
    "Policy",
    "RolloutBatch",
    "SamplingSettings",
    "completion_mask_from_eos",
]
