"""DAPO's batch-side techniques (Yu et al., arXiv 2503.14476): the soft overlong punishment
(eq. 13) and the group filter of dynamic sampling (the constraint of eq. 11).

Shapes: ``B`` completions, ``G`` completions per prompt (rows ``g*G .. g*G+G-1`` share a
prompt), ``B / G`` groups.
"""

import torch

from creditflow.algorithms._validate import check_ndim


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment (eq. 13), times ``factor``: 0 for a completion of at
    most ``max_len - buffer`` tokens, then linear down to ``-factor`` at ``max_len`` tokens
    (and ``-factor`` beyond, which a sampler capped at ``max_len`` never produces).

    Args:
        lengths: ``(B,)`` completion lengths in tokens (the stop token included).
        max_len: ``L_max``, the sampler's ``max_new_tokens``.
        buffer: ``L_cache``, the length of the punished stretch, in ``[1, max_len]``.
        factor: the penalty at ``max_len`` (DAPO: 1).

    Returns:
        ``(B,)`` penalties in ``[-factor, 0]``, in the dtype of ``lengths`` if floating, else
        float32.

    >>> overlong_penalty(torch.tensor([10, 16, 18, 20]), max_len=20, buffer=4)
    tensor([ 0.0000,  0.0000, -0.5000, -1.0000])
    """
    check_ndim("lengths", lengths, 1, "(B,)")
    if not 1 <= buffer <= max_len:
        raise ValueError(f"buffer must be in [1, max_len = {max_len}], got {buffer}")
    if factor < 0:
        raise ValueError(f"factor must be >= 0, got {factor}")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.float32
    over = (lengths.to(dtype) - (max_len - buffer)) / buffer  # (B,) > 0 inside the buffer
    return 0.0 - factor * over.clamp(min=0.0, max=1.0)  # 0.0 - x: no -0.0 below the buffer


def constant_groups(success: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups have the same success on every completion (all solved or none): their
    group-relative advantages of that success are 0, so they carry no signal for it and DAPO's
    dynamic sampling drops them.

    Args:
        success: ``(B,)`` bool (or 0/1) success of each completion, groups consecutive.
        group_size: ``G``; must divide ``B``.

    Returns:
        ``(B / G,)`` bool, True where the group is constant.

    >>> constant_groups(torch.tensor([1, 1, 0, 1, 0, 0]), group_size=2)
    tensor([ True, False,  True])
    """
    check_ndim("success", success, 1, "(B,)")
    if group_size < 1 or success.shape[0] % group_size:
        raise ValueError(
            f"group_size ({group_size}) must divide the number of completions ({success.shape[0]})"
        )
    grouped = success.bool().view(-1, group_size)  # (B/G, G)
    return grouped.all(dim=1) | ~grouped.any(dim=1)
