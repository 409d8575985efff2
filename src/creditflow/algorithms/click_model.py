"""A position-based click model learned from logged impressions (docs/methods/experience.md, step 5).

What a production system can fit to its own logs: for a candidate shown at position ``p``
with observable features ``x``,

    P(click | shown at p)  = gamma_p * sigmoid(x . w + b)     (examination x attractiveness)
    P(long view | click)   = sigmoid(x . v + c)

with ``gamma_0 = 1`` (the scale convention of position-based models: the attractiveness
absorbs the top position's examination) and ``gamma`` non-increasing,
``log gamma_p = -sum_{0 < q <= p} softplus(d_q)``. Both parts are maximum-likelihood fits
(L-BFGS in float64, a small L2 on the feature weights) on the impressions alone: a candidate
the logged page never showed carries no evidence and is left out. How often each position is
shown at all (``exposure``) is counted from the same logs, so the expected clicks of any page
of ``L`` candidates are ``sum_p exposure_p * gamma_p * attractiveness(page[p])`` like the
simulator's, but with every number learned from logs.

Hand-written rather than a library's: the click-model packages (pyclick and kin) fit per-item
parameters by EM and cannot score an item through its features; this is one logistic
regression with a learned multiplicative position factor.

Shape symbols: ``S`` sessions, ``L`` positions, ``F`` features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as functional

from creditflow.algorithms._validate import check_ndim

EPS = 1e-9  # keeps log() finite where a probability underflows


@dataclass(frozen=True)
class PositionBasedClickModel:
    """A fitted ``fit_position_based_click_model``.

    examination: ``(L,)`` ``gamma_p = P(click | shown at p) / P(click | shown at 0)`` of the
        same item, non-increasing, ``gamma_0 = 1``.
    exposure: ``(L,)`` share of logged pages that showed position ``p`` (non-increasing).
    click_weights, long_view_weights: ``(F,)`` logistic weights on standardised features.
    click_bias, long_view_bias: their intercepts.
    feature_mean, feature_scale: ``(F,)`` the standardisation, from the fitting impressions.
    """

    examination: torch.Tensor
    exposure: torch.Tensor
    click_weights: torch.Tensor
    click_bias: float
    long_view_weights: torch.Tensor
    long_view_bias: float
    feature_mean: torch.Tensor
    feature_scale: torch.Tensor

    def _standard(self, features: torch.Tensor) -> torch.Tensor:
        return (features.double() - self.feature_mean) / self.feature_scale

    def attractiveness(self, features: torch.Tensor) -> torch.Tensor:
        """``(..., F)`` -> ``(...)`` ``P(click | shown at the top)``."""
        return torch.sigmoid(self._standard(features) @ self.click_weights + self.click_bias)

    def long_view(self, features: torch.Tensor) -> torch.Tensor:
        """``(..., F)`` -> ``(...)`` ``P(long view | click)``."""
        logits = self._standard(features) @ self.long_view_weights + self.long_view_bias
        return torch.sigmoid(logits)

    def position_weights(self) -> torch.Tensor:
        """``(L,)`` ``exposure_p * gamma_p``: expected clicks at ``p`` per unit attractiveness,
        non-increasing."""
        return self.exposure * self.examination


def _examination(decrements: torch.Tensor) -> torch.Tensor:
    """``(L - 1,)`` free parameters -> ``(L,)`` non-increasing ``gamma`` with ``gamma_0 = 1``."""
    log_gamma = -torch.cumsum(functional.softplus(decrements), dim=0)
    return torch.cat([log_gamma.new_ones(1), log_gamma.exp()])


def _logistic_fit(
    standard: torch.Tensor, targets: torch.Tensor, l2: float, max_iter: int
) -> tuple[torch.Tensor, float]:
    """Weights ``(F,)`` and bias of an L2-penalised logistic regression (L-BFGS)."""
    weights = torch.zeros(standard.shape[-1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weights, bias], max_iter=max_iter, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        logits = standard @ weights + bias
        loss = functional.binary_cross_entropy_with_logits(logits, targets)
        loss = loss + l2 * weights.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weights.detach(), float(bias.detach())


def fit_position_based_click_model(
    features: torch.Tensor,
    shown: torch.Tensor,
    clicks: torch.Tensor,
    long_views: torch.Tensor,
    l2: float = 1e-3,
    max_iter: int = 200,
) -> PositionBasedClickModel:
    """Maximum-likelihood ``PositionBasedClickModel`` of logged pages.

    Args:
        features: ``(S, L, F)`` observable features of the candidate each logged page put at
            each position.
        shown: ``(S, L)`` bool, True where the logged page's position was shown (an impression).
        clicks: ``(S, L)`` 0/1 clicks per position (0 where not shown).
        long_views: ``(S, L)`` 0/1 long views per position (only on clicks).
        l2: L2 penalty on the feature weights (not the biases or the position factors).
        max_iter: L-BFGS iterations of each fit.

    Raises:
        ValueError: shapes disagree, no impression, or a click outside the impressions.

    >>> S, L = 400, 3
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(S, L, 1, generator=g, dtype=torch.float64)
    >>> truth = torch.tensor([1.0, 0.5, 0.25]) * torch.sigmoid(x[..., 0])
    >>> c = (torch.rand(S, L, generator=g, dtype=torch.float64) < truth).double()
    >>> model = fit_position_based_click_model(x, torch.ones(S, L, dtype=torch.bool), c, 0 * c)
    >>> [round(v, 1) for v in model.examination.tolist()]  # 1, 0.5, 0.25 within sampling noise
    [1.0, 0.5, 0.3]
    """
    check_ndim("features", features, 3, "(S, L, F)")
    S, L, F = features.shape
    for name, tensor in (("shown", shown), ("clicks", clicks), ("long_views", long_views)):
        if tuple(tensor.shape) != (S, L):
            raise ValueError(f"{name} must have shape (S, L) = {(S, L)}, got {tuple(tensor.shape)}")
    shown = shown.bool()
    clicks, long_views = clicks.double(), long_views.double()
    if not shown.any():
        raise ValueError("no impression to fit a click model on (shown is all False)")
    if (clicks.bool() & ~shown).any() or (long_views.bool() & ~clicks.bool()).any():
        raise ValueError("clicks must lie on shown positions and long views on clicks")
    x = features.double()
    mean = x[shown].mean(dim=0)  # (F,)
    scale = x[shown].std(dim=0).nan_to_num(1.0)
    # A feature constant over the impressions carries no signal; scale 1 keeps it at 0.
    scale = torch.where(scale > 1e-12, scale, torch.ones_like(scale))
    standard = (x - mean) / scale  # (S, L, F)

    decrements = torch.zeros(L - 1, dtype=torch.float64, requires_grad=True)
    weights = torch.zeros(F, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [decrements, weights, bias], max_iter=max_iter, line_search_fn="strong_wolfe"
    )
    target, rows = clicks[shown], standard[shown]  # (I,), (I, F) over the I impressions
    position = torch.arange(L).expand(S, L)[shown]  # (I,)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        p = _examination(decrements)[position] * torch.sigmoid(rows @ weights + bias)
        p = p.clamp(EPS, 1 - EPS)
        loss = -(target * p.log() + (1 - target) * (1 - p).log()).mean()
        loss = loss + l2 * weights.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    clicked = clicks.bool()
    if clicked.any():
        lv_weights, lv_bias = _logistic_fit(standard[clicked], long_views[clicked], l2, max_iter)
    else:  # no click to learn from: no long views either
        lv_weights, lv_bias = torch.zeros(F, dtype=torch.float64), float(torch.logit(torch.tensor(EPS)))
    exposure = shown.double().mean(dim=0)  # (L,)
    # Depth-based exposure is non-increasing; logs of your own may wobble, and the best-page
    # bound of the page reward needs non-increasing position weights.
    exposure = torch.cummin(exposure, dim=0).values
    return PositionBasedClickModel(
        examination=_examination(decrements.detach()),
        exposure=exposure,
        click_weights=weights.detach(),
        click_bias=float(bias.detach()),
        long_view_weights=lv_weights,
        long_view_bias=lv_bias,
        feature_mean=mean,
        feature_scale=scale,
    )


def click_log_likelihood(
    model: PositionBasedClickModel,
    features: torch.Tensor,
    shown: torch.Tensor,
    clicks: torch.Tensor,
) -> float:
    """Mean log-likelihood per impression of ``clicks`` ``(S, L)`` under ``model`` (shapes as
    in ``fit_position_based_click_model``); higher is better."""
    shown = shown.bool()
    L = shown.shape[1]
    p = model.examination[:L] * model.attractiveness(features)  # (S, L)
    p = p[shown].clamp(EPS, 1 - EPS)
    c = clicks.double()[shown]
    return float((c * p.log() + (1 - c) * (1 - p).log()).mean())


def long_view_log_likelihood(
    model: PositionBasedClickModel,
    features: torch.Tensor,
    clicks: torch.Tensor,
    long_views: torch.Tensor,
) -> float:
    """Mean log-likelihood per click of ``long_views`` ``(S, L)`` under ``model``."""
    clicked = clicks.bool()
    p = model.long_view(features)[clicked].clamp(EPS, 1 - EPS)  # (C,)
    v = long_views.double()[clicked]
    return float((v * p.log() + (1 - v) * (1 - p).log()).mean())
