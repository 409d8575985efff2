"""How messages name a type, keyword options checked against a function's signature, and keys
that moved. Standard library only (the typed configs themselves are pydantic models)."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from creditflow.errors import ConfigError


def hint_names(hint: Any) -> str:
    """How a message names the type ``hint``: ``int``, ``float or null``, ``dict``.

    >>> hint_names(int | None)
    'int or null'
    """
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    allowed = typing.get_args(hint) if union else (hint,)
    names = [
        "null" if t is type(None) else getattr(typing.get_origin(t) or t, "__name__", str(t))
        for t in allowed
    ]
    return " or ".join(names)


def checked_options(
    options: Mapping[str, Any] | None, func: Callable, label: str, taken: Sequence[str] = ()
) -> dict:
    """``options`` as keyword arguments of ``func``, checked up front: every name must be an
    argument of ``func`` other than the ``taken`` ones (which the node passes itself), and every
    argument without a default that is not taken must be given.

    >>> checked_options({"steps": 3}, lambda model, steps, lr=0.1: None, "sft", taken=["model"])
    {'steps': 3}
    """
    options = dict(options or {})
    arguments = {
        name: p
        for name, p in inspect.signature(func).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in set(taken)
    }
    unknown = sorted(set(options) - set(arguments))
    if unknown:
        raise ValueError(f"unknown {label} option(s) {unknown}; valid: {sorted(arguments)}")
    missing = sorted(
        name for name, p in arguments.items() if p.default is p.empty and name not in options
    )
    if missing:
        raise ValueError(f"{label} needs option(s) {missing}; set them in parameters")
    return options


def reject_moved_keys(params: Mapping[str, Any], moved: Mapping[str, str], group: str) -> None:
    """ConfigError when ``params`` (the ``group`` parameters) still sets a key that moved:
    ``moved`` maps old key -> where it lives now. Without this an old override (a
    ``conf/local`` file, ``--params``) would be silently ignored."""
    stale = {old: new for old, new in moved.items() if old in params}
    if stale:
        hints = "; ".join(f"{group}.{old} is now {group}.{new}" for old, new in stale.items())
        raise ConfigError(f"{hints}: move those settings in your parameters")
