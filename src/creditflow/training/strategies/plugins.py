"""Strategies of one's own: named by import path or entry point instead of a built-in name.

``advantage: {name: "my_credit.strategies:high_entropy_only", ...}`` or the name of an entry
point of the group ``creditflow.strategies`` (``config.plugins``) refers to one of:

- an ``AdvantageStrategy`` / ``TokenWeightStrategy`` (the full form: its own option checks,
  the rewards it reads, whether it needs the rollout's entropy or log-probs);
- a plain function with the signature of its kind (``base.AdvantageFn``:
  ``(spec, rewards, batch, policy, config)``; ``base.TokenWeightFn``: ``(spec, batch, policy,
  context)``), returning the ``(B, T)`` tensor or ``(tensor, metrics)``. It is wrapped in the
  dataclass with no option checks (its options reach it in ``spec``) and no entropy or
  log-probs asked of the rollout: a strategy that reads ``batch.entropy`` takes the full form
  with ``needs_entropy=True``.

Anything else fails before the first node with a ConfigError naming the key and the path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from creditflow.config.grpo import GRPOConfig
from creditflow.config.plugins import entry_point_names, load_plugin
from creditflow.errors import ConfigError
from creditflow.training.strategies.base import (
    AdvantageStrategy,
    Metrics,
    Spec,
    TokenWeightStrategy,
)

Strategy = AdvantageStrategy | TokenWeightStrategy
# The parameter key of each kind -> (its dataclass, the arguments its function takes).
KINDS: dict[str, tuple[type, tuple[str, ...]]] = {
    "advantage": (AdvantageStrategy, ("spec", "rewards", "batch", "policy", "config")),
    "token_weights": (TokenWeightStrategy, ("spec", "batch", "policy", "context")),
}


def plugin_strategy(label: str, name: Any, built_in: Mapping[str, Strategy]) -> Strategy:
    """The ``label`` strategy (``advantage`` or ``token_weights``) that ``name`` refers to.

    Args:
        label: the parameter key of the spec.
        name: its ``name``, not a built-in one.
        built_in: the built-in strategies of that kind (listed when ``name`` is unknown).

    Raises:
        ConfigError: naming ``<label>.name`` and ``name``: an unknown name, a module that does
            not import, a missing attribute, a strategy of the other kind, or a function whose
            signature does not fit.
    """
    found = load_plugin(name, "strategy", f"{label}.name") if isinstance(name, str) else None
    if found is None:
        registered = entry_point_names("strategy")
        raise ConfigError(
            f"unknown {label} strategy {name!r}; valid: {sorted(built_in)} (built in)"
            + (f", {registered} (installed entry points)" if registered else "")
            + ", or an import path 'package.module:function'"
        )
    return as_strategy(label, found, name)


def as_strategy(label: str, found: Any, name: str) -> Strategy:
    """``found`` as a ``label`` strategy: a strategy dataclass of that kind as it is, a plain
    function of that kind's signature wrapped (module docstring).

    Raises:
        ConfigError: naming ``<label>.name`` and ``name``: a strategy of the other kind, or no
            function of the signature.
    """
    key = f"{label}.name"
    cls, arguments = KINDS[label]
    if isinstance(found, cls):
        return found
    for other, (other_cls, _) in KINDS.items():
        if isinstance(found, other_cls):
            raise ConfigError(
                f"{key}: {name!r} is a {other_cls.__name__}, not a {cls.__name__}: name it "
                f"under {other}, or give {label} a strategy of its kind"
            )
    check_signature(found, arguments, key, name)
    if label == "advantage":
        return AdvantageStrategy(_with_metrics(found), any_options)
    return TokenWeightStrategy(_with_metrics(found), any_options)


def check_signature(fn: Any, arguments: tuple[str, ...], key: str, name: str) -> None:
    """ConfigError when ``fn`` cannot be called with ``len(arguments)`` positional arguments."""
    expected = f"def {name.rpartition(':')[2].rpartition('.')[2]}({', '.join(arguments)})"
    if not callable(fn):
        raise ConfigError(
            f"{key}: {name!r} is a value of type {type(fn).__name__}: a strategy is a function "
            f"{expected} or the strategy dataclass"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: taken as it is
        return
    try:
        signature.bind(*arguments)
    except TypeError as error:
        raise ConfigError(
            f"{key}: {name!r}{signature} does not fit ({error}): write it as {expected} "
            "(docs/extending.md)"
        ) from error


def any_options(spec: Spec, config: GRPOConfig) -> None:
    """The validation of a plain function: it reads its own options from ``spec``."""


def _with_metrics(fn: Callable[..., Any]) -> Callable[..., tuple[torch.Tensor, Metrics]]:
    """``fn`` returning ``(tensor, metrics)`` whether it returns that or the tensor alone."""

    def compute(*args: Any) -> tuple[torch.Tensor, Metrics]:
        out = fn(*args)
        if isinstance(out, torch.Tensor):
            return out, {}
        tensor, metrics = out
        return tensor, dict(metrics)

    compute.__name__ = getattr(fn, "__name__", "compute")
    compute.__wrapped__ = fn
    return compute
