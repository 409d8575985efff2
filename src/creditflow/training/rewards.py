"""Reward functions bound to a prompt table: what the GRPO loop and the evaluations score
completions with, whatever the policy (text or vision-language: completions are text).

``BoundRewards`` holds the rewards a run computes, bound to each prompt's references,
answers and other columns; ``reward_name`` is what its metrics and weights go by.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from creditflow.errors import ConfigError
from creditflow.rewards import check_reward_options, get_reward_function
from creditflow.rewards.plugins import TRLReward, is_builtin_reward, plugin_reward

# (completions, prompt_index (B,)) -> name -> (B,): the rewards, by reward name, and 0/1 flags
# on how a reward was come by, named "<reward>/<flag>" (creditflow.rewards.registry): the step
# reports a flag's count in the batch (e.g. reward/reasoning/timed_out); no strategy reads it.
RewardFn = Callable[[list[str], torch.Tensor], dict[str, torch.Tensor]]

# A reward: a name of ``rewards.REWARD_FUNCTIONS``, an import path / entry point of a
# TRL-style function (``rewards.plugins``), or such a callable ``fn(completions, **columns) ->
# B floats`` itself (``BoundRewards``).
Reward = str | Callable[..., Sequence[float]]


def reward_name(reward: Reward) -> str:
    """The name a reward's metrics and weights go by: the string it is named with (a
    built-in's name, an import path), a callable's ``__name__`` (as TRL names them).

    Raises:
        ConfigError: a callable without a usable ``__name__`` (a ``functools.partial``, a
            name with ``/``, which marks flags), or neither a string nor a callable.
    """
    if isinstance(reward, str):
        return reward
    if not callable(reward):
        raise ConfigError(f"a reward is a name or a callable, got {reward!r}")
    name = getattr(reward, "__name__", None)
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(
            f"reward {reward!r} needs a __name__ without '/' (its metrics are "
            "reward/<name>): write it as a def, or set fn.__name__"
        )
    return name


def reward_columns(problems: pd.DataFrame, prompts: Sequence[Any]) -> dict[str, list[Any]]:
    """The per-prompt keyword arguments of callable rewards, as TRL passes a dataset's
    columns: ``prompts``, then every column of ``problems`` except ``prompt``."""
    columns = {str(name): list(problems[name]) for name in problems.columns if name != "prompt"}
    return {"prompts": list(prompts), **columns}


class BoundRewards:
    """Text rewards bound to the references, answers and other columns of a prompt table.

    ``__call__(completions, prompt_index (B,))`` -> {name: (B,) float tensor}: each reward,
    and each of its 0/1 flags as ``"<reward>/<flag>"`` (``RewardFn``); row b is scored
    against the row of prompt ``prompt_index[b]``.

    ``rewards``: names of built-in rewards (``rewards.REWARD_FUNCTIONS``), called with the
    references and answers, and TRL-style rewards: callables, or the import paths / entry
    points of such functions (``rewards.plugins.plugin_reward``), called as TRL calls them
    (``rewards.plugins.TRLReward``: ``completions``, ``prompts`` and the other rows of
    ``columns``, ``reward_columns``), returning B floats (None: does not apply, scored 0 and
    flagged ``not_applicable``); a callable is named by its ``__name__`` (``reward_name``), a
    path by itself. ``options``: built-in reward name -> keyword options of that reward,
    checked here (``rewards.check_reward_options``).
    """

    def __init__(
        self,
        rewards: Sequence[Reward],
        references: Sequence[str],
        answers: Sequence[str],
        options: Mapping[str, Mapping[str, Any]] | None = None,
        columns: Mapping[str, Sequence[Any]] | None = None,
    ):
        names = [reward_name(reward) for reward in rewards]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ConfigError(f"rewards {repeated} are given twice; give each reward once")
        builtin = [name for name, r in zip(names, rewards, strict=True) if is_builtin_reward(r)]
        options = dict(options or {})
        unknown = sorted(set(options) - set(builtin))
        if unknown:
            raise ValueError(
                f"options for rewards {unknown} that are not built-in rewards in {names} "
                "(a reward of your own takes no options: bind them in its module)"
            )
        # A name fails here, before any rollout; a callable's signature too.
        self.functions = {
            name: get_reward_function(r) if is_builtin_reward(r) else _trl_reward(name, r)
            for name, r in zip(names, rewards, strict=True)
        }
        self.options = {name: check_reward_options(name, options.get(name, {})) for name in builtin}
        self.references = list(references)
        self.answers = list(answers)
        self.columns = {name: list(values) for name, values in (columns or {}).items()}

    def __call__(
        self, completions: list[str], prompt_index: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        rows = prompt_index.tolist()
        refs = [self.references[i] for i in rows]
        answers = [self.answers[i] for i in rows]
        out = {}
        for name, fn in self.functions.items():
            if isinstance(fn, TRLReward):
                rewards, flags = fn(completions, self._rows("prompts", rows), self._kwargs(rows))
            else:
                rewards, flags = fn(completions, refs, answers, **self.options[name])
            out[name] = torch.tensor(rewards, dtype=torch.float32)
            for flag, values in flags.items():
                out[f"{name}/{flag}"] = torch.tensor(values, dtype=torch.float32)
        return out

    def _rows(self, column: str, rows: list[int]) -> list[Any]:
        values = self.columns.get(column)
        return [None] * len(rows) if values is None else [values[i] for i in rows]

    def _kwargs(self, rows: list[int]) -> dict[str, list[Any]]:
        return {c: [v[i] for i in rows] for c, v in self.columns.items() if c != "prompts"}


def _trl_reward(name: str, reward: Reward) -> TRLReward:
    """A TRL-style reward: a callable as it is, a name resolved (``rewards.plugins``)."""
    return plugin_reward(reward) if isinstance(reward, str) else TRLReward(name, reward)
