"""A position-based click model learned from logged impressions (docs/methods/experience.md, step 5).

What a production system can fit to its own logs: for a candidate shown at position ``p``
with observable features ``x``,

    P(click | shown at p)  = gamma_p * sigmoid(x . w + b)     (examination x attractiveness)
    P(long view | click)   = sigmoid(x . v + c)

with ``gamma_0 = 1`` (the scale convention of position-based models: the attractiveness
absorbs the top position's examination) and ``gamma`` non-increasing,
``log gamma_p = -sum_{0 < q <= p} softplus(d_q)``. Both parts are maximum-likelihood fits
(L-BFGS-B of scipy on the analytic gradient, float64, a small L2 on the feature weights) on the impressions alone: a candidate
the logged page never showed carries no evidence and is left out.

Per-key effects (``effects``) make it the click-model literature's PBM with a feature prior:
each group of keys (an item, a query-item pair) adds its own offset ``u_k`` to both logits,
``x . w + b + sum_groups u_k``, with a Gaussian prior ``u_k ~ N(0, prior_sd^2)``, fitted
jointly (maximum a posteriori). A key shown often gets the attractiveness its own clicks say;
a key rarely shown stays near what its features predict (shrinkage), and a key the fit never
saw gets its features' prediction exactly. Each offset carries its Laplace posterior standard
deviation (``1 / sqrt(prior precision + Fisher information of its impressions)``), the
uncertainty a pessimistic reward subtracts (``pessimism``). How often each position is
shown at all (``exposure``) is counted from the same logs, so the expected clicks of any page
of ``L`` candidates are ``sum_p exposure_p * gamma_p * attractiveness(page[p])`` like the
simulator's, but with every number learned from logs.

Hand-written rather than a library's: the click-model packages fit per-item parameters by EM
and can neither score an item through its features nor shrink a rarely shown item toward
them, and none runs here (``clickmodels`` 1.0.2 on PyPI is Python 2 code; PyClick is not on
PyPI, where ``pyclick`` is a mouse-movement library). This is one logistic regression with a
learned multiplicative position factor and Gaussian random effects.

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
class KeyedEffects:
    """The fitted offsets of one group of keys (``item``, ``query_item``) on one logit.

    keys: ``(K,)`` the keys the fit saw, as strings.
    mean: ``(K,)`` each key's MAP offset.
    sd: ``(K,)`` its Laplace posterior standard deviation.
    prior_sd: the prior's standard deviation, the mean and sd of a key the fit never saw
        being 0 and ``prior_sd``.
    """

    group: str
    keys: tuple[str, ...]
    mean: torch.Tensor
    sd: torch.Tensor
    prior_sd: float

    def lookup(self, keys: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``keys`` ``(...)`` -> ``(mean (...), sd (...))``; unseen keys get ``(0, prior_sd)``."""
        position = {key: k for k, key in enumerate(self.keys)}
        flat = [position.get(str(key), -1) for key in np.asarray(keys).ravel()]
        index = torch.tensor(flat, dtype=torch.long).reshape(np.shape(keys))
        seen = index >= 0
        safe = index.clamp(min=0)
        mean = torch.where(seen, self.mean[safe], torch.zeros((), dtype=torch.float64))
        sd = torch.where(seen, self.sd[safe], torch.full((), self.prior_sd, dtype=torch.float64))
        return mean, sd


