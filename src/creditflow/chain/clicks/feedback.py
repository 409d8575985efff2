"""Simulated user feedback on a page, exact or sampled (docs/methods/experience.md).

A position-based click model with long views (``creditflow.chain.world.catalogue.ClickModel``):
``P(click at position p) = w_p * c_i`` and ``P(long view at p) = w_p * c_i * l_i`` for the
candidate ``i`` a page puts at ``p``, where ``w_p = P(exposed and examined at p)`` depends on
the position only, ``c_i = P(click | examined)`` and ``l_i = P(long view | click)`` on the
candidate only. Expectations of any page are therefore exact sums over positions, and a
Monte Carlo draw that shares its random numbers across pages (common random numbers: one
scroll depth and one uniform per position and draw) estimates the same quantities.

Shapes: ``B`` pages, ``L`` positions (= candidates per page). Rankings map position ->
candidate index.
"""

import torch

from creditflow.algorithms._validate import check_ndim, check_same_shape


def _by_position(rankings: torch.Tensor, *per_candidate: torch.Tensor) -> list[torch.Tensor]:
    check_ndim("rankings", rankings, 2, "(B, L)")
    for values in per_candidate:
        check_same_shape(rankings=rankings, per_candidate=values)
    rankings = rankings.long()
    return [values.gather(1, rankings) for values in per_candidate]


def expected_page_feedback(
    rankings: torch.Tensor,
    click_probability: torch.Tensor,
    long_view_probability: torch.Tensor,
    position_weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact expected clicks and long views at every position of each page.

    Args:
        rankings: ``(B, L)`` long, position -> candidate.
        click_probability: ``(B, L)`` ``P(click | examined)`` per candidate.
        long_view_probability: ``(B, L)`` ``P(long view | click)`` per candidate.
        position_weights: ``(L,)`` ``P(exposed and examined)`` per position.

    Returns:
        ``(clicks (B, L), long_views (B, L))``, expectations per position; a page's expected
        clicks are ``clicks.sum(-1)``.

    >>> clicks, long_views = expected_page_feedback(
    ...     torch.tensor([[1, 0]]),
    ...     torch.tensor([[0.2, 0.6]]),
    ...     torch.tensor([[0.5, 0.5]]),
    ...     torch.tensor([1.0, 0.5]),
    ... )
    >>> clicks, long_views  # candidate 1 (0.6) at the top, candidate 0 (0.2) at half weight
    (tensor([[0.6000, 0.1000]]), tensor([[0.3000, 0.0500]]))
    """
    check_ndim("position_weights", position_weights, 1, "(L,)")
    if position_weights.shape[0] != rankings.shape[-1]:
        raise ValueError(
            f"position_weights must have L = {rankings.shape[-1]} entries, got "
            f"{position_weights.shape[0]}"
        )
    click, long_view = _by_position(rankings, click_probability, long_view_probability)
    clicks = position_weights.to(click.dtype) * click  # (B, L)
    return clicks, clicks * long_view


def sample_page_feedback(  # noqa: PLR0913, PLR0917 - the random numbers are explicit on purpose
    rankings: torch.Tensor,
    click_probability: torch.Tensor,
    long_view_probability: torch.Tensor,
    examination: torch.Tensor,
    depth: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One simulated user per page: 0/1 clicks and long views at every position.

    The random numbers are arguments, so pages given the same ``depth`` and ``uniforms``
    share them (common random numbers: two rankers' pages then differ only by what they put
    where). Position ``p`` is exposed when ``p < depth``, clicked when also
    ``uniforms[..., 0] < examination[p] * click_probability``, long-viewed when clicked and
    ``uniforms[..., 1] < long_view_probability``. Averaged over draws this tends to
    ``expected_page_feedback`` with ``position_weights = P(depth > p) * examination``.

    Args:
        rankings: ``(B, L)`` long, position -> candidate.
        click_probability: ``(B, L)`` ``P(click | examined)`` per candidate.
        long_view_probability: ``(B, L)`` ``P(long view | click)`` per candidate.
        examination: ``(L,)`` ``P(examined | exposed)`` per position.
        depth: ``(B,)`` scroll depth of each page's user (positions ``< depth`` exposed).
        uniforms: ``(B, L, 2)`` uniform [0, 1) numbers per position (click, long view).

    Returns:
        ``(clicks (B, L), long_views (B, L))`` float 0/1 per position.

    >>> sample_page_feedback(
    ...     torch.tensor([[1, 0]]),
    ...     torch.tensor([[0.2, 0.6]]),
    ...     torch.tensor([[0.5, 0.5]]),
    ...     torch.tensor([1.0, 0.5]),
    ...     torch.tensor([2]),
    ...     torch.tensor([[[0.5, 0.4], [0.05, 0.9]]]),
    ... )  # 0.5 < 0.6, 0.05 < 0.5 * 0.2
    (tensor([[1., 1.]]), tensor([[1., 0.]]))
    """
    click, long_view = _by_position(rankings, click_probability, long_view_probability)
    B, L = rankings.shape
    if tuple(uniforms.shape) != (B, L, 2) or tuple(depth.shape) != (B,):
        raise ValueError(
            f"need depth (B,) = ({B},) and uniforms (B, L, 2) = ({B}, {L}, 2), got "
            f"{tuple(depth.shape)} and {tuple(uniforms.shape)}"
        )
    exposed = torch.arange(L, device=rankings.device) < depth.unsqueeze(-1)  # (B, L)
    clicked = exposed & (uniforms[..., 0] < examination.to(click.dtype) * click)
    long_viewed = clicked & (uniforms[..., 1] < long_view)
    return clicked.to(click.dtype), long_viewed.to(click.dtype)


def best_page_value(values: torch.Tensor, position_weights: torch.Tensor) -> torch.Tensor:
    """``(B,)`` the largest ``sum_p position_weights[p] * values[page[p]]`` over all pages.

    With non-increasing ``position_weights`` (a position-based click model's), sorting the
    candidates by value descending is optimal (rearrangement inequality).

    Args:
        values: ``(B, L)`` per-candidate value if examined (e.g. ``c * (1 + w * l)``).
        position_weights: ``(L,)`` non-increasing weights.

    >>> best_page_value(torch.tensor([[1.0, 3.0]]), torch.tensor([1.0, 0.5]))
    tensor([3.5000])
    """
    check_ndim("values", values, 2, "(B, L)")
    if (position_weights[1:] > position_weights[:-1] + 1e-12).any():
        raise ValueError("position_weights must be non-increasing")
    ordered = values.sort(dim=-1, descending=True).values
    return (ordered * position_weights.to(values.dtype)).sum(dim=-1)
