"""VPPO, visually-perceptive policy optimization (Huang et al., "Spotlight on Token
Perception for Multimodal Reinforcement Learning", arXiv 2510.09285; docs/methods/vppo.md):
each completion token's dependence on the picture is measured by how much its log-probability
changes when the picture is degraded, and used twice: a completion's mean dependence scales its
advantage (trajectory-level shaping), and only its most dependent tokens keep a policy
gradient (token-level filtering). As the authors' code does, both land on the per-token loss,
so they are token weights here: ``w = scale_i * top_i,t``.

Pure functions on ``(B, T)`` tensors; ``mask`` is 1 where a token counts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from creditflow.algorithms._validate import check_same_shape


def visual_dependency(degraded_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """(B, T) the k3 estimate ``exp(d) - d - 1`` with ``d = degraded_logp - logp`` clamped to
    [-20, 20], the result to [0, 10] (the authors' low-variance KL): 0 where the degraded
    picture changes nothing, growing as it does.

    >>> visual_dependency(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.0, -1.0]]))
    tensor([[0.0000, 0.3679]])
    """
    check_same_shape(degraded_logp=degraded_logp, logp=logp)
    d = (degraded_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1).clamp(0.0, 10.0)


def top_share_per_row(scores: torch.Tensor, mask: torch.Tensor, share: float) -> torch.Tensor:
    """(B, T) bool: in each row, its ``ceil(share * n)`` valid tokens of largest score (``n``
    its valid tokens; ties keep the earlier position).

    >>> top_share_per_row(torch.tensor([[0.1, 0.9, 0.5, 0.7]]), torch.ones(1, 4), 0.5)
    tensor([[False,  True, False,  True]])
    """
    check_same_shape(scores=scores, mask=mask)
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    valid = mask.bool()
    ranked = scores.masked_fill(~valid, float("-inf"))
    order = torch.sort(ranked, dim=1, descending=True, stable=True).indices  # (B, T)
    keep = torch.ceil(valid.sum(dim=1).double() * share).long()  # (B,)
    rank_kept = torch.arange(scores.shape[1], device=scores.device)[None] < keep[:, None]
    chosen = torch.zeros_like(valid)
    chosen.scatter_(1, order, rank_kept)
    return chosen & valid


def trajectory_scale(
    dependency: torch.Tensor,
    mask: torch.Tensor,
    scaling_min: float = 0.8,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """(B,) each completion's advantage scale: its mean dependency over its valid tokens,
    min-max normalised over the batch's completions to [0, 1], then mapped linearly to
    ``[scaling_min, scaling_min + (1 - scaling_min) / m]`` with ``m`` the mean normalised score
    (so the scales average 1 over the batch); all 1 when the batch's scores span less than
    1e-6. A completion without valid tokens keeps 1. ``gather`` ((n, 2) -> (N, 2)): every
    process's rows concatenated, when a process holds a share of the batch.

    >>> trajectory_scale(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.ones(2, 2), 0.8)
    tensor([0.8000, 1.2000], dtype=torch.float64)
    """
    check_same_shape(dependency=dependency, mask=mask)
    if not 0 <= scaling_min <= 1:
        raise ValueError(f"scaling_min must be in [0, 1], got {scaling_min}")
    valid = mask.bool()
    counts = valid.sum(dim=1)
    scores = torch.where(valid, dependency, torch.zeros_like(dependency)).sum(1).double()
    scores = scores / counts.clamp(min=1)  # (B,)
    scale = torch.ones_like(scores)
    has = counts > 0
    if gather is None:
        everyone = scores[has]
    else:  # every process's (score, has) rows: the processes may hold unequal counts of scores
        rows = gather(torch.stack([scores, has.double()], dim=1))  # (N, 2)
        everyone = rows[rows[:, 1] > 0, 0]
    if everyone.numel() < 2:
        return scale
    low, high = everyone.min(), everyone.max()
    if float(high - low) <= 1e-6:
        return scale
    mean = ((everyone - low) / (high - low)).clamp(0.0, 1.0).mean()
    normalised = ((scores[has] - low) / (high - low)).clamp(0.0, 1.0)
    top = scaling_min + (1.0 - scaling_min) / (mean + 1e-8)
    scale[has] = scaling_min + normalised * (top - scaling_min)
    return scale


def vppo_weights(
    degraded_logp: torch.Tensor,
    logp: torch.Tensor,
    mask: torch.Tensor,
    token_share: float = 0.2,
    scaling_min: float = 0.8,
    shaping: bool = True,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """VPPO's (B, T) token weights ``scale_i * top_i,t`` (``trajectory_scale`` times
    ``top_share_per_row`` of the ``visual_dependency``; scale 1 without ``shaping``) and the
    (B, T) dependency they come from."""
    dependency = visual_dependency(degraded_logp, logp) * mask
    chosen = top_share_per_row(dependency, mask, token_share)
    scale = (
        trajectory_scale(dependency, mask, scaling_min, gather)
        if shaping
        else torch.ones(mask.shape[0], dtype=torch.float64)
    )
    weights = chosen.to(logp.dtype) * scale.to(logp.dtype).to(logp.device)[:, None]
    return weights, dependency