def _offsets(
    effects: tuple[KeyedEffects, ...], keys: dict[str, np.ndarray] | None, shape: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of the groups' offsets, their summed variance)`` ``shape`` for ``keys``
    (``{group: (...) keys}``)."""
    total = torch.zeros(shape, dtype=torch.float64)
    variance = torch.zeros(shape, dtype=torch.float64)
    if not effects:
        return total, variance
    if keys is None or any(effect.group not in keys for effect in effects):
        raise ValueError(
            f"this click model has per-key effects {[e.group for e in effects]}: pass their "
            "keys of every candidate"
        )
    for effect in effects:
        mean, sd = effect.lookup(keys[effect.group])
        total, variance = total + mean, variance + sd**2
    return total, variance


@dataclass(frozen=True)
class PositionBasedClickModel:
    """A fitted ``fit_position_based_click_model``.

    examination: ``(L,)`` ``gamma_p = P(click | shown at p) / P(click | shown at 0)`` of the
        same item, non-increasing, ``gamma_0 = 1``.
    exposure: ``(L,)`` share of logged pages that showed position ``p`` (non-increasing).
    click_weights, long_view_weights: ``(F,)`` logistic weights on standardised features.
    click_bias, long_view_bias: their intercepts.
    feature_mean, feature_scale: ``(F,)`` the standardisation, from the fitting impressions.
    click_effects, long_view_effects: per-key offsets of the two logits (none without
        ``effects``).
    """

    examination: torch.Tensor
    exposure: torch.Tensor
    click_weights: torch.Tensor
    click_bias: float
    long_view_weights: torch.Tensor
    long_view_bias: float
    feature_mean: torch.Tensor
    feature_scale: torch.Tensor
    click_effects: tuple[KeyedEffects, ...] = ()
    long_view_effects: tuple[KeyedEffects, ...] = ()

    def _standard(self, features: torch.Tensor) -> torch.Tensor:
        return (features.double() - self.feature_mean) / self.feature_scale

    def attractiveness(
        self,
        features: torch.Tensor,
        keys: dict[str, np.ndarray] | None = None,
        pessimism: float = 0.0,
    ) -> torch.Tensor:
        """``(..., F)`` -> ``(...)`` ``P(click | shown at the top)``. ``keys``: each effect
        group's key of every candidate, ``{group: (...)}`` (needed when the model has
        effects); ``pessimism``: ``kappa`` of the lower bound ``sigmoid(logit - kappa * sd)``,
        ``sd`` the effects' posterior standard deviation (0: the MAP estimate)."""
        offset, variance = _offsets(self.click_effects, keys, features.shape[:-1])
        logits = self._standard(features) @ self.click_weights + self.click_bias + offset
        return torch.sigmoid(logits - pessimism * variance.sqrt())

    def long_view(
        self,
        features: torch.Tensor,
        keys: dict[str, np.ndarray] | None = None,
        pessimism: float = 0.0,
    ) -> torch.Tensor:
        """``(..., F)`` -> ``(...)`` ``P(long view | click)`` (``keys``, ``pessimism`` as in
        ``attractiveness``)."""
        offset, variance = _offsets(self.long_view_effects, keys, features.shape[:-1])
        logits = self._standard(features) @ self.long_view_weights + self.long_view_bias + offset
        return torch.sigmoid(logits - pessimism * variance.sqrt())

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


@dataclass(frozen=True)
class _EffectDesign:
    """The per-key offsets of one fit: ``index`` ``(G, I)`` each group's offset column of each
    impression (columns of all groups numbered together), ``precision`` ``(K,)`` the prior
    precision ``1 / prior_sd^2`` of each column. No group: ``G = K = 0``."""

    index: np.ndarray
    precision: np.ndarray

    @property
    def size(self) -> int:
        return self.precision.shape[0]

    def offsets(self, effects: np.ndarray) -> np.ndarray:
        """``(K,)`` -> ``(I,)`` the summed offsets of each impression."""
        return effects[self.index].sum(axis=0) if self.size else 0.0

    def penalty(self, effects: np.ndarray, count: int) -> tuple[float, np.ndarray]:
        """The prior's negative log density per impression and its gradient."""
        return (
            0.5 * float(self.precision @ effects**2) / count,
            self.precision * effects / count,
        )

    def gradient(self, dz: np.ndarray) -> np.ndarray:
        """``dLoss/dz`` ``(I,)`` -> ``(K,)``: each column sums its impressions'."""
        return sum(
            (np.bincount(row, weights=dz, minlength=self.size) for row in self.index),
            np.zeros(self.size),
        )


