"""The reward functions by name, behind one signature the training engine can call blindly.

Every entry is ``fn(completions, references, answers, **kw) -> list[float]``: ``B``
decoded completions, ``B`` reference English questions and ``B`` gold answers in, ``B``
rewards out. Each entry reads the arguments it needs and ignores the others; keyword
arguments go to the underlying reward (``metric=`` for ``translation``, ``timeout_s=`` for
``reasoning``).
"""

from collections.abc import Callable
from typing import Any

from creditflow.rewards.format import format_reward
from creditflow.rewards.reasoning import reasoning_reward
from creditflow.rewards.translation import translation_reward

RewardFunction = Callable[..., list[float]]


def _format(completions: list[str], references: list[str], answers: list[str]) -> list[float]:
    """F in {0, 1} (SPEC 1); ``references`` and ``answers`` are unused."""
    return format_reward(completions)


def _translation(
    completions: list[str], references: list[str], answers: list[str], **kw: Any
) -> list[float]:
    """R_trans = F * chrF++ / 100 (SPEC 1); ``answers`` is unused."""
    return translation_reward(completions, references, **kw)


def _reasoning(
    completions: list[str], references: list[str], answers: list[str], **kw: Any
) -> list[float]:
    """R_reason in {0, 1} (SPEC 1); ``references`` is unused."""
    return reasoning_reward(completions, answers, **kw)


REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "format": _format,
    "translation": _translation,
    "reasoning": _reasoning,
}


def get_reward_function(name: str) -> RewardFunction:
    """The registered reward called ``name``.

    >>> get_reward_function("format")(["<translation>Q</translation> A"], ["Q"], ["1"])
    [1.0]
    """
    try:
        return REWARD_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; valid: {sorted(REWARD_FUNCTIONS)}") from None
