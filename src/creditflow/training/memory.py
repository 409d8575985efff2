"""The GRPO engine's memory settings checked and applied before training: activation
checkpointing on the trained model, the device check for bfloat16 autocast and a floor on a
rollout batch's memory against the device's."""

from __future__ import annotations

import os
from typing import Any

import torch

from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError


def prepare_memory(module: Any, config: GRPOConfig) -> str:
    """Gradient checkpointing on the trained ``module`` (not the reference, which never runs a
    backward) when ``config.gradient_checkpointing``; fails on ``config.bf16`` where the
    device has no bfloat16. Returns the module's device type (``cpu``, ``cuda``, ...)."""
    if config.gradient_checkpointing:
        if not hasattr(module, "activation_checkpointing_enable"):
            raise ConfigError(
                f"gradient_checkpointing needs a transformers model; the policy's module is "
                f"a {type(module).__name__}: set gradient_checkpointing to false"
            )
        # Non-reentrant: works with inputs that need no grad and with DDP; in eval mode
        # (generate, the rollout's scoring) transformers runs the layers plainly.
        module.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    device = next(module.parameters()).device
    device_type = device.type
    check_rollout_fits(config, vocab_size(module), device_memory_bytes(device))
    if config.bf16 and not supports_bf16(device_type):
        raise ConfigError(
            f"bf16 is set but this {device_type} device has no bfloat16 support; set bf16 to false"
        )
    return device_type


def rollout_floor_bytes(config: GRPOConfig, vocab: int) -> int:
    """A lower bound on what one rollout batch of this process allocates: B = prompts_per_step
    x group_size sequences, each with T = max_new_tokens completion tokens (ids, log-probs
    and mask: 8 + 4 + 4 bytes a token) and one decoding step's float32 logits over the
    vocabulary (4 V bytes a sequence). The model's own activations and KV cache come on top."""
    sequences = config.prompts_per_step * config.group_size
    return sequences * (16 * config.max_new_tokens + 4 * vocab)


def check_rollout_fits(config: GRPOConfig, vocab: int | None, memory: int | None) -> None:
    """ConfigError naming the keys when even :func:`rollout_floor_bytes` exceeds the device's
    ``memory`` (bytes), so an absurd group size fails now, naming ``group_size``, rather than
    as an allocator error deep in sampling. Nothing is checked when either is unknown."""
    if not vocab or not memory:
        return
    need = rollout_floor_bytes(config, vocab)
    if need > memory:
        sequences = config.prompts_per_step * config.group_size
        raise ConfigError(
            f"group_size ({config.group_size}) x prompts_per_step ({config.prompts_per_step}) "
            f"= {sequences:,} sequences a rollout need at least {need / 2**30:,.1f} GiB (their "
            f"{config.max_new_tokens} tokens and one step's logits over {vocab:,} tokens), more "
            f"than this device's {memory / 2**30:,.1f} GiB: lower group_size or prompts_per_step"
        )


def vocab_size(module: Any) -> int | None:
    """The vocabulary of a transformers model (its config, or its text config for a
    vision-language one); None for other modules."""
    config = getattr(module, "config", None)
    text = getattr(config, "text_config", None) or config
    return getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None)


def device_memory_bytes(device: torch.device) -> int | None:
    """The memory of ``device``: a GPU's total memory, or the machine's RAM for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # not on this platform
            return None
    return None


def supports_bf16(device_type: str) -> bool:
    """Whether autocast can run in bfloat16 on this kind of device."""
    if device_type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.amp.is_autocast_available(device_type)
