"""Rollout backends chosen by name: ``grpo.rollout: {name: ..., ...options}``.

``ROLLOUT_BACKENDS`` maps a name to ``module:Class``; a backend's module is imported only when
it is chosen (the ``vllm`` one needs an optional extra). A backend's options are its
constructor's keyword arguments, checked before anything is built.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from collections.abc import Mapping
from typing import Any

import torch

from creditflow.config.values import checked_options
from creditflow.errors import ConfigError, StaleWeightsError
from creditflow.rollout.backends.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    Generation,
    GenerationRequest,
    RolloutBackend,
    completion_mask_from_eos,
    finish_reasons,
    unsupported_reason,
)

logger = logging.getLogger(__name__)

ROLLOUT_BACKENDS: dict[str, str] = {
    "hf": "creditflow.rollout.backends.hf:HFBackend",
    "lean": "creditflow.rollout.backends.lean:LeanBackend",
    "vllm": "creditflow.rollout.backends.vllm:VLLMBackend",
}
# The backend every policy can fall back to.
FALLBACK_BACKEND = "hf"
# The (backend, model type, reason) fallbacks already logged: a run builds a backend for every
# evaluation, and one line per cause says all there is to say.
_logged_fallbacks: set[tuple[str, str, str]] = set()


def backend_class(name: str) -> type:
    """The class behind ``name`` (imports its module)."""
    if name not in ROLLOUT_BACKENDS:
        close = difflib.get_close_matches(str(name), list(ROLLOUT_BACKENDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown rollout backend {name!r}{hint}; valid: {sorted(ROLLOUT_BACKENDS)}"
        )
    module_name, class_name = ROLLOUT_BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def split_spec(spec: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """``(name, options)`` of a ``{name: ..., ...options}`` spec; None means ``hf``."""
    spec = dict(spec or {"name": FALLBACK_BACKEND})
    if "name" not in spec:
        raise ConfigError(
            f"rollout needs a `name`, one of {sorted(ROLLOUT_BACKENDS)}; got keys {sorted(spec)}"
        )
    name = spec.pop("name")
    return name, spec


def check_rollout_spec(spec: Mapping[str, Any] | None) -> None:
    """ConfigError naming the key when ``spec`` names no backend or an option it lacks."""
    name, options = split_spec(spec)
    try:
        checked_options(options, backend_class(name), f"rollout backend {name!r}")
    except ValueError as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(str(error)) from error


def rollout_backend(
    spec: Mapping[str, Any] | None, module: torch.nn.Module | None = None
) -> RolloutBackend:
    """The backend ``spec`` names, built with its options; when ``module`` is given and the
    backend cannot sample from it (``unsupported_reason``), the ``hf`` backend instead, with
    one log line saying why (once per backend, model type and reason in a process)."""
    check_rollout_spec(spec)
    name, options = split_spec(spec)
    backend = backend_class(name)(**options)
    if module is not None and name != FALLBACK_BACKEND:
        reason = unsupported_reason(backend, module)
        if reason is not None:
            key = (name, type(module).__name__, reason)
            if key not in _logged_fallbacks:
                _logged_fallbacks.add(key)
                logger.info(
                    "rollout backend %r does not support %s (%s): sampling with %r instead",
                    *key,
                    FALLBACK_BACKEND,
                )
            return backend_class(FALLBACK_BACKEND)()
    return backend


__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "ROLLOUT_BACKENDS",
    "Generation",
    "GenerationRequest",
    "RolloutBackend",
    "StaleWeightsError",
    "backend_class",
    "check_rollout_spec",
    "completion_mask_from_eos",
    "finish_reasons",
    "rollout_backend",
    "unsupported_reason",
]
