"""The GRPO engine's memory settings checked and applied before training: activation
checkpointing on the trained model and the device check for bfloat16 autocast."""

from __future__ import annotations

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
    device_type = next(module.parameters()).device.type
    if config.bf16 and not supports_bf16(device_type):
        raise ConfigError(
            f"bf16 is set but this {device_type} device has no bfloat16 support; set bf16 to false"
        )
    return device_type


def supports_bf16(device_type: str) -> bool:
    """Whether autocast can run in bfloat16 on this kind of device."""
    if device_type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.amp.is_autocast_available(device_type)
