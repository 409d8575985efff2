"""Typed parameter values: a value checked against its dataclass field type, keyword options
checked against a function's signature, and keys that moved. Standard library only."""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from creditflow.errors import ConfigError


def typed_value(name: str, value: Any, hint: Any) -> Any:
    """``value`` checked against the dataclass field type ``hint`` (``int``, ``float``,
    ``str``, ``bool``, a ``dict[...]`` or a union of them with ``None``), so a wrong type fails
    naming its key instead of as a bare TypeError deep inside torch. An int is taken for a
    float (as a float, so ``1`` and ``1.0`` are the same run); a bool is no number here
    (YAML's ``true`` for ``steps`` is a typo), and ``2.5`` is no int.

    >>> typed_value("lr", 1, float)
    1.0
    >>> typed_value("steps", "abc", int)
    Traceback (most recent call last):
    ...
    creditflow.errors.ConfigError: `steps` must be int, got 'abc' (str)
    """
    if hint is Any:
        return value
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    allowed = typing.get_args(hint) if union else (hint,)
    if value is None and type(None) in allowed:
        return None
    for kind in allowed:
        origin = typing.get_origin(kind) or kind
        if origin in (dict, Mapping) and isinstance(value, Mapping):
            return value
        if origin in (list, Sequence) and isinstance(value, list | tuple):
            return value
    if float in allowed and type(value) in (int, float):
        if not math.isfinite(value):
            # An infinite beta or learning rate trains a NaN policy without a word.
            raise ConfigError(f"`{name}` must be a finite number, got {value!r}")
        return float(value)
    if type(value) in allowed:
        return value
    names = [
        "null" if t is type(None) else getattr(typing.get_origin(t) or t, "__name__", str(t))
        for t in allowed
    ]
    raise ConfigError(
        f"`{name}` must be {' or '.join(names)}, got {value!r} ({type(value).__name__})"
    )


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
