"""A position-based click model learned from logged impressions (docs/methods/experience.md, step 5).

What a production system can fit to its own logs: for a candidate shown at position ``p``
with observable features ``x``,

    P(click | shown at p)  = gamma_p * sigmoid(x . w + b)     (examination x attractiveness)
    P(long view | click)   = sigmoid(x . v + c)

with ``gamma_0 = 1`` (the scale convention of position-based models: the attractiveness
absorbs the top position's examination) and ``gamma`` non-increasing,
``log gamma_p = -sum_{0 < q <= p} softplus(d_q)``. Both parts are maximum-likelihood fits
(L-BFGS-B of scipy on the analytic gradient, float64, a small L2 on the feature weights) on the impressions alone: a candidate
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
from typing import Any

import numpy as np
import torch
from scipy import optimize

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


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free


def _examination(decrements: np.ndarray) -> np.ndarray:
    """``(L - 1,)`` free parameters -> ``(L,)`` non-increasing ``gamma`` with ``gamma_0 = 1``."""
    return np.exp(np.concatenate([[0.0], -np.cumsum(_softplus(decrements))]))


def _click_loss(
    theta: np.ndarray, x: np.ndarray, position: np.ndarray, clicks: np.ndarray, l2: float
) -> tuple[float, np.ndarray]:
    """Negative mean log-likelihood of the position-based model (+ L2) and its gradient.

    ``theta`` = ``[d (L - 1), w (F), b]``; ``x`` ``(I, F)``, ``position`` ``(I,)`` and
    ``clicks`` ``(I,)`` over the ``I`` impressions. With ``p = gamma[pos] * s``,
    ``s = sigmoid(x w + b)`` and ``r = dLoss/dp = -(c / p - (1 - c) / (1 - p)) / I``:
    ``dLoss/dz = r * gamma[pos] * s (1 - s)``, ``dLoss/dgamma_p = sum_{pos = p} r * s`` and,
    as ``gamma_p = exp(-sum_{0 < q <= p} softplus(d_q))``,
    ``dLoss/dd_q = -sigmoid(d_q) * sum_{p >= q} gamma_p * dLoss/dgamma_p``.
    """
    L = theta.shape[0] - x.shape[1]  # L - 1 decrements + F weights + 1 bias
    decrements, weights, bias = theta[: L - 1], theta[L - 1 : -1], theta[-1]
    gamma = _examination(decrements)  # (L,)
    s = _sigmoid(x @ weights + bias)  # (I,)
    p = np.clip(gamma[position] * s, EPS, 1 - EPS)
    loss = -np.mean(clicks * np.log(p) + (1 - clicks) * np.log(1 - p))
    r = -(clicks / p - (1 - clicks) / (1 - p)) / len(p)  # (I,)
    dz = r * gamma[position] * s * (1 - s)
    d_gamma = np.bincount(position, weights=r * s, minlength=L)  # (L,)
    tail = np.cumsum((gamma * d_gamma)[::-1])[::-1]  # (L,) sum over p >= q
    grad = np.concatenate(
        [-_sigmoid(decrements) * tail[1:], x.T @ dz + 2 * l2 * weights, [dz.sum()]]
    )
    return float(loss + l2 * weights @ weights), grad


def _logistic_loss(
    theta: np.ndarray, x: np.ndarray, targets: np.ndarray, l2: float
) -> tuple[float, np.ndarray]:
    """Negative mean log-likelihood of ``sigmoid(x w + b)`` (+ L2 on ``w``) and its gradient."""
    weights, bias = theta[:-1], theta[-1]
    p = np.clip(_sigmoid(x @ weights + bias), EPS, 1 - EPS)
    loss = -np.mean(targets * np.log(p) + (1 - targets) * np.log(1 - p))
    dz = (p - targets) / len(p)
    grad = np.concatenate([x.T @ dz + 2 * l2 * weights, [dz.sum()]])
    return float(loss + l2 * weights @ weights), grad


def _minimise(loss: Any, size: int, args: tuple, max_iter: int) -> np.ndarray:
    """L-BFGS-B from zeros on a loss that returns its own gradient."""
    result = optimize.minimize(
        loss, np.zeros(size), args=args, jac=True, method="L-BFGS-B", options={"maxiter": max_iter}
    )
    return result.x


def fit_position_based_click_model(  # noqa: PLR0913 - the logs and the two fit knobs
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
    >>> error = model.examination - torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    >>> bool(error.abs().max() < 0.06)  # within the sampling noise of 400 sessions
    True
    """
    check_ndim("features", features, 3, "(S, L, F)")
    S, L, F = features.shape
    for name, tensor in (("shown", shown), ("clicks", clicks), ("long_views", long_views)):
        if tuple(tensor.shape) != (S, L):
            raise ValueError(f"{name} must have shape (S, L) = {(S, L)}, got {tuple(tensor.shape)}")
    shown_np = shown.bool().numpy()
    clicks_np, long_views_np = clicks.double().numpy(), long_views.double().numpy()
    if not shown_np.any():
        raise ValueError("no impression to fit a click model on (shown is all False)")
    if (clicks_np.astype(bool) & ~shown_np).any() or (
        long_views_np.astype(bool) & ~clicks_np.astype(bool)
    ).any():
        raise ValueError("clicks must lie on shown positions and long views on clicks")
    x = features.double().numpy()
    mean = x[shown_np].mean(axis=0)  # (F,)
    scale = x[shown_np].std(axis=0, ddof=1) if shown_np.sum() > 1 else np.ones(F)
    # A feature constant over the impressions carries no signal; scale 1 keeps it at 0.
    scale = np.where(scale > 1e-12, scale, 1.0)
    standard = (x - mean) / scale  # (S, L, F)

    position = np.broadcast_to(np.arange(L), (S, L))[shown_np]  # (I,)
    theta = _minimise(
        _click_loss,
        L - 1 + F + 1,
        (standard[shown_np], position, clicks_np[shown_np], l2),
        max_iter,
    )
    clicked = clicks_np.astype(bool)
    if clicked.any():
        args = (standard[clicked], long_views_np[clicked], l2)
        long_view_theta = _minimise(_logistic_loss, F + 1, args, max_iter)
    else:  # no click to learn from: no long views either
        long_view_theta = np.concatenate([np.zeros(F), [np.log(EPS)]])
    exposure = shown_np.mean(axis=0)  # (L,)
    # Depth-based exposure is non-increasing; logs of your own may wobble, and the best-page
    # bound of the page reward needs non-increasing position weights.
    exposure = np.minimum.accumulate(exposure)

    def tensor(values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))

    return PositionBasedClickModel(
        examination=tensor(_examination(theta[: L - 1])),
        exposure=tensor(exposure),
        click_weights=tensor(theta[L - 1 : -1]),
        click_bias=float(theta[-1]),
        long_view_weights=tensor(long_view_theta[:-1]),
        long_view_bias=float(long_view_theta[-1]),
        feature_mean=tensor(mean),
        feature_scale=tensor(scale),
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
