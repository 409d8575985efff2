"""Prefix values and the credit they imply: the math of a Monte Carlo credit estimate.

The value of a prefix (the prompt and the first ``t`` completion tokens) is the expected reward
of a completion that starts with it, ``V(t) = E[R | prefix_t]``; VinePPO (Kazemnejad et al.,
2024, arXiv 2410.01679, eq. 6) estimates it by the mean reward of K continuations sampled from
the prefix. The credit a span of tokens deserves is the change in value across it,
``V(end) - V(start)`` (the span's advantage, eq. 4 with gamma = 1 and the reward at the end):
a token that makes success more likely gets positive credit, a token that changes nothing 0.

Values are known only at *boundaries*: a span of tokens ends after each boundary token, and the
completion's last valid token always ends one (its value is the completion's own reward). This
module turns boundaries and values into per-token credit (how well an assigned credit recovers
a deserved one is ``reporting.recovery``); sampling the continuations is the engine's
(``training.deserved_credit``).

Shape symbols: ``B`` completions, ``T`` completion tokens. ``values`` is ``(B, T + 1)``: column
``t`` holds ``V(t)``, the value after ``t`` completion tokens (column 0: the prompt alone), NaN
where no value was estimated. Masks: 1 / True means the token counts.
"""

from __future__ import annotations

import torch


def every_n_boundaries(mask: torch.Tensor, every: int) -> torch.Tensor:
    """(B, T) bool: a span ends after every ``every``-th valid token and after the last one.

    mask: (B, T), 1 on valid completion tokens (a prefix of each row).

    >>> every_n_boundaries(torch.tensor([[1, 1, 1, 1, 1, 0]]), 2).int()
    tensor([[0, 1, 0, 1, 1, 0]], dtype=torch.int32)
    """
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    valid = mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(valid)
    return valid & (((positions + 1) % every == 0) | _last_valid(valid))


def segment_boundaries(segment_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: a span ends where the next token is in another segment, and after the last
    valid token (e.g. TAPO's translation and reasoning segments: one value at their border).

    segment_ids: (B, T) int, any labels; mask: (B, T).

    >>> segment_boundaries(torch.tensor([[0, 0, 1, 1, 1]]), torch.tensor([[1, 1, 1, 1, 0]])).int()
    tensor([[0, 1, 0, 1, 0]], dtype=torch.int32)
    """
    valid = mask.bool()
    changes = torch.zeros_like(valid)
    changes[:, :-1] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return valid & (changes | _last_valid(valid))


def _last_valid(valid: torch.Tensor) -> torch.Tensor:
    """(B, T) bool, True on each row's last valid token."""
    following = torch.zeros_like(valid)
    following[:, :-1] = valid[:, 1:]
    return valid & ~following


def known_prefixes(boundaries: torch.Tensor) -> torch.Tensor:
    """(B, T + 1) bool: the prefix lengths whose value a credit estimate needs, the empty
    completion (column 0) and the end of every span (column t + 1 for a boundary token t).

    boundaries: (B, T) bool.
    """
    start = torch.ones_like(boundaries[:, :1])
    return torch.cat([start, boundaries], dim=1)


def span_credits(
    values: torch.Tensor, boundaries: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """(B, T) per-token credit: each span's change in value, ``V(end) - V(start)``, shared
    equally by its tokens (so a row's credits sum to ``V(n) - V(0)``, its reward minus the
    prompt's value); 0 on padding.

    values: (B, T + 1), finite at every ``known_prefixes`` column; boundaries: (B, T) bool, the
    last valid token of each row among them; mask: (B, T).

    >>> nan = float("nan")
    >>> values = torch.tensor([[0.5, nan, 1.0, nan, 0.0]])  # V(0), V(2), V(4) known
    >>> span_credits(values, torch.tensor([[0, 1, 0, 1]]).bool(), torch.ones(1, 4))
    tensor([[ 0.2500,  0.2500, -0.5000, -0.5000]])
    """
    B, T = mask.shape
    known = known_prefixes(boundaries.bool() & mask.bool())  # (B, T + 1)
    index = torch.arange(T + 1, device=mask.device).expand(B, T + 1)
    # The start of token t's span: the last known column <= t; its end: the first known
    # column >= t + 1 (T + 1 stands for "none", only reached on padding).
    last = torch.where(known, index, torch.zeros_like(index)).cummax(dim=1).values
    beyond = torch.full_like(index, T + 1)
    first = torch.where(known, index, beyond).flip(1).cummin(dim=1).values.flip(1)
    start, end = last[:, :T], first[:, 1:]  # (B, T)
    valid = mask.bool() & (end <= T)
    end = end.clamp(max=T)
    gain = values.gather(1, end) - values.gather(1, start)  # (B, T)
    credit = gain / (end - start).clamp(min=1)  # clamp: padding has start == end
    return torch.where(valid, credit, torch.zeros_like(credit))
