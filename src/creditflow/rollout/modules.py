"""The pieces of a ``transformers`` model that the policies, the shared-prefix scorer and the
rollout backends all reach for: the bare module inside a DDP wrapper, the output head and its
inputs."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

# Config fields of models whose forward changes the logits after the LM head.
LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "lm_head_multiplier",
    "output_multiplier",
)


def bare_module(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside a ``DistributedDataParallel`` wrapper (the trainer routes the update's
    forward through one), else ``module`` itself."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        return module.module
    return module


def base_model(module: torch.nn.Module) -> torch.nn.Module:
    """The ``transformers`` model that computes ``module``'s forward: ``bare_module``, then
    the model inside a ``peft`` wrapper (its adapter layers in place), else that module."""
    model = bare_module(module)
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def output_head(module: torch.nn.Module) -> torch.nn.Linear:
    """The linear LM head of a ``transformers`` model: it maps the final hidden states to the
    logits (tied to the input embedding in Qwen2.5's small checkpoints)."""
    model = bare_module(module)
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(
            f"{type(model).__name__}'s output head is {type(head).__name__}, not a "
            "torch.nn.Linear; chunked scoring (algorithms.token_logprobs) needs a linear head"
        )
    # output_head_inputs skips the head inside forward(); a model that transforms the logits
    # after its head (Gemma 2's soft-capping, Cohere's or Granite's scaling) would then be
    # scored without that transform.
    config = model.config.get_text_config()
    transforms = [name for name in LOGIT_TRANSFORMS if getattr(config, name, None) is not None]
    if transforms:
        raise ValueError(
            f"{type(model).__name__} transforms its logits after the head ({transforms}); "
            "chunked scoring (algorithms.token_logprobs) does not support it"
        )
    return head


def output_head_inputs(module: torch.nn.Module, **inputs: Any) -> torch.Tensor:
    """``module(**inputs)`` run up to its output head: the ``(B, K, H)`` hidden states the head
    would have projected (``logits_to_keep`` in ``inputs`` picks the K positions).

    A forward pre-hook on the head keeps the head's input and hands the head an empty slice of
    it, so the forward still goes through ``module`` (and a DDP wrapper's hooks) but no
    ``(B, K, V)`` logits are computed; the hidden states stay in the autograd graph.
    """
    captured: list[torch.Tensor] = []

    def keep_input(head: torch.nn.Module, args: tuple) -> tuple:
        hidden = args[0]
        captured.append(hidden)
        return (hidden[..., :0, :], *args[1:])  # the head projects no position

    handle = output_head(module).register_forward_pre_hook(keep_input)
    try:
        out = module(**inputs)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"the output head ran {len(captured)} times in one forward, not once")
    hidden = captured[0]
    if isinstance(module, FSDPModule) and out.logits.requires_grad:
        # FSDP2 starts its backward (and queues the gradients' reduce-scatter) from hooks on
        # the module's outputs; the loss reaches the parameters through the head's input
        # instead, so the (empty) logits are tied into the graph: a zero that runs the hooks.
        hidden = hidden + out.logits.sum() * 0
    return hidden
