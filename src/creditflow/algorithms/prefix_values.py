"""Prefix values and the credit they imply: the math of a Monte Carlo credit estimate.

The value of a prefix (the prompt and the first ``t`` completion tokens) is the expected reward
of a completion that starts with it, ``V(t) = E[R | prefix_t]``; VinePPO (Kazemnejad et al.,
2024, arXiv 2410.01679, eq. 6) estimates it by the mean reward of K continuations sampled from
the prefix. The credit a span of tokens deserves is the change in value across it,
``V(end) - V(start)`` (the span's advantage, eq. 4 with gamma = 1 and the reward at the end):
a token that makes success more likely gets positive credit, a token that changes nothing 0.

Values are known only at *boundaries*: a span of tokens ends after each boundary token, and the
completion's last valid token always ends one (its value is the completion's own reward). This
module turns boundaries and values into per-token credit and scores how well an assigned
credit recovers a deserved one; sampling the continuations is the engine's
(``training.deserved_credit``).

Shape symbols: ``B`` completions, ``T`` completion tokens. ``values`` is ``(B, T + 1)``: column
``t`` holds ``V(t)``, the value after ``t`` completion tokens (column 0: the prompt alone), NaN
where no value was estimated. Masks: 1 / True means the token counts.
"""

from __future__ import annotations

import math

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
