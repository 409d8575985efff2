"""Stop a training loop the moment a number goes non-finite, before the optimizer writes NaN
into the weights or a checkpoint saves them.

An infinite KL coefficient, a learning rate of 1e30 or a corrupt batch makes the loss NaN; the
clipped gradient is then NaN too, and one ``optimizer.step`` poisons every weight while the run
goes on and reports as usual. The checks cost a scalar comparison each step (loss, gradient
norm) and one pass over the weights after each GRPO step and before a checkpoint is written.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from creditflow.errors import NonFiniteTrainingError


class NonFiniteValue(FloatingPointError):
    """Raised inside a step (which does not know its step number or its run); the loop turns
    it into a :class:`NonFiniteTrainingError` that names both."""


def check_finite_scalar(name: str, value: float | torch.Tensor) -> None:
    """NonFiniteValue when ``value`` (a Python float or a 0-d tensor) is NaN or infinite."""
    number = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
    if not math.isfinite(number):
        raise NonFiniteValue(f"{name} is {number}")


def check_finite_scalars(values: dict[str, float | torch.Tensor]) -> None:
    """:func:`check_finite_scalar` on each named value."""
    for name, value in values.items():
        check_finite_scalar(name, value)


def check_update(loss: float, grad_norm: float | torch.Tensor, accelerator: Any = None) -> None:
    """NonFiniteValue when a GRPO update's loss or gradient norm is non-finite, checked before
    ``optimizer.step``: a non-finite gradient would write NaN into every weight. Under fp16
    mixed precision (an accelerator with a gradient scaler) an inf gradient is routine: the
    scaler skips that step itself, so only the loss is checked."""
    fp16 = getattr(accelerator, "scaler", None) is not None
    check_finite_scalars({"actor/loss": loss} | ({} if fp16 else {"actor/grad_norm": grad_norm}))


def first_non_finite_parameter(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first tensor holding a NaN or an infinity, or None when all are finite."""
    for name, tensor in named:
        # A sharded (FSDP) tensor is checked on this process's shard.
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if local.is_floating_point() and not bool(torch.isfinite(local.detach()).all()):
            return name
    return None


def check_finite_weights(module: torch.nn.Module, accelerator: Any = None) -> None:
    """NonFiniteValue naming the first non-finite weight of ``module`` (its parameters: a
    buffer such as an attention mask may hold -inf on purpose).

    With several processes (``accelerator``) every process raises when any one finds a
    non-finite weight: under FSDP each holds its own shards, and a process that stopped alone
    would leave the others waiting in the next collective until it timed out."""
    name = first_non_finite_parameter(module.named_parameters())
    if accelerator is not None and accelerator.num_processes > 1:
        found = torch.tensor([0.0 if name is None else 1.0], device=accelerator.device)
        if float(accelerator.reduce(found, reduction="sum")) > 0 and name is None:
            name = "(a shard held by another process)"
    if name is not None:
        raise NonFiniteValue(f"weight `{name}` holds NaN or inf")


def checkpoint_due(done: int, steps: int, every: int | None) -> bool:
    """Whether a loop writes a checkpoint after optimizer step ``done`` (1-based) of ``steps``:
    every ``every`` steps and after the last."""
    return done == steps or bool(every and done % every == 0)


def non_finite_error(
    problem: NonFiniteValue, step: int, run: str, checkpoints: Any
) -> NonFiniteTrainingError:
    """The error a loop raises for ``problem`` at optimizer step ``step`` (1-based) of ``run``;
    ``checkpoints``: the loop's ``CheckpointStore`` or None."""
    newest = checkpoints.latest() if checkpoints is not None else None
    kept = (
        f"the newest checkpoint, {newest}, was written before it and stays the newest"
        if newest is not None
        else "no checkpoint was written before it"
    )
    return NonFiniteTrainingError(
        f"{run}: training stopped at step {step}: {problem}; {kept}. Nothing non-finite was "
        "saved. Check the parameters that scale the loss (learning rate, beta/KL coefficient, "
        "reward weights, advantage options) and the data of that step"
    )
