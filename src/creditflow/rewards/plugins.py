"""Rewards of one's own: named by import path or entry point, called as TRL calls a reward.

A reward the parameters name that is not built in (``registry.REWARD_FUNCTIONS``) is an import
path ``"my_credit.rewards:brevity"`` or an entry point of the group ``creditflow.rewards``
(``config.plugins``). Its function is written as for TRL's ``GRPOTrainer``, and works unchanged::

    def brevity(completions, **kwargs) -> list[float]:
        return [-len(c) / 100 for c in completions]

:class:`TRLReward` calls it the way TRL 1.x does (``GRPOTrainer._calculate_rewards``), with
keyword arguments only:

- ``completions``: the ``B`` completions, as strings; as chat messages
  (``[{"role": "assistant", "content": text}]``) when the prompts are chat messages;
- ``prompts``: the ``B`` prompts, each repeated for its completions;
- every other column of the prompt table (``answer``, ``question_en``, ...), one value per
  completion;
- ``completion_ids`` and ``trainer_state``: None. creditflow scores the decoded text and has no
  ``transformers`` TrainerState; a reward that needs them does not fit (it is refused before
  the first node when its signature requires them).

A function without ``**kwargs`` gets only the keywords it names. It returns ``B`` numbers; a
None means "does not apply to this completion", as in TRL, where the weighted sum over the
reward functions skips it (``nansum``): here it scores 0 and is counted as the flag
``reward/<name>/not_applicable``. The reward goes by the name it is written with
(``reward/my_credit.rewards:brevity`` in the metrics, the same string in ``rewards`` weights).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from creditflow.config.plugins import at, entry_point_names, load_plugin
from creditflow.errors import ConfigError
from creditflow.rewards.registry import REWARD_FUNCTIONS, RewardOutput

# The keyword arguments TRL passes besides the dataset's columns (log_extra, log_metric and
# environments, TRL-only logging hooks, are not passed: a reward reading them needs TRL).
TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state")
# Passed as None: see the module docstring.
NOT_PASSED = ("completion_ids", "trainer_state")
NOT_APPLICABLE = "not_applicable"  # the flag of a None score


def is_builtin_reward(name: Any) -> bool:
    return isinstance(name, str) and name in REWARD_FUNCTIONS


class TRLReward:
    """A TRL-style reward function ``fn(completions, **kwargs) -> B floats`` adapted to
    creditflow's rewards: ``__call__(completions, prompts, columns) -> (B floats, flags)``
    (the ``registry.RewardOutput`` of the built-ins; flags: ``not_applicable``).

    Args:
        name: the name its scores go by.
        fn: the function; its signature is checked here (``check_trl_signature``).
        key: the parameter key that named it, for the messages.

    Raises:
        ConfigError: ``fn`` is no callable, or its signature cannot take TRL's call.
    """

    def __init__(self, name: str, fn: Callable[..., Sequence[Any]], key: str = "rewards"):
        self.name, self.fn = name, fn
        self.takes_any, self.accepted, self.required = check_trl_signature(fn, name, key)
        self.__name__ = name

    def missing_columns(self, columns: Collection[str]) -> list[str]:
        """The arguments the function requires that neither TRL's keywords nor ``columns``
        (the prompt table's, ``prompts`` included) supply."""
        return sorted(set(self.required) - set(TRL_ARGUMENTS) - set(columns))

    def __call__(
        self,
        completions: Sequence[str],
        prompts: Sequence[Any],
        columns: Mapping[str, Sequence[Any]] | None = None,
    ) -> RewardOutput:
        """Scores of ``completions`` (``B`` strings); ``prompts`` and every list of
        ``columns`` hold one value per completion."""
        conversational = bool(prompts) and _is_conversational(prompts[0])
        kwargs = {
            **{name: list(values) for name, values in (columns or {}).items()},
            "prompts": list(prompts),
            "completions": [
                [{"role": "assistant", "content": text}] if conversational else text
                for text in completions
            ],
            **dict.fromkeys(NOT_PASSED),
        }
        if not self.takes_any:
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepted}
        missing = self.missing_columns(kwargs)
        if missing:
            raise ConfigError(
                f"reward {self.name!r} requires {missing}, which the prompt table does not "
                f"have (its columns: {sorted(columns or {})}); give them defaults or add the "
                "columns"
            )
        return scores_of(self.name, self.fn(**kwargs), len(completions))


