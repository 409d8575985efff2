"""HICRA, hierarchy-aware credit assignment (Wang et al., "Emergent Hierarchical Reasoning in
LLMs through Reinforcement Learning", arXiv 2509.03646; docs/methods/hicra.md): the advantage
of the tokens that plan a solution is amplified, ``A <- A + alpha |A|`` (``A (1 + alpha
sign A)``), so learning concentrates on strategy rather than on execution.

Which tokens plan: the authors' code marks a completion's high-entropy tokens (above the
value at the top ``entropy_top`` share of its own valid tokens' entropies) in the correct
completions (positive advantage) that are longer than their group's mean length, and, when a
list of "strategic grams" is given, every token of such an n-gram wherever it occurs in a
group that has a correct completion. Pure functions on ``(B, T)`` tensors; rows of one group
consecutive (``G`` each); ``mask`` 1 where a token counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from creditflow.algorithms._validate import check_same_shape


def entropy_threshold(entropy: torch.Tensor, mask: torch.Tensor, top: float) -> torch.Tensor:
    """(B, 1) per row, the entropy at the top ``top`` share of its valid tokens: the value at
    index ``int((1 - top) * n)`` of its ``n`` valid entropies sorted ascending (clamped into
    ``[0, n - 1]``); 0 for a row with no valid token.

    >>> entropy_threshold(torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.0]]), torch.ones(1, 5), 0.3)
    tensor([[0.5000]])
    """
    rows = []
    for row in range(entropy.shape[0]):
        valid = entropy[row][mask[row].bool()]
        if not len(valid):
            rows.append(entropy.new_zeros(()))
            continue
        index = min(max(int((1 - top) * len(valid)), 0), len(valid) - 1)
        rows.append(torch.sort(valid).values[index])
    return torch.stack(rows).unsqueeze(1)


def strategic_gram_mask(
    completion_ids: torch.Tensor, grams: Sequence[Sequence[int]]
) -> torch.Tensor:
    """(B, T) bool: True on every token of an occurrence of one of ``grams`` (token-id
    sequences) in a row of ``completion_ids`` (B, T).

    >>> strategic_gram_mask(torch.tensor([[5, 1, 2, 7, 1, 2]]), [[1, 2], [9]])
    tensor([[False,  True,  True, False,  True,  True]])
    """
    found = torch.zeros_like(completion_ids, dtype=torch.bool)
    T = completion_ids.shape[1]
    for gram in grams:
        n = len(gram)
        if n == 0 or n > T:
            continue
        windows = completion_ids.unfold(1, n, 1)  # (B, T - n + 1, n)
        target = torch.as_tensor(list(gram), dtype=completion_ids.dtype, device=found.device)
        starts = (windows == target).all(dim=-1)  # (B, T - n + 1)
        for offset in range(n):
            found[:, offset : offset + starts.shape[1]] |= starts
    return found


def hicra_advantages(
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    alpha: float = 0.2,
    entropy_top: float = 0.3,
    planning: torch.Tensor | None = None,
    longer_only: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HICRA's advantages and the tokens it amplified, both (B, T).

    Per group that has a correct completion (one whose mean advantage over its valid tokens is
    > 0): in its correct completions longer than the group's mean length (every correct one
    with ``longer_only=False``: where all completions have one length, none is longer), the tokens whose
    entropy exceeds their row's ``entropy_threshold`` are amplified; with ``planning`` (B, T)
    bool, so are the planning tokens of every completion of the group. An amplified token's
    advantage becomes ``A (1 + alpha sign A)``; the others keep theirs. A group with no
    correct completion is left as it is.

    Row 0 is correct and longer than the group's mean (5 > 3.5); its threshold is 0.7 (index
    int(0.7 * 5) = 3 of its sorted entropies), so only its 0.9 token is amplified:

    >>> adv = torch.tensor([[1.0] * 5, [-1.0, -1.0, 0.0, 0.0, 0.0]])
    >>> ent = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.7], [0.9, 0.1, 0.0, 0.0, 0.0]])
    >>> mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    >>> hicra_advantages(adv, ent, mask, group_size=2)[0]
    tensor([[ 1.0000,  1.2000,  1.0000,  1.0000,  1.0000],
            [-1.0000, -1.0000,  0.0000,  0.0000,  0.0000]])
    """
    check_same_shape(advantages=advantages, entropy=entropy, mask=mask)
    if planning is not None:
        check_same_shape(advantages=advantages, planning=planning)
    B = advantages.shape[0]
    if group_size < 1 or B % group_size:
        raise ValueError(f"batch of {B} rows is not whole groups of {group_size}")
    if alpha < 0 or not 0 < entropy_top <= 1:
        raise ValueError(f"need alpha >= 0 and entropy_top in (0, 1], got {alpha}, {entropy_top}")
    valid = mask.bool()
    lengths = valid.sum(dim=1)  # (B,)
    completion_adv = torch.where(valid, advantages, torch.zeros_like(advantages)).sum(1)
    completion_adv = completion_adv / lengths.clamp(min=1)  # (B,)
    high_entropy = entropy > entropy_threshold(entropy, mask, entropy_top)  # (B, T)
    amplified = torch.zeros_like(valid)
    for start in range(0, B, group_size):
        rows = slice(start, start + group_size)
        correct = completion_adv[rows] > 0  # (G,)
        if not correct.any():
            continue
        longer = lengths[rows].float() > lengths[rows].float().mean()
        if not longer_only:
            longer = torch.ones_like(longer)
        chosen = high_entropy[rows] & (correct & longer)[:, None]
        if planning is not None:
            chosen = chosen | planning[rows].bool()
        amplified[rows] = chosen & valid[rows]
    scale = 1 + alpha * torch.sign(advantages)
    return torch.where(amplified, advantages * scale, advantages), amplified
