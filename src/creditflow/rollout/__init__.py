"""Policies that sample completions and score them: the rollout side of the GRPO engine."""

from creditflow.rollout.batch import Policy, RolloutBatch
from creditflow.rollout.language_policy import (
    LanguagePolicy,
    SamplingSettings,
    completion_mask_from_eos,
)
from creditflow.rollout.vision_policy import VisionLanguagePolicy, VisualPrompt, as_visual_prompt

__all__ = [
    "LanguagePolicy",
    "Policy",
    "RolloutBatch",
    "SamplingSettings",
    "VisionLanguagePolicy",
    "VisualPrompt",
    "as_visual_prompt",
    "completion_mask_from_eos",
]
