"""A run the hooks refuse before anything trains ends with its message alone, not a traceback.

The checks the hooks run before a run's first node (its parameters, its task sources, the
saved inputs it reads) raise :class:`~creditflow.errors.ConfigError` or
:class:`~creditflow.errors.MissingInputsError` with a message that says what to fix. Raised
as they are, Kedro's CLI prints each under a full rich traceback of Kedro's and pluggy's
frames, and the one line that matters is at the bottom of a screen. :func:`refuses` wraps a
hook so that such an error becomes a ``click`` error as well (``Error: <message>``, exit
status 1, no traceback) while staying the same exception type for callers that catch it
(``pytest.raises(ConfigError)``, a Python API user's ``except``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from creditflow.errors import ConfigError, MissingInputsError

REFUSED = (ConfigError, MissingInputsError)
Hook = TypeVar("Hook", bound=Callable[..., Any])
_REFUSAL_TYPES: dict[type, type] = {}


def as_refusal(error: Exception) -> Exception:
    """``error`` as an instance of its own type and of ``click.ClickException``: the same
    message, shown by the CLI as ``Error: <message>``."""
    kind = type(error)
    if kind not in _REFUSAL_TYPES:
        _REFUSAL_TYPES[kind] = type(kind.__name__, (kind, click.ClickException), {})
    refusal = _REFUSAL_TYPES[kind](*error.args)
    # The exception's own __init__ ran, not ClickException's, which sets what click shows.
    click.ClickException.__init__(refusal, str(error))
    return refusal


def refuses(hook: Hook) -> Hook:
    """``hook`` with its ConfigError / MissingInputsError raised as :func:`as_refusal`."""

    @functools.wraps(hook)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except REFUSED as error:
            if isinstance(error, click.ClickException):
                raise
            raise as_refusal(error) from None

    return checked  # type: ignore[return-value]