def _click_loss(  # noqa: PLR0913 - the parameters, the impressions and the two penalties
    theta: np.ndarray,
    x: np.ndarray,
    position: np.ndarray,
    clicks: np.ndarray,
    l2: float,
    design: _EffectDesign,
) -> tuple[float, np.ndarray]:
    """Negative mean log-posterior of the position-based model (+ L2, + the effects' prior)
    and its gradient.

    ``theta`` = ``[d (L - 1), w (F), b, u (K)]``; ``x`` ``(I, F)``, ``position`` ``(I,)`` and
    ``clicks`` ``(I,)`` over the ``I`` impressions. With ``p = gamma[pos] * s``,
    ``s = sigmoid(x w + b + offsets)`` and ``r = dLoss/dp = -(c / p - (1 - c) / (1 - p)) / I``:
    ``dLoss/dz = r * gamma[pos] * s (1 - s)``, ``dLoss/dgamma_p = sum_{pos = p} r * s`` and,
    as ``gamma_p = exp(-sum_{0 < q <= p} softplus(d_q))``,
    ``dLoss/dd_q = -sigmoid(d_q) * sum_{p >= q} gamma_p * dLoss/dgamma_p``.
    """
    F, K = x.shape[1], design.size
    L = theta.shape[0] - F - K  # L - 1 decrements + F weights + 1 bias + K effects
    decrements, weights = theta[: L - 1], theta[L - 1 : L - 1 + F]
    bias, effects = theta[L - 1 + F], theta[L + F :]
    gamma = _examination(decrements)  # (L,)
    s = _sigmoid(x @ weights + bias + design.offsets(effects))  # (I,)
    p = np.clip(gamma[position] * s, EPS, 1 - EPS)
    loss = -np.mean(clicks * np.log(p) + (1 - clicks) * np.log(1 - p))
    r = -(clicks / p - (1 - clicks) / (1 - p)) / len(p)  # (I,)
    dz = r * gamma[position] * s * (1 - s)
    d_gamma = np.bincount(position, weights=r * s, minlength=L)  # (L,)
    tail = np.cumsum((gamma * d_gamma)[::-1])[::-1]  # (L,) sum over p >= q
    prior, d_prior = design.penalty(effects, len(p))
    grad = np.concatenate(
        [
            -_sigmoid(decrements) * tail[1:],
            x.T @ dz + 2 * l2 * weights,
            [dz.sum()],
            design.gradient(dz) + d_prior,
        ]
    )
    return float(loss + l2 * weights @ weights + prior), grad


def _logistic_loss(
    theta: np.ndarray, x: np.ndarray, targets: np.ndarray, l2: float, design: _EffectDesign
) -> tuple[float, np.ndarray]:
    """Negative mean log-posterior of ``sigmoid(x w + b + offsets)`` (+ L2 on ``w``, + the
    effects' prior) and its gradient; ``theta`` = ``[w (F), b, u (K)]``."""
    F = x.shape[1]
    weights, bias, effects = theta[:F], theta[F], theta[F + 1 :]
    p = np.clip(_sigmoid(x @ weights + bias + design.offsets(effects)), EPS, 1 - EPS)
    loss = -np.mean(targets * np.log(p) + (1 - targets) * np.log(1 - p))
    dz = (p - targets) / len(p)
    prior, d_prior = design.penalty(effects, len(p))
    grad = np.concatenate([x.T @ dz + 2 * l2 * weights, [dz.sum()], design.gradient(dz) + d_prior])
    return float(loss + l2 * weights @ weights + prior), grad


