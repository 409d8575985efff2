"""The simulated online A/B (chain.ab_test.simulated_ab): a three-candidate session by hand, exact vs
Monte Carlo parity, the paired standard error against a loop, and the break-even search."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from creditflow.chain.ab_test.simulated_ab import (
    SimulatedUsers,
    ab_session_metrics,
    break_even,
    oracle_pages,
    paired_ratio_change,
    simulated_users,
    summarise_ab,
    sweep_click_model,
)
from creditflow.chain.world.catalogue import ClickModel, generate_catalogue, generate_sessions

LOG2_3 = math.log2(3)


def _hand_session() -> tuple[pd.DataFrame, SimulatedUsers]:
    """Candidates 0, 1, 2: P(click | examined) 0.2, 0.5, 0.4; P(long | click) 0.1, 0.6, 0.3;
    true quality 0.9, 0.3, 0.6. Depth uniform on {1, 2} and position bias 1: exposure 1, 1/2,
    0 and examination 1, 1/2, 1/3, so position weights 1, 1/4, 0 and 1.5 exposed positions.
    Logged order 1, 2, 0 with clicks on candidates 1 and 2 (logged positions 0 and 1)."""
    sessions = pd.DataFrame(
        {
            "session_id": [7],
            "query_frequency_band": ["tail"],
            "candidates": [[10, 11, 12]],
            "logged_order": [[1, 2, 0]],
            "clicks": [[0, 1, 1]],
            "true_quality": [[0.9, 0.3, 0.6]],
        }
    )
    users = SimulatedUsers(
        torch.tensor([[0.2, 0.5, 0.4]], dtype=torch.float64),
        torch.tensor([[0.1, 0.6, 0.3]], dtype=torch.float64),
        ClickModel(exposure_depth=(1, 2), position_bias=1.0),
    )
    return sessions, users


def test_a_three_candidate_session_by_hand():
    sessions, users = _hand_session()
    pages = {"logged": torch.tensor([[[1, 2, 0]]]), "other": torch.tensor([[[0, 2, 1]]])}
    rows = ab_session_metrics(pages, sessions, users, k=2).set_index("ranker")
    # logged page 1, 2, 0: clicks 1 * 0.5 + 0.25 * 0.4 = 0.6, long views 0.5 * 0.6 + 0.1 * 0.3
    # = 0.33, quality-weighted 0.5 * 0.3 + 0.1 * 0.6 = 0.21; per exposed position (1.5): 0.4
    # and 0.22. other page 0, 2, 1: clicks 0.2 + 0.1 = 0.3, long views 0.02 + 0.03 = 0.05,
    # quality-weighted 0.2 * 0.9 + 0.1 * 0.6 = 0.24.
    expected = {
        "clicks_per_page": (0.6, 0.3),
        "long_views_per_page": (0.33, 0.05),
        "quality_weighted_clicks": (0.21, 0.24),
        "ctr": (0.4, 0.2),
        "long_view_rate": (0.22, 0.05 / 1.5),
        # true quality in order: logged [0.3, 0.6] vs ideal [0.9, 0.6]; other is ideal.
        "true_ndcg_at_2": ((0.3 + 0.6 / LOG2_3) / (0.9 + 0.6 / LOG2_3), 1.0),
        # logged clicks [0, 1, 1]: the logged page has both on top (1), other has [0, 1].
        "counterfactual_click_ndcg_at_2": (1.0, (1 / LOG2_3) / (1 + 1 / LOG2_3)),
        # over their propensities 1 (position 0) and 1/4 (position 1): gains [0, 1, 4]; the
        # logged page has [1, 4] against the ideal [4, 1], other [0, 4].
        "ips_click_ndcg_at_2": (
            (1 + 4 / LOG2_3) / (4 + 1 / LOG2_3),
            (4 / LOG2_3) / (4 + 1 / LOG2_3),
        ),
    }
    for column, (logged, other) in expected.items():
        assert rows.loc["logged", column] == pytest.approx(logged), column
        assert rows.loc["other", column] == pytest.approx(other), column
    assert rows["session_id"].tolist() == [7, 7]
    assert rows["query_frequency_band"].tolist() == ["tail", "tail"]


def test_sampled_pages_are_averaged():
    sessions, users = _hand_session()
    pages = {"two": torch.tensor([[[1, 2, 0]], [[0, 2, 1]]])}  # (D = 2, N = 1, L = 3)
    row = ab_session_metrics(pages, sessions, users, k=2).iloc[0]
    assert row["clicks_per_page"] == pytest.approx((0.6 + 0.3) / 2)
    assert row["true_ndcg_at_2"] == pytest.approx(
        ((0.3 + 0.6 / LOG2_3) / (0.9 + 0.6 / LOG2_3) + 1.0) / 2
    )


@pytest.fixture(scope="module")
def world():
    catalogue = generate_catalogue(80, seed=1, image_size=32)
    sessions = generate_sessions(catalogue, n_queries=8, n_sessions=60, list_length=8, seed=2)
    return catalogue, sessions


def test_exact_expectations_match_common_random_number_monte_carlo(world):
    catalogue, sessions = world
    users = simulated_users(sessions, catalogue, ClickModel())
    g = torch.Generator().manual_seed(0)
    shuffled = torch.stack([torch.randperm(8, generator=g) for _ in range(len(sessions))])
    logged = torch.tensor([list(o) for o in sessions["logged_order"]])
    pages = {"logged": logged.unsqueeze(0), "shuffled": shuffled.unsqueeze(0)}
    pages |= oracle_pages(users, sessions)
    exact = ab_session_metrics(pages, sessions, users)
    monte_carlo = ab_session_metrics(pages, sessions, users, method="monte_carlo", draws=3000)
    for column in ("clicks_per_page", "long_views_per_page", "quality_weighted_clicks"):
        # Per-session counts are sums of Bernoulli draws: std <= sqrt(8 * 0.25 / 3000) = 0.026.
        np.testing.assert_allclose(monte_carlo[column], exact[column], atol=0.1)
        # Over 60 sessions the means agree much more closely.
        np.testing.assert_allclose(
            monte_carlo.groupby("ranker")[column].mean(),
            exact.groupby("ranker")[column].mean(),
            atol=0.015,
        )
    # The deterministic columns are the same either way.
    pd.testing.assert_series_equal(exact["true_ndcg_at_10"], monte_carlo["true_ndcg_at_10"])
    # Paired changes vs the logged order agree, and common random numbers make the Monte Carlo
    # change far less noisy than two independent draws would be.
    table_exact = summarise_ab(exact, k=10).set_index(["ranker", "band"])
    table_mc = summarise_ab(monte_carlo, k=10).set_index(["ranker", "band"])
    for ranker in ("shuffled", "oracle_clicks"):
        assert table_mc.loc[(ranker, "all"), "ctr_change_vs_logged"] == pytest.approx(
            table_exact.loc[(ranker, "all"), "ctr_change_vs_logged"], abs=0.02
        )
    # The click oracle gets the most clicks of any page, session by session.
    by_ranker = exact.pivot(index="session_id", columns="ranker", values="clicks_per_page")
    assert (
        by_ranker["oracle_clicks"] >= by_ranker.drop(columns="oracle_clicks").max(axis=1) - 1e-12
    ).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paired_ratio_change_matches_the_delta_method_written_out(seed):
    rng = np.random.default_rng(seed)
    baseline = rng.uniform(0.5, 2.0, 30)
    treatment = baseline * rng.uniform(0.8, 1.1, 30)
    change, se = paired_ratio_change(treatment, baseline)
    ratio = sum(treatment) / sum(baseline)
    residuals = [t - ratio * b for t, b in zip(treatment, baseline, strict=True)]
    mean = sum(residuals) / len(residuals)
    std = math.sqrt(sum((r - mean) ** 2 for r in residuals) / (len(residuals) - 1))
    assert change == pytest.approx(ratio - 1)
    assert se == pytest.approx(std / (math.sqrt(30) * (sum(baseline) / 30)))
    # Pairing: the same treatment against a copy of itself has no spread at all.
    assert paired_ratio_change(baseline, baseline) == (0.0, 0.0)


def test_summarise_ab_rows_bands_and_paired_columns(world):
    catalogue, sessions = world
    users = simulated_users(sessions, catalogue, ClickModel())
    logged = torch.tensor([list(o) for o in sessions["logged_order"]]).unsqueeze(0)
    pages = {"logged": logged, **oracle_pages(users, sessions)}
    per_session = ab_session_metrics(pages, sessions, users)
    table = summarise_ab(per_session, k=10)
    bands = [b for b in ("head", "torso", "tail") if b in set(sessions["query_frequency_band"])]
    assert table["ranker"].tolist() == [r for r in pages for _ in range(len(bands) + 1)]
    assert table["band"].tolist() == (bands + ["all"]) * len(pages)
    for column in (
        "ctr",
        "ctr_se",
        "long_view_rate_se",
        "true_ndcg_at_10_se",
        "ctr_change_vs_logged_se",
        "true_ndcg_at_10_diff_vs_logged",
        "ips_click_ndcg_at_10",
        "counterfactual_click_ndcg_at_10",
    ):
        assert column in table.columns, column
    logged_rows = table[table["ranker"] == "logged"]
    assert (logged_rows["ctr_change_vs_logged"] == 0).all()
    quality = table.set_index(["ranker", "band"]).loc[("oracle_quality", "all")]
    assert quality["true_ndcg_at_10"] == pytest.approx(1.0)
    row = table.set_index(["ranker", "band"]).loc[("oracle_clicks", "all")]
    mean = per_session.groupby("ranker")["ctr"].mean()
    assert row["ctr_change_vs_logged"] == pytest.approx(mean["oracle_clicks"] / mean["logged"] - 1)


def test_sweep_and_break_even(world):
    catalogue, sessions = world
    users = simulated_users(sessions, catalogue, ClickModel())
    logged = torch.tensor([list(o) for o in sessions["logged_order"]]).unsqueeze(0)
    pages = {"logged": logged, "oracle_quality": oracle_pages(users, sessions)["oracle_quality"]}
    sweep = sweep_click_model(pages, sessions, catalogue, ClickModel(), "quality", [0.0, 2.0, 6.0])
    assert sweep["quality"].unique().tolist() == [0.0, 2.0, 6.0]
    change = sweep[(sweep["ranker"] == "oracle_quality") & (sweep["band"] == "all")]
    # The more clicks follow quality, the better the quality order does on clicks.
    assert change["ctr_change_vs_logged"].is_monotonic_increasing
    even = break_even(sweep, "quality", "ctr_change_vs_logged")
    assert even["logged"] == 0.0  # no change at all: even from the first value
    if even["oracle_quality"] is not None:
        assert 0.0 < even["oracle_quality"] <= 6.0
    frame = pd.DataFrame({"w": [0.0, 1.0], "ranker": "a", "band": "all", "c": [-0.1, -0.05]})
    assert break_even(frame, "w", "c") == {"a": None}
