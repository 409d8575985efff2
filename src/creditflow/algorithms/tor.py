"""ToR token selection and reweighting (docs/methods/tor.md).

Shapes: ``B`` sequences, ``T`` completion tokens, ``V`` vocabulary. ``mask`` is 1 / True
where a token counts and 0 on padding.
"""

import math

import torch

from creditflow.algorithms._masked import masked_mean
from creditflow.algorithms._validate import (
    check_choice,
    check_ndim,
    check_same_shape,
    check_unit_interval,
)

OVERLAP_MODES = ("sum", "reasoning")

# Elements of one (B, chunk, V) float32 slab in topp_entropy: 2**24 floats = 64 MiB, so a
# handful of temporaries stay well under a GiB whatever B, T and V are.
_ENTROPY_CHUNK_ELEMENTS = 2**24


@torch.no_grad()
def topp_entropy(
    logits: torch.Tensor,
    top_p: float = 0.95,
    renormalize: bool = True,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Entropy of the top-p candidate distribution of every position (docs/methods/tor.md).

    Sort the next-token probabilities, keep the smallest prefix whose cumulative mass is
    ``>= top_p`` (the token that crosses the threshold is kept), renormalise it to sum to 1
    and return ``H = -sum p log p`` over it.

    Args:
        logits: ``(B, T, V)`` next-token logits, any float dtype (computed in float32).
        top_p: nucleus mass in (0, 1].
        renormalize: ``False`` sums ``-p log p`` of the raw, unrenormalised probabilities.
        chunk_size: positions along ``T`` processed at once; ``None`` picks a chunk of
            about 2**24 elements, so only chunk-sized temporaries are ever allocated,
            never a second ``(B, T, V)`` tensor.

    Returns:
        ``(B, T)`` float32 entropies (no grad); padding positions are not masked.
    """
    check_ndim("logits", logits, 3, "(B, T, V)")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    batch, length, vocab = logits.shape
    if chunk_size is None:
        chunk_size = max(1, _ENTROPY_CHUNK_ELEMENTS // max(1, batch * vocab))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    entropy = torch.empty(batch, length, dtype=torch.float32, device=logits.device)
    for start in range(0, length, chunk_size):
        chunk = logits[:, start : start + chunk_size].float()  # (B, c, V)
        entropy[:, start : start + chunk_size] = _topp_entropy_chunk(chunk, top_p, renormalize)
    return entropy


def _topp_entropy_chunk(logits: torch.Tensor, top_p: float, renormalize: bool) -> torch.Tensor:
    """``topp_entropy`` of one float32 ``(B, c, V)`` chunk -> ``(B, c)``.

    Renormalised, the full sort over the vocabulary (what the entropy costs) is avoided where
    the nucleus is known to be short: a position whose top token alone holds more than
    ``top_p`` of the mass has a nucleus of that token and entropy exactly 0; one whose
    ``_TOP_K`` most likely tokens hold more than ``top_p`` has its nucleus among them, read
    off ``topk``'s sorted values. "More than" is by ``_SURE_MARGIN``, far beyond the rounding
    of the cumulative sums, so every position gets the value ``nucleus_entropy`` (the full
    sort) gives, to float rounding. A trained policy is that sure of most tokens.
    """
    probs = logits.softmax(dim=-1)  # (B, c, V)
    if not renormalize:
        return nucleus_entropy(probs, top_p, renormalize)
    flat = probs.reshape(-1, probs.shape[-1])  # (B*c, V)
    entropy = torch.zeros(flat.shape[0], dtype=probs.dtype, device=probs.device)
    unsure = (flat.amax(dim=-1) < top_p + _SURE_MARGIN).nonzero().squeeze(1)  # rows to sort
    if len(unsure) and flat.shape[-1] > _TOP_K:
        top = flat[unsure].topk(_TOP_K, dim=-1).values  # (M, K), descending
        short = top.sum(dim=-1) >= top_p + _SURE_MARGIN  # the nucleus is within the top K
        entropy[unsure[short]] = sorted_nucleus_entropy(top[short], top_p, renormalize)
        unsure = unsure[~short]
    if len(unsure):
        entropy[unsure] = nucleus_entropy(flat[unsure], top_p, renormalize)
    return entropy.view(probs.shape[:-1])


# How far above top_p the mass of the tokens read must be for the rest to be skipped, and
# how many tokens topk reads before a position falls back to the full sort.
_SURE_MARGIN = 1e-3
_TOP_K = 32


def nucleus_entropy(probs: torch.Tensor, top_p: float, renormalize: bool) -> torch.Tensor:
    """The top-p entropy of ``(..., V)`` float32 probabilities -> ``(...)``, by sorting each
    row (the reference ``topp_entropy`` is checked against)."""
    return sorted_nucleus_entropy(probs.sort(dim=-1, descending=True).values, top_p, renormalize)


def sorted_nucleus_entropy(probs: torch.Tensor, top_p: float, renormalize: bool) -> torch.Tensor:
    """``nucleus_entropy`` of probabilities already sorted in descending order (all of a
    row's, or a prefix that holds its nucleus) -> ``(...)``."""
    mass_before = probs.cumsum(dim=-1) - probs
    # A token is in the nucleus iff the mass strictly before it is still short of top_p:
    # that keeps the whole prefix up to and including the crossing token. The top token
    # is always kept so the nucleus is never empty.
    keep = mass_before < top_p
    keep[..., 0] = True
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    if renormalize:
        kept = kept / kept.sum(dim=-1, keepdim=True)
    # xlogy: 0 * log 0 = 0 for tokens whose probability underflowed.
    return -torch.special.xlogy(kept, kept).sum(dim=-1)


def visual_sensitivity(logp_with: torch.Tensor, logp_without: torch.Tensor) -> torch.Tensor:
    """ToR's perception score ``S = |log pi(o_t | image, ...) - log pi(o_t | no image, ...)|``.

    Args:
        logp_with: ``(B, T)`` log-probs of the sampled tokens with the image in the prompt.
        logp_without: ``(B, T)`` the same tokens' log-probs with the image removed.

    Returns:
        ``(B, T)`` non-negative sensitivities.
    """
    check_ndim("logp_with", logp_with, 2, "(B, T)")
    check_same_shape(logp_with=logp_with, logp_without=logp_without)
    return (logp_with - logp_without).abs()


def num_selected(n_valid: int, fraction: float) -> int:
    """``k = ceil(fraction * n_valid)``, the size of a top-fraction selection (docs/methods/tor.md).

    The product is rounded to 6 decimals before the ceiling so float noise cannot add a
    token: a fraction computed as ``0.1 + 0.2`` (0.30000000000000004) of 50 tokens
    selects 15, not 16.

    >>> num_selected(10, 0.3), num_selected(7, 0.3), num_selected(50, 0.1 + 0.2)
    (3, 3, 15)
    """
    check_unit_interval("fraction", fraction)
    return math.ceil(round(fraction * n_valid, 6))


def top_fraction_mask(
    scores: torch.Tensor,
    mask: torch.Tensor,
    fraction: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Select the top ``fraction`` of the valid tokens of the whole batch by score (docs/methods/tor.md).

    Exactly ``k = ceil(fraction * n_valid)`` tokens are selected, taken over the flattened
    batch (not per sequence). Ties are broken uniformly at random by keys drawn from
    ``generator``; padding is never selected.

    Args:
        scores: ``(B, T)`` per-token scores (entropy, visual sensitivity).
        mask: ``(B, T)``, 1 / True where a token counts.
        fraction: share of valid tokens to select, in [0, 1].
        generator: seeds the tie-breaking keys (on ``scores.device``).

    Returns:
        ``(B, T)`` bool, True on the selected tokens.
    """
    check_ndim("scores", scores, 2, "(B, T)")
    check_same_shape(scores=scores, mask=mask)
    valid = mask.bool().reshape(-1)  # (B*T,)
    k = num_selected(int(valid.sum()), fraction)
    flat = scores.reshape(-1)
    if torch.isnan(flat[valid]).any():
        raise ValueError("scores must not be NaN on valid tokens")
    tiebreak = torch.rand(flat.shape, generator=generator, device=flat.device)
    # Lexicographic order (valid first, then score desc, then random key) by stable sorts
    # from the least to the most significant key.
    order = tiebreak.argsort()
    order = order[flat[order].argsort(descending=True, stable=True)]
    order = order[valid[order].to(torch.uint8).argsort(descending=True, stable=True)]
    selected = torch.zeros_like(valid)
    selected[order[:k]] = True
    return selected.view_as(mask)


def top_fraction_threshold(scores: torch.Tensor, mask: torch.Tensor, fraction: float) -> float:
    """The score of the k-th selected token, ``k = ceil(fraction * n_valid)`` (docs/methods/tor.md).

    Pass scores gathered from every DDP rank to get one batch-wide threshold: each rank
    then selects its tokens scoring above it plus, at random, enough of those equal to it.

    Args:
        scores: any shape, e.g. ``(B, T)`` or ``(ranks * B * T,)``.
        mask: same shape, 1 / True where a token counts.
        fraction: share of valid tokens to select, in [0, 1].

    Returns:
        The k-th largest valid score; ``inf`` when ``k = 0`` (nothing passes).
    """
    check_same_shape(scores=scores, mask=mask)
    valid_scores = scores[mask.bool()]
    k = num_selected(valid_scores.numel(), fraction)
    if k == 0:
        return math.inf
    return float(valid_scores.float().topk(k).values[-1])


def tor_token_weights(  # noqa: PLR0917 - positional order fixed by the public API
    entropy: torch.Tensor,
    sensitivity: torch.Tensor,
    mask: torch.Tensor,
    alpha_r: float = 0.3,
    alpha_p: float = 0.3,
    gamma_r: float = 1.0,
    gamma_p: float = 0.5,
    overlap: str = "sum",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """ToR per-token weights ``w = gamma_r * 1[T_r] + gamma_p * 1[T_p]`` (docs/methods/tor.md).

    ``T_r`` is the top ``alpha_r`` of valid batch tokens by entropy, ``T_p`` the top
    ``alpha_p`` by visual sensitivity; every other token gets weight 0.

    Args:
        entropy: ``(B, T)`` top-p entropies (reasoning score).
        sensitivity: ``(B, T)`` visual sensitivities (perception score).
        mask: ``(B, T)``, 1 / True where a token counts.
        alpha_r: share of tokens in ``T_r``, in [0, 1].
        alpha_p: share of tokens in ``T_p``, in [0, 1].
        gamma_r: weight of reasoning tokens.
        gamma_p: weight of perception tokens.
        overlap: weight of a token in both sets: ``"sum"`` gives ``gamma_r + gamma_p``
            (the seed's formula), ``"reasoning"`` gives ``gamma_r`` (public re-implementation).
        generator: seeds the tie-breaking of both selections.

    Returns:
        ``(weights (B, T), metrics)``; metrics (python floats): ``tor/reasoning_frac``,
        ``tor/perception_frac``, ``tor/selected_frac`` (shares of valid tokens),
        ``tor/overlap_frac`` (share of selected tokens in both sets) and the mean
        ``tor/entropy_*`` and ``tor/sensitivity_*`` of ``selected`` vs ``unselected``
        valid tokens.
    """
    check_choice("overlap", overlap, OVERLAP_MODES)
    check_unit_interval("alpha_r", alpha_r)
    check_unit_interval("alpha_p", alpha_p)
    check_ndim("entropy", entropy, 2, "(B, T)")
    check_same_shape(entropy=entropy, sensitivity=sensitivity, mask=mask)
    valid = mask.bool()
    reasoning = top_fraction_mask(entropy, valid, alpha_r, generator)
    perception = top_fraction_mask(sensitivity, valid, alpha_p, generator)
    return tor_weights_from_selection(
        reasoning, perception, entropy, sensitivity, valid, gamma_r, gamma_p, overlap
    )


def tor_weights_from_selection(
    reasoning: torch.Tensor,
    perception: torch.Tensor,
    entropy: torch.Tensor,
    sensitivity: torch.Tensor,
    valid: torch.Tensor,
    gamma_r: float,
    gamma_p: float,
    overlap: str = "sum",
) -> tuple[torch.Tensor, dict[str, float]]:
    """ToR weights and selection metrics from already-selected token sets (docs/methods/tor.md).

    Shared by ``tor_token_weights`` and the engine's rank-global selection, which only
    differ in how ``T_r`` and ``T_p`` are chosen.

    Args:
        reasoning, perception: bool ``(B, T)``, the sets ``T_r`` and ``T_p``.
        entropy, sensitivity: ``(B, T)`` scores (for the metrics only).
        valid: bool ``(B, T)``, True where a token counts.
        gamma_r, gamma_p, overlap: as in ``tor_token_weights``.

    Returns:
        ``(weights (B, T), metrics)``: ``w = gamma_r 1[T_r] + gamma_p 1[T_p]`` (``overlap
        ="reasoning"``: ``gamma_r`` only on ``T_r & T_p``), and the ``tor/*`` metrics.
    """
    check_choice("overlap", overlap, OVERLAP_MODES)
    both = reasoning & perception
    counted_perception = perception & ~reasoning if overlap == "reasoning" else perception
    weights = gamma_r * reasoning.float() + gamma_p * counted_perception.float()
    weights = weights.to(entropy.dtype if entropy.is_floating_point() else torch.float32)

    selected = reasoning | perception
    unselected = valid & ~selected
    n_valid = max(1, int(valid.sum()))
    metrics = {
        "tor/reasoning_frac": int(reasoning.sum()) / n_valid,
        "tor/perception_frac": int(perception.sum()) / n_valid,
        "tor/selected_frac": int(selected.sum()) / n_valid,
        "tor/overlap_frac": int(both.sum()) / max(1, int(selected.sum())),
        "tor/entropy_selected": float(masked_mean(entropy.float(), selected)),
        "tor/entropy_unselected": float(masked_mean(entropy.float(), unselected)),
        "tor/sensitivity_selected": float(masked_mean(sensitivity.float(), selected)),
        "tor/sensitivity_unselected": float(masked_mean(sensitivity.float(), unselected)),
    }
    return weights, metrics
