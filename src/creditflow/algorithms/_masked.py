"""The one masked reduction every algorithm goes through.

Mask convention (whole package): 1 / True means the entry counts, 0 / False is padding.
"""

import torch


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Mean of ``values`` over the entries where ``mask`` is set.

    Args:
        values: any shape, e.g. ``(B, T)``.
        mask: same shape as ``values``; 1 / True where an entry counts.
        dim: dimension(s) to reduce; ``None`` reduces everything to a scalar.

    Returns:
        ``values`` reduced over ``dim``. A slice with no counted entry gives 0: the
        denominator is clamped to 1 so an all-padding row (a sequence that produced no
        tokens, an empty selection) contributes 0 instead of NaN.

    >>> masked_mean(torch.tensor([1.0, 2.0, 9.0]), torch.tensor([1, 1, 0]))
    tensor(1.5000)
    """
    if values.shape != mask.shape:
        raise ValueError(
            f"values and mask must have the same shape, got {tuple(values.shape)} "
            f"and {tuple(mask.shape)}"
        )
    keep = mask.bool()
    # where(), not values * mask: padding may hold inf/NaN (e.g. log-probs of pad tokens)
    # and 0 * inf would poison the sum.
    total = torch.where(keep, values, torch.zeros_like(values)).sum(dim=dim)
    count = keep.sum(dim=dim).to(total.dtype)
    return total / count.clamp(min=1)
