"""Group-relative advantages: GRPO's z-score (docs/methods/grpo.md) and TAPO's step-level split (docs/methods/tapo.md).

Shapes: ``B`` completions in a batch, laid out as consecutive groups of ``G`` samples of
the same prompt (``B = prompts * G``); ``S`` segments per completion; ``T`` tokens.
"""

import torch

from creditflow.algorithms._validate import check_ndim, check_same_shape, check_unit_interval

# Threshold below which a segment advantage counts as zero for the sign-conflict rate (docs/methods/tapo.md).
_NONZERO_ADVANTAGE = 1e-8


def group_zscore(
    rewards: torch.Tensor, group_size: int, eps: float = 1e-6, scale_by_std: bool = True
) -> torch.Tensor:
    """GRPO's group-relative advantage ``(R - mean) / (std + eps)`` (docs/methods/grpo.md).

    Args:
        rewards: ``(B,)`` scalar rewards, ``B`` a multiple of ``group_size``; entries
            ``g*G .. g*G + G - 1`` are the ``G`` samples of prompt ``g``.
        group_size: ``G``, samples per prompt.
        eps: added to the unbiased (n - 1) standard deviation.
        scale_by_std: False returns ``R - mean`` (Dr. GRPO, Liu et al. 2025; TRL's
            ``scale_rewards="none"``). Dividing by the group std gives a group whose
            rewards differ by noise (chrF++ 0.50 vs 0.52) the same weight as one where a
            sample solved the problem; without it, each group weighs by its reward spread.

    Returns:
        ``(B,)`` advantages. A group whose rewards are all equal, and every group when
        ``G = 1``, gets exactly 0 (never NaN): it carries no learning signal.

    >>> group_zscore(torch.tensor([1.0, 0.0, 1.0, 1.0]), group_size=2)
    tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
    >>> group_zscore(torch.tensor([1.0, 0.0, 0.2, 0.1]), group_size=2, scale_by_std=False)
    tensor([ 0.5000, -0.5000,  0.0500, -0.0500])
    """
    check_ndim("rewards", rewards, 1, "(B,)")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"the batch of {rewards.numel()} rewards must be divisible by group_size "
            f"(got group_size={group_size}); pass B = prompts * G completions"
        )
    if not rewards.is_floating_point():
        rewards = rewards.float()
    if group_size == 1:
        return torch.zeros_like(rewards)
    grouped = rewards.view(-1, group_size)  # (B/G, G)
    mean = grouped.mean(dim=1, keepdim=True)
    advantages = grouped - mean
    if scale_by_std:
        advantages = advantages / (grouped.std(dim=1, unbiased=True, keepdim=True) + eps)
    # mean() of equal floats can be off by an ulp, leaving a tiny residual / tiny std;
    # force the constant-group case to an exact 0 as docs/methods/grpo.md requires.
    constant = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    advantages = advantages.masked_fill(constant, 0.0)
    return advantages.view(-1)  # (B,)


