"""Page GRPO's default R_old, a click model fitted to the logs: it recovers a known position
bias, round-trips through its table, and neither its fit nor the reward it gives page GRPO
reads the simulator's hidden truth."""

import pandas as pd
import pytest
import torch

from creditflow.chain.clicks.logged import (
    attractiveness_recovery,
    click_model_from_table,
    click_model_table,
    fit_click_model,
    fit_logged_click_model,
    recovery_table,
    validation_split,
)
from creditflow.chain.clicks.position_based import (
    click_log_likelihood,
    fit_position_based_click_model,
)
from creditflow.chain.reranker.page_reward import (
    FittedClickFeedback,
    SimulatedFeedback,
    check_user_budget,
    page_reward_of,
)
from creditflow.chain.reranker.policy import format_ranking
from creditflow.chain.world.catalogue import ClickModel, generate_catalogue, generate_sessions
from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError

L = 8
PARAMS = {
    "validation": {"fraction": 0.25, "seed": 0},
    "click_model": {
        "l2": 1e-3,
        "max_iter": 100,
        "effects": {"item": 0.5, "query_item": 0.3},
        "item_logged_rank_pseudo_count": 2.0,
    },
}
BLOCK = {  # conf/base's reward block at its defaults
    "alpha": 0.9,
    "beta": 0.1,
    "k": 5,
    "gain_mode": "rank",
    "r_old": "fitted_click_model",
    "long_view_weight": 1.0,
    "feedback_seed": 0,
    "online_user_budget": 100,
}


@pytest.fixture(scope="module")
def catalogue() -> pd.DataFrame:
    return generate_catalogue(200, seed=0, image_size=32)


@pytest.fixture(scope="module")
def sessions(catalogue) -> pd.DataFrame:
    world = ClickModel(exposure_depth=(3, 6))
    return generate_sessions(
        catalogue, n_queries=20, n_sessions=240, list_length=L, seed=0, click_model=world
    )


@pytest.fixture(scope="module")
def fitted(sessions, catalogue):
    return fit_logged_click_model(sessions, catalogue, PARAMS)


def test_fit_recovers_a_known_position_bias_on_synthetic_impressions():
    # P(click | shown at p) = (p + 1)^-1 * sigmoid(x): the fit's gamma is 1, 1/2, 1/3, 1/4
    # within sampling noise of 6000 sessions, and beats a fit that ignores the feature.
    g = torch.Generator().manual_seed(1)
    S, P = 6000, 4
    x = torch.randn(S, P, 1, generator=g, dtype=torch.float64)
    truth = (torch.arange(P) + 1.0) ** -1 * torch.sigmoid(2 * x[..., 0])
    clicks = (torch.rand(S, P, generator=g, dtype=torch.float64) < truth).double()
    shown = torch.ones(S, P, dtype=torch.bool)
    model = fit_position_based_click_model(x, shown, clicks, torch.zeros_like(clicks))
    torch.testing.assert_close(
        model.examination,
        torch.tensor([1, 1 / 2, 1 / 3, 1 / 4], dtype=torch.float64),
        atol=0.04,
        rtol=0,
    )
    blind = fit_position_based_click_model(0 * x, shown, clicks, torch.zeros_like(clicks))
    assert click_log_likelihood(model, x, shown, clicks) > click_log_likelihood(
        blind, x, shown, clicks
    )


