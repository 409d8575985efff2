"""LoRA adapters on a policy through ``peft``, an optional extra (``pip install
'creditflow[lora]'``; ``make test`` installs it): ``policy.lora`` in a policy spec.

Only the adapter weights train. What else changes with an adapter, each in one place:

- the GRPO KL reference is the policy with its adapters disabled
  (``training.reference.frozen_reference``), so the weights are held once;
- a catalog model dataset saves the adapter (``save_lora``: ``adapter_config.json`` and
  ``adapter_model.safetensors``, peft's layout), plus the base model under ``base/`` when the
  base cannot be loaded again by its name (a tiny policy built in memory); ``load_lora``
  reads it back with trainable adapters;
- a resumable checkpoint holds the adapter weights only (``adapter_state_dict``): the base
  never changes, and the run's fingerprint covers it.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from creditflow.config.policy import LoraSpec

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"  # peft's file names
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_DIR = "base"


def require_peft() -> Any:
    """The ``peft`` module, or an ImportError that says how to install it."""
    try:
        import peft  # noqa: PLC0415 - optional dependency
    except ImportError as error:
        raise ImportError(
            "policy.lora needs peft, an optional dependency: install it with "
            "`pip install -c constraints.txt -e '.[lora]'` (`make test` installs it), or set "
            "lora to null"
        ) from error
    return peft


def peft_config(spec: LoraSpec) -> Any:
    """The ``peft.LoraConfig`` of ``spec`` (no task type: the model's own forward and ``generate`` run
    unchanged, for a causal LM and a vision-language model alike)."""
    peft = require_peft()
    targets = spec.target_modules
    return peft.LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
    )


def add_lora(model: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    """``model`` wrapped in a ``peft.PeftModel`` with fresh adapters (the base's weights are
    shared, not copied, and frozen); the adapters' ``B`` starts at 0, so the wrapped model
    computes exactly what ``model`` did.

    Raises:
        ValueError: ``target_modules`` matches no module of ``model``.
    """
    peft = require_peft()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            wrapped = peft.get_peft_model(model, peft_config(spec))
    except ValueError as error:
        raise ValueError(
            f"lora target_modules {spec.target_modules!r} do not fit "
            f"{type(model).__name__}: {error}"
        ) from error
    trainable, total = trainable_parameters(wrapped)
    logger.info(
        "LoRA on %s (r=%d, alpha=%g, target_modules=%s): %d trainable parameters of %d (%.2f%%)",
        type(model).__name__,
        spec.r,
        spec.alpha,
        spec.target_modules,
        trainable,
        total,
        100 * trainable / total,
    )
    return wrapped


def trainable_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts of ``model`` (a tied weight counted once)."""
    parameters = list(model.parameters())  # unique tensors: tied ones appear once
    return sum(p.numel() for p in parameters if p.requires_grad), sum(p.numel() for p in parameters)


def is_lora_model(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a ``peft.PeftModel``. A PeftModel exists only once peft has been
    imported, so a run without LoRA never imports it here."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(module, peft.PeftModel)


@contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` as its base model inside the block: peft's ``disable_adapter``."""
    with model.disable_adapter():
        yield


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors that train in a LoRA model (its adapters), keyed as in ``model.state_dict()``."""
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    return {name: t for name, t in model.state_dict().items() if name in trainable}


def load_adapter_state_dict(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy ``adapter_state_dict`` tensors into ``model``; the keys must be exactly its
    adapter's (checked before anything is copied)."""
    expected = set(adapter_state_dict(model))
    if set(tensors) != expected:
        missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise ValueError(
            f"adapter weights do not fit the model: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]} ({len(missing)} and {len(unexpected)} in all)"
        )
    model.load_state_dict(dict(tensors), strict=False)


def save_lora(model: torch.nn.Module, directory: str | Path, **save_args: Any) -> None:
    """Save a LoRA model as peft does (``adapter_config.json``, ``adapter_model.safetensors``),
    and its base model under ``base/`` when the adapter config names no checkpoint the base
    can be loaded from again (a tiny policy built in memory, or one read from a ``base/``)."""
    directory = Path(directory)
    model.save_pretrained(directory, **save_args)
    if model.peft_config[model.active_adapter].base_model_name_or_path is None:
        # unload() strips the adapter layers off in place: strip a copy's, not the policy's.
        base = copy.deepcopy(model).unload()
        base.save_pretrained(directory / BASE_DIR, **save_args)


def is_lora_directory(directory: str | Path) -> bool:
    """Whether ``directory`` holds a ``save_lora`` adapter."""
    return (Path(directory) / ADAPTER_CONFIG).is_file()


def load_lora(
    directory: str | Path, load_base: Callable[[str], torch.nn.Module]
) -> torch.nn.Module:
    """The LoRA model ``save_lora`` wrote, with trainable adapters.

    Args:
        directory: a ``save_lora`` directory.
        load_base: ``name_or_path -> model``, the base model's ``from_pretrained`` with the
            caller's load options; called with ``directory/base`` when it exists, else with
            the checkpoint the adapter config names.
    """
    peft = require_peft()
    directory = Path(directory)
    carried = directory / BASE_DIR
    if carried.is_dir():
        base = load_base(str(carried))
        # As a base built in memory (name ""), so a model saved from this one carries its
        # base again instead of naming a folder inside this artifact.
        base.name_or_path = ""
    else:
        config = peft.PeftConfig.from_pretrained(str(directory))
        if not config.base_model_name_or_path:
            raise ValueError(
                f"LoRA adapter in {directory} has neither a base/ model nor a "
                f"base_model_name_or_path in {ADAPTER_CONFIG}"
            )
        base = load_base(config.base_model_name_or_path)
    return peft.PeftModel.from_pretrained(base, str(directory), is_trainable=True).eval()
