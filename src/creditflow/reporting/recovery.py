"""How well an assigned per-token credit recovers a deserved (or exact) one: a rank AUC and a
rank correlation per completion, averaged (pure tensors in, floats out).

Shape symbols: ``B`` completions, ``T`` completion tokens; masks: 1 means the token counts.
"""

from __future__ import annotations

import math

import torch


def _average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 1..n of the 1-D ``x``, ties sharing their average rank (as Spearman's rho and the
    Mann-Whitney AUC need)."""
    order = torch.argsort(x)
    _, inverse, counts = torch.unique_consecutive(x[order], return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    average = ends - (counts.double() - 1) / 2  # the mean of ranks ends-count+1 .. ends
    ranks = torch.empty(x.numel(), dtype=torch.float64, device=x.device)
    ranks[order] = average[inverse]
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two 1-D tensors (NaN when either is constant).

    >>> spearman(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 30.0, 20.0]))
    0.5
    """
    ra, rb = _average_ranks(a), _average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    scale = float((ra.square().sum() * rb.square().sum()).sqrt())
    return float((ra * rb).sum()) / scale if scale > 0 else math.nan


def separation_auc(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """P(a positive score > a negative one), ties counting half (the Mann-Whitney AUC); NaN
    when either set is empty.

    >>> separation_auc(torch.tensor([3.0, 1.0]), torch.tensor([1.0, 0.0]))
    0.875
    """
    n_pos, n_neg = positive.numel(), negative.numel()
    if not n_pos or not n_neg:
        return math.nan
    ranks = _average_ranks(torch.cat([positive, negative]))
    return (float(ranks[:n_pos].sum()) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def recovery_scores(
    assigned: torch.Tensor,
    deserved: torch.Tensor,
    mask: torch.Tensor,
    high: float = 0.5,
    zero: float = 0.1,
) -> dict[str, float]:
    """How well an assigned credit recovers a deserved one, per completion, averaged.

    assigned, deserved: (B, T) per-token credit (e.g. advantage x weight, and the Monte Carlo
    or exact deserved credit); mask: (B, T).

    - ``credit/recovery_auc``: the AUC with which ``|assigned|`` separates a completion's tokens
      of high deserved credit (``|deserved| >= high *`` the completion's largest) from those of
      about zero (``|deserved| <= zero *`` the largest); tokens in between take no part. A
      magnitude, because a decisive token may deserve blame as well as praise. 1: every
      decisive token gets more credit than every free one; 0.5: no better than chance.
    - ``credit/recovery_spearman``: Spearman's rank correlation of assigned and deserved
      credit over the completion's tokens (signed).
    - ``credit/recovery_completions``: how many completions gave an AUC (both kinds of token
      present); the Spearman mean skips completions where either credit is constant.

    A mean over no completion is NaN.

    >>> d = torch.tensor([[1.0, 0.0, 0.0]])
    >>> recovery_scores(torch.tensor([[0.9, 0.1, -0.2]]), d, torch.ones(1, 3))[
    ...     "credit/recovery_auc"
    ... ]
    1.0
    """
    aucs, rhos = [], []
    for row in range(mask.shape[0]):
        valid = mask[row].bool()
        a, d = assigned[row][valid].double(), deserved[row][valid].double()
        if not a.numel():
            continue
        largest = float(d.abs().max())
        if largest > 0:
            auc = separation_auc(
                a.abs()[d.abs() >= high * largest], a.abs()[d.abs() <= zero * largest]
            )
            if not math.isnan(auc):
                aucs.append(auc)
        rho = spearman(a, d) if a.numel() > 1 else math.nan
        if not math.isnan(rho):
            rhos.append(rho)
    return {
        "credit/recovery_auc": sum(aucs) / len(aucs) if aucs else math.nan,
        "credit/recovery_spearman": sum(rhos) / len(rhos) if rhos else math.nan,
        "credit/recovery_completions": float(len(aucs)),
    }