def decoupled_group_advantages(
    rewards: torch.Tensor,
    weights: torch.Tensor,
    group_size: int,
    eps: float = 1e-4,
    batch_scale: bool = True,
) -> torch.Tensor:
    """GDPO's advantage (Liu et al. 2026, arXiv 2601.05242; docs/methods/gdpo.md): each reward
    z-scored within its group on its own, the z-scores summed with the rewards' weights, and
    the sum z-scored over the batch.

    Summing first and normalising after (GRPO) lets a reward with a wide spread drown the
    others, and two completions that differ in different rewards can get the same advantage;
    normalising each reward first keeps every reward's differences in the signal.

    Args:
        rewards: ``(B, K)``, ``K`` named rewards of ``B`` completions, groups of ``G``
            consecutive rows.
        weights: ``(K,)`` the rewards' weights.
        group_size: ``G``.
        eps: added to each standard deviation (unbiased, n - 1), as TRL does (1e-4).
        batch_scale: z-score the weighted sum over the batch (the paper's and TRL's
            ``normalize_then_sum``); False keeps the sum of the group z-scores.

    Returns:
        ``(B,)`` advantages. A reward that is constant within a group adds 0 for that group.

    Group 1's completions each win one reward (a tie: GRPO's sum would say so too); group 2's
    first wins both:

    >>> r = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    >>> decoupled_group_advantages(r, torch.tensor([1.0, 1.0]), 2, batch_scale=False)
    tensor([ 0.0000,  0.0000,  1.4140, -1.4140])
    """
    check_ndim("rewards", rewards, 2, "(B, K)")
    check_ndim("weights", weights, 1, "(K,)")
    B, K = rewards.shape
    if group_size < 2 or B % group_size != 0:
        raise ValueError(
            f"GDPO needs groups of at least 2 completions and B = prompts * G; got B={B}, "
            f"group_size={group_size}"
        )
    if weights.numel() != K:
        raise ValueError(f"{K} rewards but {weights.numel()} weights")
    grouped = rewards.double().view(-1, group_size, K)  # (B/G, G, K)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    per_reward = centred / (grouped.std(dim=1, unbiased=True, keepdim=True) + eps)
    total = (per_reward.view(B, K) * weights.double()).sum(dim=1)  # (B,)
    if batch_scale and B > 1:
        total = (total - total.mean()) / (total.std(unbiased=True) + eps)
    return total.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def tapo_advantages(
    r_trans: torch.Tensor,
    r_reason: torch.Tensor,
    group_size: int,
    alpha: float,
    scale_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TAPO's step-level relative advantages (docs/methods/tapo.md).

    Args:
        r_trans: ``(B,)`` translation rewards (format-masked chrF++ / 100).
        r_reason: ``(B,)`` reasoning rewards in {0, 1}.
        group_size: ``G``.
        alpha: weight of the translation advantage on translation tokens, in [0, 1].
        scale_by_std: passed to ``group_zscore`` for both rewards (False: centred only).

    Returns:
        ``(adv_translation, adv_reasoning)``, both ``(B,)``:
        ``alpha * A_trans + (1 - alpha) * A_reason`` for the translation segment and
        ``A_reason`` for the reasoning segment.
    """
    check_unit_interval("alpha", alpha)
    check_ndim("r_trans", r_trans, 1, "(B,)")
    check_same_shape(r_trans=r_trans, r_reason=r_reason)
    a_trans = group_zscore(r_trans, group_size, scale_by_std=scale_by_std)
    a_reason = group_zscore(r_reason, group_size, scale_by_std=scale_by_std)
    return alpha * a_trans + (1.0 - alpha) * a_reason, a_reason


def segment_token_advantages(
    segment_advantages: torch.Tensor, segment_ids: torch.Tensor
) -> torch.Tensor:
    """Spread per-segment advantages onto tokens.

    Args:
        segment_advantages: ``(B, S)``; column ``s`` is the advantage of segment ``s``
            (TAPO: ``S = 2``, 0 = translation, 1 = reasoning).
        segment_ids: ``(B, T)`` integer segment of each token; -1 marks padding.

    Returns:
        ``(B, T)`` with ``out[b, t] = segment_advantages[b, segment_ids[b, t]]`` and 0
        on padding.

    >>> segment_token_advantages(torch.tensor([[0.5, -1.0]]), torch.tensor([[0, 0, 1, -1]]))
    tensor([[ 0.5000,  0.5000, -1.0000,  0.0000]])
    """
    check_ndim("segment_advantages", segment_advantages, 2, "(B, S)")
    check_ndim("segment_ids", segment_ids, 2, "(B, T)")
    if segment_ids.shape[0] != segment_advantages.shape[0]:
        raise ValueError(
            f"segment_advantages (B, S) {tuple(segment_advantages.shape)} and segment_ids "
            f"(B, T) {tuple(segment_ids.shape)} disagree on B"
        )
    num_segments = segment_advantages.shape[1]
    if segment_ids.numel() and (
        int(segment_ids.min()) < -1 or int(segment_ids.max()) >= num_segments
    ):
        raise ValueError(
            f"segment ids must lie in [0, {num_segments - 1}] or be -1 for padding, got "
            f"values in [{int(segment_ids.min())}, {int(segment_ids.max())}]"
        )
    padding = segment_ids < 0
    token_adv = segment_advantages.gather(1, segment_ids.clamp(min=0).long())  # (B, T)
    return token_adv.masked_fill(padding, 0.0)


def sign_conflict_rate(r_trans: torch.Tensor, r_reason: torch.Tensor, group_size: int) -> float:
    """Share of segments whose own advantage disagrees in sign with the trajectory's (docs/methods/tapo.md).

    Over all (completion i, segment) pairs with a non-zero segment advantage
    (``A_trans_i`` for the translation segment, ``A_reason_i`` for the reasoning one),
    the fraction where ``A_seg * zscore(r_trans + r_reason)_i <= 0``: the segments that
    the trajectory-level "GRPO-sum" baseline pushes in the wrong direction.

    Args:
        r_trans: ``(B,)`` translation rewards.
        r_reason: ``(B,)`` reasoning rewards.
        group_size: ``G``.

    Returns:
        The rate in [0, 1]; 0.0 when no segment advantage is non-zero.
    """
    check_ndim("r_trans", r_trans, 1, "(B,)")
    check_same_shape(r_trans=r_trans, r_reason=r_reason)
    segment_adv = torch.stack(
        [group_zscore(r_trans, group_size), group_zscore(r_reason, group_size)], dim=1
    )  # (B, 2)
    trajectory_adv = group_zscore(r_trans + r_reason, group_size)  # (B,)
    counted = segment_adv.abs() > _NONZERO_ADVANTAGE
    conflict = counted & (segment_adv * trajectory_adv[:, None] <= 0)
    num_counted = int(counted.sum())
    if num_counted == 0:
        return 0.0
    return int(conflict.sum()) / num_counted


def shuffle_group_advantages(
    advantages: torch.Tensor, group_size: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """A control that must not learn: every group's advantages moved to another group.

    The groups are put in a random order ``sigma`` and group ``sigma[k]`` receives the
    advantages of group ``sigma[k + 1]`` (the last receives the first's): a random cyclic
    derangement, so no completion keeps an advantage of its own group, each group's
    advantages still sum to zero and the batch keeps exactly the same multiset of values.
    A completion's advantage is then unrelated to its own reward, so the expected policy
    gradient carries no signal about the task (only noise of the same size as GRPO's).

    Args:
        advantages: ``(B,)`` per-completion advantages, consecutive groups of ``G``.
        group_size: ``G``.
        generator: seeds the group order (None: torch's global generator).

    Returns:
        ``(B,)``; row ``j`` of a group holds row ``j`` of its source group.

    >>> shuffle_group_advantages(torch.tensor([1.0, -1.0, 2.0, -2.0]), 2)
    tensor([ 2., -2.,  1., -1.])
    """
    check_ndim("advantages", advantages, 1, "(B,)")
    if group_size < 1 or advantages.numel() % group_size != 0:
        raise ValueError(
            f"the batch of {advantages.numel()} advantages must be divisible by group_size "
            f"(got group_size={group_size})"
        )
    n_groups = advantages.numel() // group_size
    if n_groups < 2:
        raise ValueError(
            f"shuffling advantages across groups needs at least 2 groups, got {n_groups}"
        )
    grouped = advantages.view(n_groups, group_size)  # (B/G, G)
    order = torch.randperm(n_groups, generator=generator)  # sigma
    source = torch.empty_like(order)
    source[order] = order.roll(-1)  # group sigma[k] reads group sigma[k + 1]
    return grouped[source.to(advantages.device)].reshape(-1)  # (B,)