def test_fit_diagnostics_and_table_round_trip(fitted, sessions, catalogue):
    model, diagnostics = fitted
    assert set(diagnostics["split"]) == {"fit", "validation"}
    assert diagnostics["model"].unique().tolist() == [
        "constant",
        "position_only",
        "features",
        "features_logged_rank",
        "configured",
    ]
    assert diagnostics.groupby("model")["sessions"].sum().eq(len(sessions)).all()
    validation = diagnostics[diagnostics["split"] == "validation"].set_index("model")
    # Features help beyond position, and position beyond one CTR, on sessions the fit never saw.
    assert (
        validation.loc["features", "click_loglik"]
        > validation.loc["position_only", "click_loglik"]
        > validation.loc["constant", "click_loglik"]
    )
    assert validation.loc["position_only", "loglik_gain_vs_position_only"] == 0.0
    # Perplexity 1 is perfect and 2 a coin: every model lies between (clicks are rarer than 1/2).
    assert validation["click_perplexity"].between(1.0, 2.0).all()
    assert validation["perplexity_at_0"].notna().all()
    # The configured model has item and query-item effects on both logits and the logged rank.
    assert [e.group for e in model.model.click_effects] == ["item", "query_item"]
    assert [e.group for e in model.model.long_view_effects] == ["item", "query_item"]
    assert model.feature_names[-1] == "item_logged_rank" and len(model.item_logged_rank) > 0
    again = click_model_from_table(click_model_table(model))
    for name in ("examination", "exposure", "click_weights", "long_view_weights", "feature_scale"):
        torch.testing.assert_close(getattr(again.model, name), getattr(model.model, name))
    for mine, theirs in zip(
        again.model.click_effects + again.model.long_view_effects,
        model.model.click_effects + model.model.long_view_effects,
        strict=True,
    ):
        assert mine.keys == theirs.keys and mine.prior_sd == theirs.prior_sd
        torch.testing.assert_close(mine.mean, theirs.mean)
        torch.testing.assert_close(mine.sd, theirs.sd)
    pd.testing.assert_series_equal(
        again.item_logged_rank, model.item_logged_rank, check_names=False
    )
    assert again.default_rank == model.default_rank
    recovery = recovery_table(model, ClickModel(exposure_depth=(3, 6)))
    assert recovery["examination_fitted"].iloc[0] == recovery["examination_true"].iloc[0] == 1.0
    assert recovery["position_weight_abs_error"].max() < 0.15


def test_pessimism_lowers_the_fitted_r_old_where_the_logs_say_little(fitted, sessions, catalogue):
    model = fitted[0]
    scores = torch.rand(len(sessions), L, generator=torch.Generator().manual_seed(0))
    plain = page_reward_of(BLOCK, sessions, catalogue, scores, ClickModel(), model)
    careful = page_reward_of(
        {**BLOCK, "pessimism": 2.0}, sessions, catalogue, scores, ClickModel(), model
    )
    assert (careful.business.click < plain.business.click).all()
    assert (careful.business.long_view < plain.business.long_view).all()


def _hide_the_truth_differently(sessions, catalogue):
    """The same logs (candidates, orders, labels, clicks, long views) in a world whose hidden
    columns are permuted: true_quality, true_clickbait and every true_* over items, the
    per-candidate relevance and true_quality within each session."""
    rng = torch.Generator().manual_seed(7)
    other = catalogue.copy()
    for column in [c for c in catalogue.columns if c.startswith("true_")]:
        other[column] = catalogue[column].to_numpy()[
            torch.randperm(len(catalogue), generator=rng).numpy()
        ]
    shuffled = sessions.copy()
    for column in ("relevance", "true_quality"):
        shuffled[column] = [
            list(pd.Series(v).sample(frac=1.0, random_state=3)) for v in sessions[column]
        ]
    return shuffled, other


def test_the_fit_never_reads_the_hidden_truth(sessions, catalogue, fitted):
    shuffled, other = _hide_the_truth_differently(sessions, catalogue)
    model, _ = fit_logged_click_model(shuffled, other, PARAMS)
    pd.testing.assert_frame_equal(click_model_table(model), click_model_table(fitted[0]))


