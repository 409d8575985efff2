"""The reward functions by name, behind one signature the training engine can call blindly.

Every entry is ``fn(completions, references, answers, **kw) -> (rewards, flags)``: ``B``
decoded completions, ``B`` reference English questions and ``B`` gold answers in; ``B``
rewards out, and ``flags``: flag name -> ``B`` floats in {0, 1} saying how each reward was
come by (the reasoning reward's ``reasoning.FLAGS``: answers rejected unparsed, checks that
timed out or that the batch budget left undone; empty for the other rewards). A run counts
the flags; they are never rewards. Each entry reads the arguments it needs and
ignores the others; keyword arguments go to the underlying reward (``metric=`` for
``translation``; ``timeout_s=``, ``budget_s=`` and the caps for ``reasoning``), checked up
front by :func:`check_reward_options`.
"""

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from creditflow.rewards.exact import exact_match_reward, final_number_reward, number_format_reward
from creditflow.rewards.format import format_reward
from creditflow.rewards.reasoning import FLAGS, RIGHT, reasoning_outcomes
from creditflow.rewards.translation import translation_reward

RewardOutput = tuple[list[float], dict[str, list[float]]]
RewardFunction = Callable[..., RewardOutput]


def _format(completions: list[str], references: list[str], answers: list[str]) -> RewardOutput:
    """F in {0, 1} (docs/methods/tapo.md); ``references`` and ``answers`` are unused."""
    return format_reward(completions), {}


def _translation(
    completions: list[str], references: list[str], answers: list[str], **kw: Any
) -> RewardOutput:
    """R_trans = F * chrF++ / 100 (docs/methods/tapo.md); ``answers`` is unused."""
    return translation_reward(completions, references, **kw), {}


def _reasoning(
    completions: list[str], references: list[str], answers: list[str], **kw: Any
) -> RewardOutput:
    """R_reason in {0, 1} (docs/methods/tapo.md) and the FLAGS of each check; ``references`` is unused."""
    outcomes = reasoning_outcomes(completions, answers, **kw)
    rewards = [1.0 if outcome == RIGHT else 0.0 for outcome in outcomes]
    return rewards, {flag: [float(outcome == flag) for outcome in outcomes] for flag in FLAGS}


def _exact_match(
    completions: list[str], references: list[str], answers: list[str], **kw: Any
) -> RewardOutput:
    """1 where the completion is the gold answer (``exact.exact_match_reward``), else 0;
    ``references`` is unused."""
    return exact_match_reward(completions, answers, **kw), {}


def _final_number(
    completions: list[str], references: list[str], answers: list[str]
) -> RewardOutput:
    """1 where the completion's last number is the gold answer (``exact.final_number_reward``);
    ``references`` is unused."""
    return final_number_reward(completions, answers), {}


def _number_format(
    completions: list[str], references: list[str], answers: list[str]
) -> RewardOutput:
    """1 where the completion is one number alone (``exact.number_format_reward``);
    ``references`` and ``answers`` are unused."""
    return number_format_reward(completions), {}


REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "format": _format,
    "translation": _translation,
    "reasoning": _reasoning,
    "exact_match": _exact_match,
    "final_number": _final_number,
    "number_format": _number_format,
}
# The data arguments each entry reads (it ignores the others): the columns a dataset needs
# for it (``creditflow.api``).
REWARD_INPUTS: dict[str, tuple[str, ...]] = {
    "format": (),
    "translation": ("references",),
    "reasoning": ("answers",),
    "exact_match": ("answers",),
    "final_number": ("answers",),
    "number_format": (),
}
# The functions whose keyword arguments each entry forwards (the options it takes).
_OPTIONS_OF: dict[str, Callable[..., Any]] = {
    "format": format_reward,
    "translation": translation_reward,
    "reasoning": reasoning_outcomes,
    "exact_match": exact_match_reward,
    "final_number": final_number_reward,
    "number_format": number_format_reward,
}
_DATA_ARGUMENTS = {"completions", "references", "answers"}


def get_reward_function(name: str) -> RewardFunction:
    """The registered reward called ``name``.

    >>> get_reward_function("format")(["<translation>Q</translation> A"], ["Q"], ["1"])
    ([1.0], {})
    """
    try:
        return REWARD_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; valid: {sorted(REWARD_FUNCTIONS)}") from None


def check_reward_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` for reward ``name``, checked before any training: the names must be
    options of that reward, and a call on an empty batch checks their values.

    Raises:
        ValueError: an unknown reward or option (naming the valid ones), or a bad value.

    >>> check_reward_options("reasoning", {"budget_s": 10.0})
    {'budget_s': 10.0}
    """
    fn = get_reward_function(name)
    valid = sorted(set(inspect.signature(_OPTIONS_OF[name]).parameters) - _DATA_ARGUMENTS)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} of reward {name!r}; valid: {valid}")
    fn([], [], [], **options)
    return dict(options)