def _effect_design(
    keys: dict[str, np.ndarray], prior_sd: dict[str, float]
) -> tuple[_EffectDesign, list[tuple[str, np.ndarray]]]:
    """The design of the groups of ``prior_sd`` (each sd > 0) over ``keys`` (``{group: (I,)
    keys}`` of the impressions one fit reads), and each group's distinct keys in column
    order."""
    rows, precision, groups, offset = [], [], [], 0
    for group, sd in prior_sd.items():  # the caller keeps the groups with a prior sd > 0
        distinct, inverse = np.unique(np.asarray(keys[group]).astype(str), return_inverse=True)
        rows.append(inverse.reshape(-1) + offset)
        precision.append(np.full(len(distinct), sd**-2.0))
        groups.append((group, distinct))
        offset += len(distinct)
    count = len(next(iter(keys.values()))) if keys else 0
    index = np.stack(rows) if rows else np.zeros((0, count), dtype=np.int64)
    precision_all = np.concatenate(precision) if precision else np.zeros(0)
    return _EffectDesign(index, precision_all), groups


def _keyed_effects(
    design: _EffectDesign,
    groups: list[tuple[str, np.ndarray]],
    effects: np.ndarray,
    information: np.ndarray,
    prior_sd: dict[str, float],
) -> tuple[KeyedEffects, ...]:
    """Each group's fitted offsets with their Laplace sd: ``information`` ``(I,)`` is each
    impression's Fisher information about its logit."""
    precision = design.precision + design.gradient(information)  # (K,)
    sd = precision**-0.5
    out, start = [], 0
    for group, distinct in groups:
        stop = start + len(distinct)
        out.append(
            KeyedEffects(
                group=group,
                keys=tuple(distinct.tolist()),
                mean=torch.from_numpy(effects[start:stop].copy()),
                sd=torch.from_numpy(sd[start:stop].copy()),
                prior_sd=float(prior_sd[group]),
            )
        )
        start = stop
    return tuple(out)


def _minimise(loss: Any, size: int, args: tuple, max_iter: int) -> np.ndarray:
    """L-BFGS-B from zeros on a loss that returns its own gradient.

    Raises:
        ValueError: the fit ended with a non-finite parameter or loss (a reward built on it
            would be NaN, or the untrained start, for every page).
    """
    result = optimize.minimize(
        loss, np.zeros(size), args=args, jac=True, method="L-BFGS-B", options={"maxiter": max_iter}
    )
    if not (np.isfinite(result.x).all() and np.isfinite(result.fun)):
        raise ValueError(
            f"the click model's fit ended with non-finite parameters ({result.message}); "
            "check the logs for non-finite features or raise click_model.l2"
        )
    return result.x


