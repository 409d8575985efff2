"""The frozen reference policy of GRPO's KL term (docs/methods/grpo.md), built when ``beta > 0``.

Shape symbols: ``B`` sequences, ``T`` completion tokens.
"""

from __future__ import annotations

import copy

import torch

from creditflow.models.lora import adapters_disabled, is_lora_model
from creditflow.rollout.batch import Policy, RolloutBatch


class AdapterDisabledReference:
    """A LoRA policy's reference: the policy itself with its adapters switched off, i.e. the
    base model the adapters train on. It shares the policy's weights, so no second copy of
    them is held (TRL's GRPOTrainer does the same with peft's ``disable_adapter``); the
    adapters start at zero, so this is exactly the initial policy.

    Only ``module`` and ``completion_logprobs`` are offered: a reference is never sampled.
    """

    def __init__(self, policy: Policy):
        self.policy = policy

    @property
    def module(self) -> torch.nn.Module:
        return self.policy.module

    def completion_logprobs(
        self, batch: RolloutBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T) log-probs of the completion tokens under the base model (and on request the
        (B, T) top-p entropy), computed by the policy's own scoring path."""
        with adapters_disabled(self.policy.module):
            return self.policy.completion_logprobs(batch, with_entropy)


def frozen_reference(policy: Policy) -> Policy | AdapterDisabledReference:
    """The KL reference for ``policy``: its base with the adapters disabled when its module
    is a LoRA (peft) model, else a frozen copy of the policy as it is now."""
    if is_lora_model(policy.module):
        return AdapterDisabledReference(policy)
    reference = copy.deepcopy(policy)
    reference.module.requires_grad_(False).eval()
    return reference
