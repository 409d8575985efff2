"""The ExpModel's pairwise preference loss (docs/methods/experience.md, step 3).

Shapes: ``N`` preference pairs.
"""

import torch
import torch.nn.functional as F

from creditflow.algorithms._validate import check_ndim, check_same_shape


def pairwise_preference_loss(s_pos: torch.Tensor, s_neg: torch.Tensor, lam: float) -> torch.Tensor:
    """ExpModel PFT loss ``-mean(log sigmoid(s+ - s-)) + lam * mean((s+ + s-)^2)`` (docs/methods/experience.md, step 3).

    The second term keeps the scalar scores centred and bounded.

    Args:
        s_pos: ``(N,)`` scores of the preferred item of each pair.
        s_neg: ``(N,)`` scores of the other item.
        lam: weight of the centring term (>= 0).

    Returns:
        Scalar loss.

    >>> pairwise_preference_loss(torch.tensor([0.0]), torch.tensor([0.0]), lam=1.0)
    tensor(0.6931)
    """
    check_ndim("s_pos", s_pos, 1, "(N,)")
    check_same_shape(s_pos=s_pos, s_neg=s_neg)
    if s_pos.numel() == 0:
        raise ValueError("need at least one preference pair, got N = 0")
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    ranking = -F.logsigmoid(s_pos - s_neg).mean()
    centring = (s_pos + s_neg).pow(2).mean()
    return ranking + lam * centring
