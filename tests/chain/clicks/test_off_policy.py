"""Off-policy estimates from the logs: the doubly robust estimate of the logged page is its
logged clicks, and on a simulated world with a known answer the IPS and DR estimates of
another page find its true clicks even when the click model's attractiveness is wrong, where
the direct method does not."""

import numpy as np
import pandas as pd
import pytest
import torch

from creditflow.chain.clicks.logged import LoggedClickModel
from creditflow.chain.clicks.off_policy import off_policy_changes, off_policy_feedback
from creditflow.chain.clicks.position_based import PositionBasedClickModel
from creditflow.chain.world.catalogue import (
    ClickModel,
    candidate_response,
    generate_catalogue,
    generate_sessions,
)

L = 6


@pytest.fixture(scope="module")
def world():
    catalogue = generate_catalogue(120, seed=0, image_size=32)
    users = ClickModel(exposure_depth=(L, L))  # every position exposed: no blind spot
    sessions = generate_sessions(
        catalogue, n_queries=10, n_sessions=4000, list_length=L, seed=0, click_model=users
    )
    return catalogue, sessions, users


def _model_with(weights: torch.Tensor, attractiveness_logit: float) -> LoggedClickModel:
    """A click model with the given position weights whose attractiveness is one constant,
    wrong for most items (no feature weight)."""
    features = 5  # OBSERVABLE_FEATURES
    model = PositionBasedClickModel(
        examination=weights,
        exposure=torch.ones_like(weights),
        click_weights=torch.zeros(features, dtype=torch.float64),
        click_bias=attractiveness_logit,
        long_view_weights=torch.zeros(features, dtype=torch.float64),
        long_view_bias=-1.0,
        feature_mean=torch.zeros(features, dtype=torch.float64),
        feature_scale=torch.ones(features, dtype=torch.float64),
    )
    return LoggedClickModel(model, pd.Series(dtype=float), 0.5)


def test_dr_and_ips_find_a_new_pages_true_clicks_when_the_model_is_wrong(world):
    catalogue, sessions, users = world
    true_weights = torch.tensor(users.position_weights(L))
    wrong = _model_with(true_weights, attractiveness_logit=2.0)  # far too attractive
    logged = torch.tensor(np.array([list(o) for o in sessions["logged_order"]]))
    reversed_page = logged.flip(1)
    pages = {"logged": logged.unsqueeze(0), "reversed": reversed_page.unsqueeze(0)}
    per_session = off_policy_feedback(pages, sessions, catalogue, wrong)
    # The logged page's DR estimate is exactly what was logged.
    mine = per_session[per_session["ranker"] == "logged"]
    logged_clicks = np.array([sum(c) for c in sessions["clicks"]], dtype=float)
    np.testing.assert_allclose(mine["clicks_dr"].to_numpy(), logged_clicks)
    # The truth of the reversed page: the simulator's exact expectation.
    click, _ = candidate_response(sessions, catalogue, users)  # (N, L) per candidate
    position = reversed_page.argsort(dim=1).numpy()
    truth = (users.position_weights(L)[position] * click).sum(1).sum()
    reversed_rows = per_session[per_session["ranker"] == "reversed"]
    for estimator in ("ips", "dr"):
        assert reversed_rows[f"clicks_{estimator}"].sum() == pytest.approx(truth, rel=0.05)
    assert not reversed_rows["clicks_dm"].sum() == pytest.approx(truth, rel=0.3)
    changes = off_policy_changes(per_session, "logged").set_index(["ranker", "estimator"])
    assert changes.loc[("logged", "dr"), "clicks_change"] == pytest.approx(0.0, abs=1e-12)
    true_change = truth / logged_clicks.sum() - 1
    dr = changes.loc[("reversed", "dr")]
    assert abs(dr["clicks_change"] - true_change) < 3 * dr["clicks_change_se"] + 0.01
    assert dr["clicks_change"] < -0.1  # the reversed page loses clicks, and the estimate sees it


def test_pages_of_the_wrong_shape_are_refused(world):
    catalogue, sessions, users = world
    model = _model_with(torch.tensor(users.position_weights(L)), 0.0)
    with pytest.raises(ValueError, match=r"\(D, N, L\)"):
        off_policy_feedback({"x": torch.zeros(3, L, dtype=torch.long)}, sessions, catalogue, model)
    with pytest.raises(ValueError, match="clip"):
        off_policy_feedback({}, sessions, catalogue, model, clip=0.0)
