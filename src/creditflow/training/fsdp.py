"""What FSDP2-sharded training needs beyond the forward and backward: whole state dicts for
checkpoints, a sharded optimizer's resume, and an unsharded model to hand back.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``, applied by ``accelerator.prepare``)
every parameter and every AdamW moment is a ``DTensor`` of which each process holds
``1/num_processes``. A checkpoint is written whole (one ``model.safetensors``, one optimizer
state keyed by parameter name), so it loads into any process count, into a one-process run,
or into ``from_pretrained``; torch's ``torch.distributed.checkpoint.state_dict`` does the
gathering and the re-sharding. Every function here is a collective: all processes call it,
in the same order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

# The optimizer state's layout in a checkpoint written under FSDP (torch's "full" state dict:
# keyed by parameter name, unsharded), which torch.optim's own load_state_dict cannot read.
FULL_OPTIMIZER_LAYOUT = "full_by_name"

# Whole tensors, gathered onto rank 0's CPU (the others get empty dicts): nothing is held on
# an accelerator beyond one parameter at a time.
_GATHER_TO_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state_dicts(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(model state, optimizer state)``, whole, on rank 0's CPU; empty dicts elsewhere."""
    model_state = get_model_state_dict(module, options=_GATHER_TO_RANK0)
    optimizer_state = get_optimizer_state_dict(module, optimizer, options=_GATHER_TO_RANK0)
    return model_state, optimizer_state


def load_full_optimizer_state(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Shard a whole optimizer state (``full_state_dicts``'s, read on every process) into
    ``optimizer``, whose parameters are ``module``'s shards (after ``prepare``)."""
    set_optimizer_state_dict(
        module, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True)
    )


def unsharded_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A plain (unsharded) copy of an FSDP2-sharded transformers model, on the CPU, on every
    process.

    Built on the meta device from the model's own class and config, then given the gathered
    parameters (one at a time: each process holds the whole model on its CPU, never on its
    accelerator), its buffers and its generation config; tied weights are tied again.
    ``module`` itself stays sharded.
    """
    cls = next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))
    with torch.device("meta"):
        plain = cls(module.config)
    # state_dict() would gather every parameter onto the accelerator before the CPU copy;
    # full_tensor() per parameter keeps that to one. Tied names are the same parameter.
    state = {
        name: _whole(tensor).cpu()
        for name, tensor in module.named_parameters(remove_duplicate=False)
    }
    plain.load_state_dict(state, strict=False, assign=True)
    for name, buffer in module.named_buffers():  # rotary frequencies: in no state dict
        owner, _, leaf = name.rpartition(".")
        plain.get_submodule(owner)._buffers[leaf] = buffer.detach().cpu().clone()
    if getattr(module.config, "tie_word_embeddings", False):
        plain.tie_weights()
    left_on_meta = [n for n, p in [*plain.named_parameters(), *plain.named_buffers()] if p.is_meta]
    if left_on_meta:
        raise RuntimeError(f"unsharded_copy left {left_on_meta} without values")
    if getattr(module, "generation_config", None) is not None:
        plain.generation_config = module.generation_config
    return plain


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()
