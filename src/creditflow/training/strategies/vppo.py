"""VPPO (docs/methods/vppo.md): the completions' visual dependency (how much each token's
log-probability changes without the picture) scales each completion's advantage and keeps only
its most dependent tokens in the gradient (``algorithms.vppo``), as token weights."""

from __future__ import annotations

import time
from typing import Any

import torch
from pydantic import Field

from creditflow.algorithms import vppo_weights
from creditflow.config.grpo import GRPOConfig
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.strategies.base import (
    Metrics,
    Spec,
    StrategyOptions,
    TokenWeightStrategy,
    WeightContext,
    parse_options,
)
from creditflow.training.strategies.tor import gather_processes, no_image_logprobs


class VPPOOptions(StrategyOptions):
    """The options of ``vppo`` (the authors' defaults)."""

    token_share: float = Field(
        0.2, gt=0, le=1, description="the share of each completion's tokens kept (top dependency)"
    )
    scaling_min: float = Field(
        0.8, ge=0, le=1, description="the smallest advantage scale (the least dependent completion)"
    )
    shaping: bool = Field(
        True,
        description="scale each completion's advantage by its mean dependency (false: filter only)",
    )


def vppo_options(spec: Spec) -> VPPOOptions:
    return parse_options(spec, VPPOOptions, "token_weights")


def vppo_token_weights(
    spec: Spec, batch: RolloutBatch, policy: Any, context: WeightContext
) -> tuple[torch.Tensor, Metrics]:
    """VPPO's token weights for a rollout batch, the dependency measured against the policy's
    pass without the picture (``no_image_logprobs``). -> (B, T)"""
    options = vppo_options(spec)
    started = time.perf_counter()
    without = no_image_logprobs(policy, batch, "VPPO")  # (B, T)
    accelerator = context.accelerator
    gather = None
    if accelerator is not None and accelerator.num_processes > 1:  # the batch's range, all shares

        def gather(rows: torch.Tensor) -> torch.Tensor:
            return gather_processes(accelerator, rows)

    weights, dependency = vppo_weights(
        without,
        batch.old_logp.detach(),
        batch.completion_mask,
        options.token_share,
        options.scaling_min,
        options.shaping,
        gather,
    )
    valid = batch.completion_mask.bool()
    return weights, {
        "weights/vppo_kept": float((weights > 0)[valid].float().mean()),
        "weights/vppo_dependency": float(dependency[valid].mean()),
        "time/vppo_weights_s": time.perf_counter() - started,
    }


def validate_vppo(spec: Spec, config: GRPOConfig) -> None:
    vppo_options(spec)


VPPO = TokenWeightStrategy(
    vppo_token_weights,
    validate_vppo,
    needs_rollout_logprobs=True,
    needs_image_pass=True,
    image_pass_fallback="VPPO measures each token's dependence on the picture",
)
