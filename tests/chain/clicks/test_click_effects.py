"""The position-based click model's per-key effects: gradients against finite differences,
recovery of per-item attractiveness the features cannot see, shrinkage of rarely shown keys,
posterior standard deviations that shrink with evidence, and the pessimistic lower bound."""

import numpy as np
import pytest
import torch

from creditflow.chain.clicks.position_based import (
    _click_loss,
    _effect_design,
    _logistic_loss,
    click_log_likelihood,
    fit_position_based_click_model,
)


def _numerical_gradient(loss, theta, args, eps=1e-6):
    grad = np.zeros_like(theta)
    for k in range(len(theta)):
        step = np.zeros_like(theta)
        step[k] = eps
        grad[k] = (loss(theta + step, *args)[0] - loss(theta - step, *args)[0]) / (2 * eps)
    return grad


@pytest.mark.parametrize("groups", [{}, {"item": 0.7}, {"item": 0.7, "pair": 0.4}])
def test_click_and_long_view_gradients_match_finite_differences(groups):
    rng = np.random.default_rng(0)
    impressions, features, positions = 40, 2, 4
    x = rng.normal(size=(impressions, features))
    position = rng.integers(0, positions, size=impressions)
    clicks = (rng.random(impressions) < 0.4).astype(float)
    keys = {"item": rng.integers(0, 5, impressions), "pair": rng.integers(0, 9, impressions)}
    design, _ = _effect_design({g: keys[g] for g in groups}, groups)
    theta = rng.normal(scale=0.5, size=positions - 1 + features + 1 + design.size)
    args = (x, position, clicks, 0.01, design)
    _, analytic = _click_loss(theta, *args)
    np.testing.assert_allclose(analytic, _numerical_gradient(_click_loss, theta, args), atol=1e-6)
    theta = rng.normal(scale=0.5, size=features + 1 + design.size)
    args = (x, clicks, 0.01, design)
    _, analytic = _logistic_loss(theta, *args)
    np.testing.assert_allclose(
        analytic, _numerical_gradient(_logistic_loss, theta, args), atol=1e-6
    )


def _world(seed=0, sessions=3000, positions=4, items=12):
    """Pages of ``positions`` of ``items`` items whose attractiveness is a hidden per-item
    logit the one feature (noise) does not carry; item 11 is shown only 5 times."""
    g = np.random.default_rng(seed)
    item_logit = np.linspace(-2.0, 1.0, items)
    shown_items = g.integers(0, items - 1, size=(sessions, positions))
    shown_items[:5, 0] = items - 1
    x = g.normal(size=(sessions, positions, 1))
    gamma = 1.0 / (np.arange(positions) + 1.0)
    p = gamma * (1 / (1 + np.exp(-item_logit[shown_items])))
    clicks = (g.random((sessions, positions)) < p).astype(float)
    long_views = clicks * (g.random((sessions, positions)) < 0.3)
    keys = {"item": shown_items.astype(str)}
    return (
        torch.tensor(x),
        torch.ones(sessions, positions, dtype=torch.bool),
        torch.tensor(clicks),
        torch.tensor(long_views),
        keys,
        item_logit,
    )


def test_item_effects_recover_what_the_features_cannot_see_and_shrink_the_rare_item():
    x, shown, clicks, views, keys, item_logit = _world()
    plain = fit_position_based_click_model(x, shown, clicks, views)
    model = fit_position_based_click_model(
        x, shown, clicks, views, effect_keys=keys, prior_sd={"item": 2.0}
    )
    (effects,) = model.click_effects
    index = [effects.keys.index(str(i)) for i in range(11)]
    fitted_logit = effects.mean[index].numpy() + model.click_bias
    assert np.corrcoef(fitted_logit, item_logit[:11])[0, 1] > 0.98
    assert click_log_likelihood(model, x, shown, clicks, keys) > click_log_likelihood(
        plain, x, shown, clicks
    )
    torch.testing.assert_close(
        model.examination,
        torch.tensor([1, 1 / 2, 1 / 3, 1 / 4], dtype=torch.float64),
        atol=0.05,
        rtol=0,
    )
    # The rare item (5 impressions) is less certain than any common one, and an item the
    # fit never saw gets the prior: offset 0, sd = prior sd.
    rare = effects.keys.index("11")
    assert effects.sd[rare] > effects.sd[index].max()
    mean, sd = effects.lookup(np.array(["11", "never-seen"]))
    assert mean[1] == 0.0 and sd[1] == 2.0
    # Pessimism lowers every attractiveness, the rare item's the most (relatively).
    candidates = {"item": np.array(["0", "5", "11"])}
    features = torch.zeros(3, 1, dtype=torch.float64)
    plain_a = model.attractiveness(features, candidates)
    low_a = model.attractiveness(features, candidates, pessimism=1.0)
    assert (low_a < plain_a).all()
    drop = (plain_a.logit() - low_a.logit()).numpy()
    assert drop[2] > drop[:2].max()
    with pytest.raises(ValueError, match="pass their keys"):
        model.attractiveness(features)


def test_a_tighter_prior_shrinks_the_effects_toward_the_features():
    x, shown, clicks, views, keys, _ = _world(seed=1, sessions=400)
    spread = []
    for prior in (0.05, 2.0):
        model = fit_position_based_click_model(
            x, shown, clicks, views, effect_keys=keys, prior_sd={"item": prior}
        )
        spread.append(float(model.click_effects[0].mean.std()))
    assert spread[0] < 0.2 * spread[1]


def test_a_non_finite_feature_fails_naming_it_instead_of_an_untrained_fit():
    # A NaN feature makes every loss NaN, and L-BFGS would hand back its zero start as if it
    # were a fit.
    x, shown, clicks, views, keys, _ = _world(seed=2, sessions=50)
    x[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="features must be finite"):
        fit_position_based_click_model(x, shown, clicks, views)
