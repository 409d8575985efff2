"""Clip-Cov and KL-Cov (Cui et al., "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models", arXiv 2505.22617; docs/methods/covariance.md): the tokens whose
log-probability and advantage covary most drive the policy's entropy down, so their update is
held back.

The covariance of a token is the centred product ``(A - mean A) * (logp - mean logp)``, the
means taken over the valid tokens of the loss call (one micro-batch, as verl computes it).
Clip-Cov leaves a random few of the tokens whose covariance lies in a band out of the policy
gradient; KL-Cov adds a penalty ``coef * |logp - old_logp|`` on the tokens of largest
covariance. Pure functions on ``(B, T)`` tensors; ``mask`` is 1 where a token counts.
"""

from __future__ import annotations

import torch

from creditflow.algorithms._validate import check_same_shape

COVARIANCE_CONTROLS = ("clip_cov", "kl_cov")


def token_covariance(
    logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """(B, T) each token's centred product ``(A - mean A)(logp - mean logp)`` (no gradient),
    the means over the valid tokens; padding positions hold ``-inf`` (never selected).

    >>> token_covariance(
    ...     torch.tensor([[-1.0, -3.0]]), torch.tensor([[2.0, 0.0]]), torch.tensor([[1, 1]])
    ... )
    tensor([[1., 1.]])
    """
    check_same_shape(logp=logp, advantages=advantages, mask=mask)
    valid = mask.bool()
    count = valid.sum().clamp(min=1)
    a = advantages.detach()
    lp = logp.detach()
    mean_a = torch.where(valid, a, torch.zeros_like(a)).sum() / count
    mean_lp = torch.where(valid, lp, torch.zeros_like(lp)).sum() / count
    covariance = (a - mean_a) * (lp - mean_lp)
    return covariance.masked_fill(~valid, float("-inf"))


def clip_cov_keep(
    covariance: torch.Tensor,
    mask: torch.Tensor,
    clipped: torch.Tensor,
    ratio: float,
    lower: float,
    upper: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Clip-Cov's selection: (B, T) 1 where a token keeps its policy gradient, 0 on the
    ``max(int(ratio * valid tokens), 1)`` tokens (at most) drawn at random among the valid,
    not already clipped ones whose covariance lies strictly between ``lower`` and ``upper``.

    covariance: (B, T) ``token_covariance``; mask, clipped: (B, T) (``clipped``: where the
    surrogate's own clip is active). ``generator``: the draw's random stream (None: torch's
    global one, as verl draws it). The draw is a random permutation of the candidates in
    row-major order, of which the first are taken.
    """
    check_same_shape(covariance=covariance, mask=mask, clipped=clipped)
    if ratio <= 0:
        raise ValueError(f"Clip-Cov's ratio must be > 0, got {ratio}")
    valid = mask.bool()
    in_band = (covariance > lower) & (covariance < upper) & valid & ~clipped.bool()
    candidates = in_band.nonzero()  # (C, 2), row-major
    wanted = max(int(ratio * valid.sum().item()), 1)
    keep = torch.ones_like(covariance)
    if len(candidates):
        order = torch.randperm(len(candidates), generator=generator)
        chosen = candidates[order[: min(wanted, len(candidates))].to(candidates.device)]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    return keep


def kl_cov_selected(covariance: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """KL-Cov's selection: (B, T) True on the ``max(int(ratio * valid tokens), 1)`` valid
    tokens of largest covariance (``torch.topk`` over the valid tokens in row-major order);
    all False when no token is valid.

    >>> cov = torch.tensor([[0.5, 2.0, -1.0], [3.0, 0.1, 9.0]])
    >>> kl_cov_selected(cov, torch.tensor([[1, 1, 1], [1, 1, 0]]), ratio=0.4)
    tensor([[False,  True, False],
            [ True, False, False]])
    """
    check_same_shape(covariance=covariance, mask=mask)
    if ratio <= 0:
        raise ValueError(f"KL-Cov's ratio must be > 0, got {ratio}")
    valid = mask.bool()
    positions = valid.nonzero()  # (N, 2)
    selected = torch.zeros_like(valid)
    if len(positions):
        wanted = max(1, int(len(positions) * ratio))
        top = torch.topk(covariance[valid], wanted, largest=True).indices
        chosen = positions[top]
        selected[chosen[:, 0], chosen[:, 1]] = True
    return selected