def fit_position_based_click_model(  # noqa: PLR0913 - the logs and the fit knobs
    features: torch.Tensor,
    shown: torch.Tensor,
    clicks: torch.Tensor,
    long_views: torch.Tensor,
    l2: float = 1e-3,
    max_iter: int = 200,
    effect_keys: dict[str, np.ndarray] | None = None,
    prior_sd: dict[str, float] | None = None,
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
        effect_keys: ``{group: (S, L)}`` the key of each logged position's candidate in each
            group of per-key effects (``item``, ``query_item``, ...); none by default.
        prior_sd: ``{group: sd}`` the prior standard deviation of each group's offsets; a
            group at 0 (or absent) is left out.

    Raises:
        ValueError: shapes disagree, no impression, a click outside the impressions, a
            non-finite feature of an impression, or a fit that ends non-finite.

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
    if not np.isfinite(x[shown_np]).all():
        raise ValueError("features must be finite at every shown position")
    mean = x[shown_np].mean(axis=0)  # (F,)
    scale = x[shown_np].std(axis=0, ddof=1) if shown_np.sum() > 1 else np.ones(F)
    # A feature constant over the impressions carries no signal; scale 1 keeps it at 0.
    scale = np.where(scale > 1e-12, scale, 1.0)
    standard = (x - mean) / scale  # (S, L, F)

    effect_keys, prior_sd = (
        effect_keys or {},
        {g: sd for g, sd in (prior_sd or {}).items() if sd > 0},
    )
    for group in prior_sd:
        if group not in effect_keys or np.shape(effect_keys[group]) != (S, L):
            raise ValueError(f"effect_keys[{group!r}] must have shape (S, L) = {(S, L)}")
    position = np.broadcast_to(np.arange(L), (S, L))[shown_np]  # (I,)
    design, groups = _effect_design(
        {g: np.asarray(effect_keys[g])[shown_np] for g in prior_sd}, prior_sd
    )
    theta = _minimise(
        _click_loss,
        L - 1 + F + 1 + design.size,
        (standard[shown_np], position, clicks_np[shown_np], l2, design),
        max_iter,
    )
    gamma = _examination(theta[: L - 1])
    s = _sigmoid(
        standard[shown_np] @ theta[L - 1 : L - 1 + F]
        + theta[L - 1 + F]
        + design.offsets(theta[L + F :])
    )
    p = np.clip(gamma[position] * s, EPS, 1 - EPS)
    # Fisher information of an impression about its logit z, p = gamma * sigmoid(z):
    # (dp/dz)^2 / (p (1 - p)) = gamma s (1 - s)^2 / (1 - gamma s).
    click_effects = _keyed_effects(
        design, groups, theta[L + F :], gamma[position] * s * (1 - s) ** 2 / (1 - p), prior_sd
    )
    clicked = clicks_np.astype(bool)
    if clicked.any():
        design, groups = _effect_design(
            {g: np.asarray(effect_keys[g])[clicked] for g in prior_sd}, prior_sd
        )
        args = (standard[clicked], long_views_np[clicked], l2, design)
        long_view_theta = _minimise(_logistic_loss, F + 1 + design.size, args, max_iter)
        q = _sigmoid(
            standard[clicked] @ long_view_theta[:F]
            + long_view_theta[F]
            + design.offsets(long_view_theta[F + 1 :])
        )
        long_view_effects = _keyed_effects(
            design, groups, long_view_theta[F + 1 :], q * (1 - q), prior_sd
        )
    else:  # no click to learn from: no long views either
        long_view_theta = np.concatenate([np.zeros(F), [np.log(EPS)]])
        long_view_effects = ()
    exposure = shown_np.mean(axis=0)  # (L,)
    # Depth-based exposure is non-increasing; logs of your own may wobble, and the best-page
    # bound of the page reward needs non-increasing position weights.
    exposure = np.minimum.accumulate(exposure)

    def tensor(values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))

    return PositionBasedClickModel(
        examination=tensor(_examination(theta[: L - 1])),
        exposure=tensor(exposure),
        click_weights=tensor(theta[L - 1 : L - 1 + F]),
        click_bias=float(theta[L - 1 + F]),
        long_view_weights=tensor(long_view_theta[:F]),
        long_view_bias=float(long_view_theta[F]),
        feature_mean=tensor(mean),
        feature_scale=tensor(scale),
        click_effects=click_effects,
        long_view_effects=long_view_effects,
    )


def click_log_likelihood(
    model: PositionBasedClickModel,
    features: torch.Tensor,
    shown: torch.Tensor,
    clicks: torch.Tensor,
    keys: dict[str, np.ndarray] | None = None,
) -> float:
    """Mean log-likelihood per impression of ``clicks`` ``(S, L)`` under ``model`` (shapes as
    in ``fit_position_based_click_model``, ``keys`` its ``effect_keys``); higher is better."""
    shown = shown.bool()
    L = shown.shape[1]
    p = model.examination[:L] * model.attractiveness(features, keys)  # (S, L)
    p = p[shown].clamp(EPS, 1 - EPS)
    c = clicks.double()[shown]
    return float((c * p.log() + (1 - c) * (1 - p).log()).mean())


def long_view_log_likelihood(
    model: PositionBasedClickModel,
    features: torch.Tensor,
    clicks: torch.Tensor,
    long_views: torch.Tensor,
    keys: dict[str, np.ndarray] | None = None,
) -> float:
    """Mean log-likelihood per click of ``long_views`` ``(S, L)`` under ``model``."""
    clicked = clicks.bool()
    p = model.long_view(features, keys)[clicked].clamp(EPS, 1 - EPS)  # (C,)
    v = long_views.double()[clicked]
    return float((v * p.log() + (1 - v) * (1 - p).log()).mean())
