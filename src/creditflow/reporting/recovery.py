"""How well an assigned per-token credit recovers a Monte Carlo deserved credit: the Credit
Gym's recovery scores (``reporting.credit_recovery``: the Mann-Whitney AUC of ``|credit|``
and Spearman's rank correlation, per completion, averaged), with "decisive" read off the
estimate, since no world says which tokens decide.

Shape symbols: ``B`` completions, ``T`` completion tokens; masks: 1 means the token counts.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from creditflow.reporting.credit_recovery import (
    credit_rank_correlation,
    decisive_auc,
    pooled_credit_correlation,
)


def recovery_scores(
    assigned: torch.Tensor,
    deserved: torch.Tensor,
    mask: torch.Tensor,
    high: float = 0.5,
    zero: float = 0.1,
) -> dict[str, float]:
    """How well an assigned credit recovers a deserved one, per completion, averaged.

    assigned, deserved: (B, T) per-token credit (e.g. advantage x weight, and the Monte Carlo
    deserved credit); mask: (B, T).

    - ``credit/recovery_auc``: ``decisive_auc`` over a completion's tokens of high deserved
      credit (``|deserved| >= high *`` the completion's largest: the decisive ones) and those
      of about zero (``|deserved| <= zero *`` the largest: the free ones); the tokens in
      between, where Monte Carlo noise could put them on either side, take no part.
    - ``credit/recovery_spearman``: ``credit_rank_correlation`` of assigned and deserved
      credit over the completion's valid tokens (a constant assigned credit scores 0).
    - ``credit/recovery_pooled_spearman``: ``pooled_credit_correlation`` over every valid
      token of the completions at once (whether the credit points the way of the deserved
      one, which a per-completion rank cannot see for a one-advantage-per-completion credit).
    - ``credit/recovery_completions``: how many completions gave an AUC.

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
        a = assigned[row][valid].double().cpu().numpy()
        d = deserved[row][valid].double().cpu().numpy()
        if not a.size:
            continue
        largest = float(np.abs(d).max())
        if largest > 0:
            high_or_zero = (np.abs(d) >= high * largest) | (np.abs(d) <= zero * largest)
            decisive = np.abs(d[high_or_zero]) >= high * largest
            auc = float(decisive_auc(a[high_or_zero][None], decisive[None])[0])
            if not math.isnan(auc):
                aucs.append(auc)
        rho = float(credit_rank_correlation(a[None], d[None])[0])
        if not math.isnan(rho):
            rhos.append(rho)
    return {
        "credit/recovery_auc": sum(aucs) / len(aucs) if aucs else math.nan,
        "credit/recovery_spearman": sum(rhos) / len(rhos) if rhos else math.nan,
        "credit/recovery_pooled_spearman": pooled_credit_correlation(
            assigned.double().cpu().numpy(),
            deserved.double().cpu().numpy(),
            mask.cpu().numpy(),
        ),
        "credit/recovery_completions": float(len(aucs)),
    }
