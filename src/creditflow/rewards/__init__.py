"""TAPO's rewards (docs/methods/tapo.md): format, translation (chrF++ / XCOMET) and reasoning
(math_verify); exact match for generic prompt sets.

Pure functions of strings: ``B`` completions (and ``B`` references / answers) in, ``B``
floats out; deterministic, and they never raise on malformed model output (it scores 0).
"""

from creditflow.rewards.exact import exact_match_reward, normalise_answer
from creditflow.rewards.format import (
    TRANSLATION_CLOSE,
    TRANSLATION_OPEN,
    extract_translation,
    format_reward,
    translation_segment_end,
)
from creditflow.rewards.reasoning import (
    OUTCOMES,
    check_pairs,
    extract_boxed_answer,
    gold_answer,
    normalize_thousands,
    reasoning_outcomes,
    reasoning_reward,
    screen_answer,
)
from creditflow.rewards.registry import (
    REWARD_FUNCTIONS,
    REWARD_INPUTS,
    RewardFunction,
    RewardOutput,
    check_reward_options,
    get_reward_function,
)
from creditflow.rewards.translation import (
    DEFAULT_XCOMET_MODEL,
    TRANSLATION_METRICS,
    chrf_plus_plus,
    translation_reward,
)

__all__ = [
    "DEFAULT_XCOMET_MODEL",
    "OUTCOMES",
    "REWARD_FUNCTIONS",
    "REWARD_INPUTS",
    "TRANSLATION_CLOSE",
    "TRANSLATION_METRICS",
    "TRANSLATION_OPEN",
    "RewardFunction",
    "RewardOutput",
    "check_pairs",
    "check_reward_options",
    "chrf_plus_plus",
    "exact_match_reward",
    "extract_boxed_answer",
    "extract_translation",
    "format_reward",
    "get_reward_function",
    "gold_answer",
    "normalise_answer",
    "normalize_thousands",
    "reasoning_outcomes",
    "reasoning_reward",
    "screen_answer",
    "translation_reward",
    "translation_segment_end",
]