def test_default_r_old_reads_no_hidden_truth_nor_the_simulators_click_model(
    sessions, catalogue, fitted
):
    """Every page's default R_old is unchanged when true_quality, true_clickbait, relevance
    and the ClickModel's parameters all change; the oracle source's is not (the check bites)."""
    model = fitted[0]
    scores = torch.rand(len(sessions), L, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    pages = [format_ranking(torch.randperm(L, generator=g)) for _ in range(len(sessions))]
    rows = torch.arange(len(sessions))
    shuffled, other = _hide_the_truth_differently(sessions, catalogue)
    world = ClickModel()
    other_world = ClickModel(exposure_depth=(2, 5), position_bias=2.0, quality=3.0, relevance=-1.0)

    reward = page_reward_of(BLOCK, sessions, catalogue, scores, world, model)
    assert isinstance(reward.business, FittedClickFeedback)
    moved = page_reward_of(BLOCK, shuffled, other, scores, other_world, model)
    torch.testing.assert_close(
        reward(pages, rows)["r_old"], moved(pages, rows)["r_old"], rtol=0, atol=0
    )

    oracle = {**BLOCK, "r_old": "oracle_expected"}
    truth = page_reward_of(oracle, sessions, catalogue, scores, world)
    assert isinstance(truth.business, SimulatedFeedback)
    peeked = page_reward_of(oracle, shuffled, other, scores, other_world)
    assert not torch.allclose(truth(pages, rows)["r_old"], peeked(pages, rows)["r_old"])


def test_online_sampled_counts_its_users_against_the_budget(sessions, catalogue):
    scores = torch.rand(len(sessions), L)
    config = GRPOConfig(steps=2, prompts_per_step=4, group_size=8)
    online = {**BLOCK, "r_old": "online_sampled", "online_user_budget": 64}
    assert check_user_budget(online, config) == 64
    assert check_user_budget(BLOCK, config) == 0
    with pytest.raises(ConfigError, match="online_user_budget"):
        check_user_budget({**online, "online_user_budget": 63}, config)
    reward = page_reward_of(online, sessions, catalogue, scores, ClickModel())
    pages = [format_ranking(range(L))] * 64
    reward(pages, torch.zeros(64, dtype=torch.long))
    assert reward.business.users == 64
    with pytest.raises(RuntimeError, match="online_user_budget"):
        reward(pages[:1], torch.zeros(1, dtype=torch.long))


def test_validation_split_is_part_of_the_training_logs(sessions):
    fit, validation = validation_split(sessions, PARAMS["validation"])
    assert set(fit["session_id"]).isdisjoint(validation["session_id"])
    assert set(fit["session_id"]) | set(validation["session_id"]) == set(sessions["session_id"])
    assert len(validation) == 60


def test_fitted_r_old_hand_case():
    # Attractiveness 0.2, 0.5, 0.4, long views 0.1, 0.6, 0.3, position weights 1, 1/4, 0:
    # values a * (1 + l) 0.22, 0.8, 0.52, best page 1 2 0 worth 0.8 + 0.52 / 4 = 0.93.
    # Page 0 2 1: clicks 0.2 + 0.1 = 0.3, long views 0.02 + 0.03 -> 0.35 / 0.93.
    feedback = FittedClickFeedback(
        torch.tensor([[0.2, 0.5, 0.4]]),
        torch.tensor([[0.1, 0.6, 0.3]]),
        torch.tensor([1.0, 0.25, 0.0]),
    )
    out = feedback(torch.tensor([[1, 2, 0], [0, 2, 1]]), torch.tensor([0, 0]), ["", ""])
    torch.testing.assert_close(out["r_old"], torch.tensor([1.0, 0.35 / 0.93]))
    torch.testing.assert_close(out["clicks"], torch.tensor([0.6, 0.3]))


def test_attractiveness_recovery_compares_the_fit_with_the_simulators_users(
    fitted, sessions, catalogue
):
    world = ClickModel(exposure_depth=(3, 6))
    table = attractiveness_recovery(fitted[0], sessions, catalogue, world).set_index("part")
    assert table.index.tolist() == ["click", "long_view"]
    assert (table["candidates"] == len(sessions) * L).all()
    # The fit sees the clicks these users made: its attractiveness follows theirs.
    assert table.loc["click", "logit_correlation"] > 0.5
    assert table.loc["click", "abs_error"] < 0.2
    # Users who ignore everything but relevance are another world: the fit no longer matches.
    other = ClickModel(exposure_depth=(3, 6), popularity=0.0, clickbait=0.0, relevance=-3.0)
    away = attractiveness_recovery(fitted[0], sessions, catalogue, other).set_index("part")
    assert away.loc["click", "logit_correlation"] < table.loc["click", "logit_correlation"] - 0.3


def test_cross_validation_holds_every_session_out_once(sessions, catalogue):
    params = {**PARAMS, "click_model": {**PARAMS["click_model"], "cv_folds": 3}}
    _, table = fit_logged_click_model(sessions, catalogue, params)
    cv = table[table["split"] == "cross_validation"].set_index("model")
    assert list(cv.index) == list(table[table["split"] == "fit"]["model"])
    assert (cv["sessions"] == len(sessions)).all()
    logged = sum(
        label != "U" for labels in sessions["labels"] for label in labels
    )  # every impression of every session, scored once
    assert (cv["impressions"] == logged).all()
    assert cv.loc["position_only", "loglik_gain_vs_position_only"] == 0.0
    assert (cv.loc[["features", "configured"], "loglik_gain_vs_position_only_se"] > 0).all()


def test_the_configured_model_alone_is_the_fit_tables_model(fitted, sessions, catalogue):
    alone = fit_click_model(sessions, catalogue, PARAMS)
    pd.testing.assert_frame_equal(click_model_table(alone), click_model_table(fitted[0]))
