"""Ranking metrics and targets for the experience model and page-level GRPO (docs/methods/experience.md).

Shapes: ``L`` candidates in a list, ``N`` lists (queries or sampled pages); ``...`` any
leading batch dimensions.
"""

import torch

from creditflow.algorithms._validate import check_choice, check_ndim, check_same_shape
from creditflow.chain.config import GAIN_MODES


def ndcg_at_k(
    gains_in_ranked_order: torch.Tensor, k: int, ideal_gains: torch.Tensor | None = None
) -> torch.Tensor:
    """nDCG@k with linear gains (docs/methods/experience.md, step 5); matches ``sklearn.metrics.ndcg_score``.

    ``DCG@k = sum_{j <= k} g_j / log2(j + 1)`` (j 1-based), divided by the DCG@k of the
    ideal gains sorted descending.

    Args:
        gains_in_ranked_order: ``(..., L)`` gain of the item at each position of the ranking.
        k: cut-off (>= 1); a ``k`` beyond ``L`` counts the whole list.
        ideal_gains: ``(..., L)`` gains of the candidate set in any order; defaults to
            ``gains_in_ranked_order``.

    Returns:
        ``(...)`` nDCG in [0, 1] for non-negative gains; 0 where the ideal DCG is 0.

    >>> ndcg_at_k(torch.tensor([0.0, 1.0]), k=2)  # (1/log2 3) / (1/log2 2)
    tensor(0.6309)
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if gains_in_ranked_order.dim() < 1:
        raise ValueError("gains_in_ranked_order must have shape (..., L), got a scalar")
    gains = gains_in_ranked_order
    if not gains.is_floating_point():
        gains = gains.float()
    if ideal_gains is None:
        ideal_gains = gains
    check_same_shape(gains_in_ranked_order=gains, ideal_gains=ideal_gains)
    cutoff = min(k, gains.shape[-1])
    positions = torch.arange(cutoff, device=gains.device, dtype=gains.dtype)
    discount = 1.0 / torch.log2(positions + 2.0)  # position j (0-based) -> 1 / log2(j + 2)
    dcg = (gains[..., :cutoff] * discount).sum(dim=-1)
    ideal_sorted = ideal_gains.to(gains.dtype).sort(dim=-1, descending=True).values
    ideal_dcg = (ideal_sorted[..., :cutoff] * discount).sum(dim=-1)
    has_gain = ideal_dcg > 0
    return torch.where(has_gain, dcg / torch.where(has_gain, ideal_dcg, 1.0), 0.0)


def _ranks(scores: torch.Tensor) -> torch.Tensor:
    """``(..., L)`` -> rank of each entry, 0 for the highest score, earlier index first on ties."""
    order = scores.argsort(dim=-1, descending=True, stable=True)
    return order.argsort(dim=-1)


def rank_gains(scores: torch.Tensor, mode: str = "rank") -> torch.Tensor:
    """Gains of the candidates under the ideal order ``y^s`` of experience scores (docs/methods/experience.md, step 5).

    Args:
        scores: ``(..., L)`` experience scores ``s_exp``.
        mode: ``"rank"``: ``g = (L - rank) / L``, rank 0 for the highest score, ties
            broken by index (earlier first); ``"minmax"``: ``(s - min) / (max - min)``,
            0 when all scores are equal.

    Returns:
        ``(..., L)`` float gains, in candidate order.

    >>> rank_gains(torch.tensor([0.1, 0.9, 0.5]))  # ranks 2, 0, 1
    tensor([0.3333, 1.0000, 0.6667])
    """
    check_choice("gain mode", mode, GAIN_MODES)
    if scores.dim() < 1:
        raise ValueError("scores must have shape (..., L), got a scalar")
    if not scores.is_floating_point():
        scores = scores.float()
    length = scores.shape[-1]
    if mode == "rank":
        return (length - _ranks(scores)).to(scores.dtype) / length
    low = scores.min(dim=-1, keepdim=True).values
    spread = scores.max(dim=-1, keepdim=True).values - low
    flat = spread == 0
    return torch.where(flat, 0.0, (scores - low) / torch.where(flat, 1.0, spread))


def augmented_target(clicked: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Pre-training target ``y_aug`` of the generative reranker (docs/methods/experience.md, step 4).

    Clicked candidates by experience score descending, then every other candidate
    (exposed or unexposed) by score descending; ties keep the lower index first.

    Args:
        clicked: ``(..., L)`` bool, True for clicked candidates.
        scores: ``(..., L)`` experience scores.

    Returns:
        ``(..., L)`` long, a permutation of candidate indices (position -> candidate).

    >>> augmented_target(torch.tensor([False, True, False]), torch.tensor([0.9, 0.1, 0.5]))
    tensor([1, 0, 2])
    """
    check_same_shape(clicked=clicked, scores=scores)
    if scores.dim() < 1:
        raise ValueError("clicked and scores must have shape (..., L), got scalars")
    # Stable sorts from the least to the most significant key: score, then clicked.
    order = scores.argsort(dim=-1, descending=True, stable=True)
    clicked_in_order = clicked.bool().gather(-1, order).to(torch.uint8)
    return order.gather(-1, clicked_in_order.argsort(dim=-1, descending=True, stable=True))


def page_reward(  # noqa: PLR0917 - positional order fixed by the public API
    rankings: torch.Tensor,
    business_gains: torch.Tensor,
    exp_scores: torch.Tensor,
    alpha: float,
    beta: float,
    k: int,
) -> torch.Tensor:
    """Page-level GRPO reward ``alpha * R_old + beta * nDCG@k(y, y^s)`` (docs/methods/experience.md, step 5).

    Args:
        rankings: ``(N, L)`` long; row ``n`` is a permutation of candidate indices
            (position -> candidate), e.g. ``G`` sampled lists per query.
        business_gains: ``(N, L)`` logged-feedback gains per candidate (click / long
            view); ``R_old`` is their nDCG@k under the ranking.
        exp_scores: ``(N, L)`` experience scores per candidate; their ``rank`` gains
            define the ideal order ``y^s``.
        alpha: weight of the business objective.
        beta: weight of the experience alignment.
        k: nDCG cut-off (>= 1).

    Returns:
        ``(N,)`` rewards.
    """
    check_ndim("rankings", rankings, 2, "(N, L)")
    check_same_shape(rankings=rankings, business_gains=business_gains, exp_scores=exp_scores)
    if rankings.dtype.is_floating_point or rankings.dtype == torch.bool:
        raise ValueError(f"rankings must be an integer tensor, got {rankings.dtype}")
    length = rankings.shape[1]
    identity = torch.arange(length, device=rankings.device)
    if not (rankings.sort(dim=1).values == identity).all():
        raise ValueError(
            f"every row of rankings must be a permutation of 0..{length - 1} (position -> candidate)"
        )
    rankings = rankings.long()
    r_old = ndcg_at_k(business_gains.gather(1, rankings), k, ideal_gains=business_gains)
    exp_gains = rank_gains(exp_scores)  # (N, L)
    r_exp = ndcg_at_k(exp_gains.gather(1, rankings), k, ideal_gains=exp_gains)
    return alpha * r_old + beta * r_exp
