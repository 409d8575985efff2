"""DAPO's batch-side techniques in the GRPO loop (Yu et al., arXiv 2503.14476): dynamic
sampling (``fill_batch``), the soft overlong punishment and the masking of truncated
completions (``shape_batch``). The pure parts are ``algorithms.constant_groups`` and
``algorithms.overlong_penalty``; this module applies them to a rollout batch and its rewards.

Shape symbols: ``B`` completions (prompts x ``G``), ``G`` group size, ``T`` completion tokens.
Rewards are name -> ``(B,)``, groups consecutive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from creditflow.algorithms import constant_groups, overlong_penalty
from creditflow.config.grpo import DynamicSampling, GRPOConfig
from creditflow.rollout.batch import RolloutBatch, concat_batches

Rewards = dict[str, torch.Tensor]
# (offset, n_prompts) -> the batch of n_prompts * G completions of the step's prompts from
# position `offset` of its prompt order on, and their rewards.
Draw = Callable[[int, int], tuple[RolloutBatch, Rewards]]


@dataclass
class _Groups:
    """Some whole groups of one draw, with their rewards."""

    batch: RolloutBatch
    rewards: Rewards

    @classmethod
    def pick(cls, batch: RolloutBatch, rewards: Rewards, groups: torch.Tensor) -> _Groups:
        G = batch.group_size
        rows = (groups.unsqueeze(1) * G + torch.arange(G)).flatten()  # (len(groups) * G,)
        return cls(batch.select(rows), {name: value[rows] for name, value in rewards.items()})

    @property
    def n_groups(self) -> int:
        return self.batch.batch_size // self.batch.group_size


def fill_batch(
    draw: Draw, spec: DynamicSampling, prompts_per_step: int
) -> tuple[RolloutBatch, Rewards, dict[str, float]]:
    """DAPO's dynamic sampling (section 3.2): draw ``prompts_per_step`` prompts, drop the
    groups whose success (``rewards[spec.reward] >= spec.success``) is the same on every
    completion, and draw as many more prompts as groups are missing, until the batch holds
    ``prompts_per_step`` groups or ``spec.max_extra_rollouts`` more completions have been drawn.
    A batch still short then takes back dropped groups, first dropped first, so its size never
    changes (minibatches and micro-batches still divide it).

    Args:
        draw: see ``Draw``; called with offsets 0, prompts_per_step, ... .
        spec: the checked ``GRPOConfig.dynamic_sampling`` (``max_extra_rollouts`` set).
        prompts_per_step: the groups a batch holds.

    Returns:
        ``(batch, rewards, metrics)``: the informative groups in draw order, then any taken
        back; metrics ``dynamic_sampling/dropped_groups`` (constant groups drawn),
        ``dynamic_sampling/extra_rollouts`` (completions drawn beyond the first batch),
        ``dynamic_sampling/draws`` and ``dynamic_sampling/filled_groups`` (constant groups
        taken back).
    """
    kept: list[_Groups] = []
    dropped: list[_Groups] = []
    missing, offset, extra, draws, count = prompts_per_step, 0, 0, 0, prompts_per_step
    while count >= 1:
        batch, rewards = draw(offset, count)
        if offset:
            extra += batch.batch_size
        offset, draws = offset + count, draws + 1
        constant = constant_groups(rewards[spec.reward] >= spec.success, batch.group_size)
        informative = (~constant).nonzero().flatten()[:missing]  # (<= missing,)
        kept.append(_Groups.pick(batch, rewards, informative.cpu()))
        dropped.append(_Groups.pick(batch, rewards, constant.nonzero().flatten().cpu()))
        missing -= len(informative)
        count = min(missing, (spec.max_extra_rollouts - extra) // batch.group_size)
    filled = missing  # the first draw alone holds prompts_per_step groups: enough to fill
    for part in dropped:
        take = min(missing, part.n_groups)
        if take:
            kept.append(_Groups.pick(part.batch, part.rewards, torch.arange(take)))
            missing -= take
    parts = [part for part in kept if part.batch.batch_size]
    rewards = {name: torch.cat([p.rewards[name] for p in parts]) for name in parts[0].rewards}
    metrics = {
        "dynamic_sampling/dropped_groups": float(sum(p.n_groups for p in dropped)),
        "dynamic_sampling/extra_rollouts": float(extra),
        "dynamic_sampling/draws": float(draws),
        "dynamic_sampling/filled_groups": float(filled),
    }
    return concat_batches([p.batch for p in parts]), rewards, metrics


def shape_batch(
    batch: RolloutBatch, rewards: Rewards, config: GRPOConfig
) -> tuple[Rewards, dict[str, float]]:
    """The rewards the strategies read and the batch the loss sees, after DAPO's reward
    shaping: ``config.overlong`` adds ``algorithms.overlong_penalty`` of each completion's
    length to its reward ``overlong.reward``; ``config.mask_truncated_completions`` zeroes
    the ``completion_mask`` of truncated completions, in place, so they count nowhere in the
    loss, the token weights or the token-mean denominators (their rewards still enter their
    group's advantages, as in TRL).

    Returns:
        ``(rewards, metrics)``: the shaped rewards (``rewards`` itself when nothing shapes
        them) and ``reward/overlong`` (mean penalty) / ``completion/truncated_frac``.
    """
    metrics: dict[str, float] = {}
    overlong = config.overlong_shaping()
    if overlong is not None:
        lengths = batch.completion_mask.sum(dim=1)  # (B,) tokens, the stop token included
        penalty = overlong_penalty(
            lengths, config.max_new_tokens, overlong.buffer, overlong.penalty_factor
        )  # (B,)
        target = rewards[overlong.reward]
        rewards = {**rewards, overlong.reward: target + penalty.to(target.dtype)}
        metrics["reward/overlong"] = penalty.mean().item()
    if config.mask_truncated_completions:
        if batch.truncated is None:
            raise ValueError(
                "mask_truncated_completions needs a policy that reports truncated "
                "completions (RolloutBatch.truncated); this one does not: set it to false"
            )
        finished = (~batch.truncated).to(batch.completion_mask.dtype)  # (B,)
        batch.completion_mask = batch.completion_mask * finished.unsqueeze(1)  # (B, T)
        metrics["completion/truncated_frac"] = batch.truncated.float().mean().item()
    return rewards, metrics