def scores_of(name: str, values: Any, n: int) -> RewardOutput:
    """``values`` (a list, array or tensor of ``n`` numbers or None) as ``n`` floats and the
    ``not_applicable`` flags of the Nones (each scores 0).

    >>> scores_of("r", [1, None, 0.5], 3)
    ([1.0, 0.0, 0.5], {'not_applicable': [0.0, 1.0, 0.0]})
    """
    values = values.tolist() if hasattr(values, "tolist") else values
    try:
        values = list(values)
    except TypeError:
        raise ValueError(
            f"reward {name!r} returned {type(values).__name__}, not a list: return one float "
            "per completion"
        ) from None
    if len(values) != n:
        raise ValueError(
            f"reward {name!r} returned {len(values)} values for {n} completions: return one "
            "float per completion"
        )
    try:
        floats = [0.0 if v is None else float(v) for v in values]
    except (TypeError, ValueError) as error:
        raise ValueError(f"reward {name!r} returned a value that is no number: {error}") from None
    if not all(math.isfinite(v) for v in floats):
        raise ValueError(
            f"reward {name!r} returned a NaN or infinite score; return None for a completion "
            "it does not apply to"
        )
    return floats, {NOT_APPLICABLE: [float(v is None) for v in values]}


def check_trl_signature(
    fn: Any, name: str, key: str = "rewards"
) -> tuple[bool, frozenset[str], tuple[str, ...]]:
    """``(takes **kwargs, the keywords it names, the ones it requires)`` of a TRL-style reward.

    Raises:
        ConfigError: ``fn`` is not callable; it has a positional-only parameter or does not
            take ``completions`` (TRL calls with keywords); it requires ``completion_ids`` or
            ``trainer_state``, which creditflow passes as None.
    """
    if not callable(fn):
        raise ConfigError(
            f"{at(key)}{name!r} is a value of type {type(fn).__name__}, not a function: a reward is "
            "def reward(completions, **kwargs) -> list[float]"
        )
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: taken as it is
        return True, frozenset(), ()
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    named = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = tuple(p.name for p in named if p.default is p.empty)
    positional_only = [p.name for p in parameters if p.kind is p.POSITIONAL_ONLY]
    accepted = frozenset(p.name for p in named)
    shown = f"{getattr(fn, '__name__', name)}{inspect.signature(fn)}"
    problem = None
    if positional_only:
        problem = f"its parameters {positional_only} are positional-only"
    elif "completions" not in accepted and not takes_any:
        problem = "it takes no 'completions'"
    elif set(required) & set(NOT_PASSED):
        problem = (
            f"it requires {sorted(set(required) & set(NOT_PASSED))}, which creditflow passes as "
            "None (it scores decoded text, outside transformers' Trainer)"
        )
    if problem:
        raise ConfigError(
            f"{at(key)}{name!r}: {shown} does not fit a reward, as {problem}; write it as TRL "
            "calls one: def reward(completions, **kwargs) -> list[float] (the prompts and the "
            "prompt table's columns arrive as keyword arguments)"
        )
    return takes_any, accepted, required


def plugin_reward(name: str, key: str = "rewards") -> TRLReward:
    """The reward behind ``name``, an import path or an entry point of ``creditflow.rewards``.

    Raises:
        ConfigError: an unknown name (listing the valid ones), a module that does not import,
            a missing attribute, or a function that does not fit (``check_trl_signature``).
    """
    fn = load_plugin(name, "reward", key)
    if fn is None:
        registered = entry_point_names("reward")
        raise ConfigError(
            f"{at(key)}unknown reward {name!r}; valid: {sorted(REWARD_FUNCTIONS)} (built in)"
            + (f", {registered} (installed entry points)" if registered else "")
            + ", or an import path 'package.module:function'"
        )
    if isinstance(fn, TRLReward):
        return fn
    return TRLReward(name, fn, key)


def check_reward_name(name: str, key: str = "") -> str:
    """``name`` when it is a built-in reward or resolves to one that fits (``plugin_reward``);
    the parameter schema's check of ``reward_functions`` (it names the key itself).

    >>> check_reward_name("reasoning")
    'reasoning'
    """
    if not is_builtin_reward(name):
        plugin_reward(name, key)
    return name


def _is_conversational(prompt: Any) -> bool:
    """Whether ``prompt`` is chat messages (a list of ``{"role", "content"}`` dicts), as TRL's
    ``is_conversational`` tells them from plain text."""
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(m, Mapping) and "role" in m for m in prompt)
    )
