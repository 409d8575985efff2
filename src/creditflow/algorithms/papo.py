"""PAPO's implicit perception loss (Wang et al., "Perception-Aware Policy Optimization for
Multimodal Reasoning", arXiv 2507.06448; docs/methods/papo.md): the policy is rewarded for
answering differently when part of its picture is hidden, so that it learns to look.

For each completion token the divergence between the policy with the picture and with a
masked picture is estimated from the sampled token with the k3 estimator,
``exp(l_mask - l) - (l_mask - l) - 1`` (``l`` the token's log-probability with the picture,
``l_mask`` with the masked one; an estimate of KL(with || masked) that is >= 0), clipped to
``[0, clip]`` so that the loss cannot be won by making the masked answers absurd, and
subtracted from the loss with a weight. Pure functions on ``(B, T)`` tensors.
"""

from __future__ import annotations

import torch

from creditflow.algorithms._masked import masked_mean
from creditflow.algorithms._validate import check_same_shape


def masked_pixels(
    pixel_values: torch.Tensor, ratio: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``pixel_values`` with each value zeroed with probability ``ratio`` (PAPO's random
    masking; any layout, e.g. Qwen2.5-VL's flattened patches). ``generator``: the draw (None:
    torch's global stream).

    >>> ones = torch.ones(2, 3)
    >>> masked_pixels(ones, 0.0).sum().item(), masked_pixels(ones, 1.0).sum().item()
    (6.0, 0.0)
    """
    if not 0 <= ratio <= 1:
        raise ValueError(f"mask ratio must be in [0, 1], got {ratio}")
    keep = torch.rand(pixel_values.shape, generator=generator) >= ratio
    return pixel_values * keep.to(device=pixel_values.device, dtype=pixel_values.dtype)


def perception_divergence(
    logp: torch.Tensor, masked_logp: torch.Tensor, clip: float = 0.2
) -> torch.Tensor:
    """(B, T) the k3 estimate ``exp(l_mask - l) - (l_mask - l) - 1`` per token, clipped to
    ``[0, clip]`` (gradient 0 outside: a token already far from its masked answer stops
    pushing). Both inputs carry their gradients.

    >>> perception_divergence(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, -1.0]]), clip=1.0)
    tensor([[0.0000, 0.3679]])
    """
    check_same_shape(logp=logp, masked_logp=masked_logp)
    if clip <= 0:
        raise ValueError(f"the perception divergence's clip must be > 0, got {clip}")
    delta = masked_logp - logp
    return (torch.exp(delta) - delta - 1).clamp(min=0.0, max=clip)


def perception_loss(
    logp: torch.Tensor,
    masked_logp: torch.Tensor,
    mask: torch.Tensor,
    weight: float,
    clip: float = 0.2,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``-weight * mean over valid tokens of perception_divergence``, to add to the policy
    loss, and its metric ``actor/perception_kl`` (the mean divergence, no weight).

    mask: (B, T), 1 where a token counts.
    """
    divergence = perception_divergence(logp, masked_logp, clip)
    mean = masked_mean(divergence, mask.bool())
    return -weight * mean, {"actor/perception_kl": float(mean.detach())}
