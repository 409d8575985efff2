"""How well a strategy's per-token credit recovers the true credit of a world that knows it
(the Credit Gym, docs/methods/credit_gym.md): pure functions on ``(B, T)`` arrays.

Shape symbols: ``B`` completions, ``T`` tokens of each. A strategy's credit is its advantage
times its token weight (``A * w``); the oracle credit is the change in expected reward from each
token's choice, 0 on the free tokens.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def decisive_auc(credit: np.ndarray, decisive: np.ndarray) -> np.ndarray:
    """(B,) per completion, the probability that a decisive token gets a larger ``|credit|``
    than a free one (ties count one half: the Mann-Whitney AUC); NaN for a completion with no
    decisive or no free token, or with no credit on any token (a group whose rewards all tie
    gets advantage 0: the strategy said nothing about it, so it is not scored).

    Args:
        credit: (B, T) a strategy's credit ``A * w``.
        decisive: (B, T) bool, True on the tokens that decide the reward.

    >>> decisive_auc(np.array([[3.0, -2.0, 0.0, 1.0]]), np.array([[True, True, False, False]]))
    array([1.])
    >>> decisive_auc(np.array([[1.0, 1.0, 1.0]]), np.array([[True, False, False]]))
    array([0.5])
    """
    credit, decisive = np.asarray(credit, dtype=np.float64), np.asarray(decisive, dtype=bool)
    if credit.shape != decisive.shape or credit.ndim != 2:
        raise ValueError(
            f"credit and decisive must both be (B, T), got {credit.shape}, {decisive.shape}"
        )
    ranks = rankdata(np.abs(credit), axis=1)  # (B, T), ties share their mean rank
    n_pos = decisive.sum(1)
    n_neg = decisive.shape[1] - n_pos
    rank_sum = np.where(decisive, ranks, 0.0).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    credited = (credit != 0).any(1)
    return np.where((n_pos > 0) & (n_neg > 0) & credited, auc, np.nan)


def credit_rank_correlation(credit: np.ndarray, oracle: np.ndarray) -> np.ndarray:
    """(B,) per completion, Spearman's rank correlation of the signed credit with the signed
    oracle credit. A completion whose credit is constant (uniform GRPO: one advantage on every
    token) ranks nothing and scores 0; NaN where the oracle credit is constant (nothing to rank).

    >>> credit_rank_correlation(
    ...     np.array([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]),
    ...     np.array([[0.1, 0.2, 0.9], [0.0, 1.0, 0.0]]),
    ... )
    array([1., 0.])
    """
    credit, oracle = np.asarray(credit, dtype=np.float64), np.asarray(oracle, dtype=np.float64)
    if credit.shape != oracle.shape or credit.ndim != 2:
        raise ValueError(
            f"credit and oracle must both be (B, T), got {credit.shape}, {oracle.shape}"
        )
    a = rankdata(credit, axis=1)
    b = rankdata(oracle, axis=1)
    a = a - a.mean(1, keepdims=True)
    b = b - b.mean(1, keepdims=True)
    norm_a, norm_b = np.sqrt((a * a).sum(1)), np.sqrt((b * b).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (a * b).sum(1) / (norm_a * norm_b)
    rho = np.where(norm_a == 0, 0.0, rho)
    return np.where(norm_b == 0, np.nan, rho)


def pooled_credit_correlation(
    credit: np.ndarray, oracle: np.ndarray, mask: np.ndarray | None = None
) -> float:
    """Spearman's rank correlation of the signed credit with the signed oracle credit over
    every token of the batch's credited completions at once (NaN with fewer than two such
    tokens, or a constant credit or oracle over them). ``mask`` (B, T), when given, keeps only
    its nonzero tokens (a padded batch).

    The per-completion scores compare a completion's tokens with each other, so one advantage
    on every token scores the same (AUC 0.5, Spearman 0) whether it is GRPO's or a shuffled
    one. Pooled over completions, the score also asks whether the credit points the right way:
    GRPO's advantage is high on the completions whose decisive tokens were right (positive
    oracle credit), a shuffled advantage is unrelated to them (about 0).

    Ranks of the credited rows' credit [3.5, 3.5, 1.5, 1.5] and oracle [4, 2.5, 1, 2.5] (the
    uncredited last row left out): correlation 3 / (2 * sqrt(4.5)) = 1 / sqrt(2).

    >>> r = pooled_credit_correlation(
    ...     np.array([[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]]),
    ...     np.array([[0.5, 0.0], [-0.5, 0.0], [9.0, 9.0]]),
    ... )
    >>> round(r, 12) == round(2**-0.5, 12)
    True
    """
    credit, oracle = np.asarray(credit, dtype=np.float64), np.asarray(oracle, dtype=np.float64)
    if credit.shape != oracle.shape or credit.ndim != 2:
        raise ValueError(
            f"credit and oracle must both be (B, T), got {credit.shape}, {oracle.shape}"
        )
    kept = np.ones(credit.shape, dtype=bool) if mask is None else np.asarray(mask) != 0
    credited = ((credit != 0) & kept).any(1, keepdims=True)  # a tied group said nothing
    kept &= credited
    a, b = rankdata(credit[kept]), rankdata(oracle[kept])
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def recovery_scores(
    credit: np.ndarray, oracle: np.ndarray, decisive: np.ndarray
) -> dict[str, float]:
    """The per-completion ``recovery/auc`` and ``recovery/spearman``, averaged over the
    completions where each is defined (NaN when none is), and the batch's
    ``recovery/pooled_spearman`` (``pooled_credit_correlation``)."""
    auc = decisive_auc(credit, decisive)
    rho = credit_rank_correlation(credit, oracle)
    return {
        "recovery/auc": float(np.nanmean(auc)) if np.isfinite(auc).any() else float("nan"),
        "recovery/spearman": float(np.nanmean(rho)) if np.isfinite(rho).any() else float("nan"),
        "recovery/pooled_spearman": pooled_credit_correlation(credit, oracle),
    }
