"""creditflow.chain.ab_test.controls: the shuffled-s_exp scores, the session-paired contrasts of
the A/B table and where the controls sit in it."""

import doctest
import math

import numpy as np
import pandas as pd
import pytest

from creditflow.chain.ab_test import controls
from creditflow.chain.ab_test.controls import (
    CONTRAST,
    CONTRASTS,
    R_OLD_ONLY,
    RANKER,
    SESSIONS_BASIS,
    SHUFFLED_EXP,
    beside_their_methods,
    contrast_rows,
    session_differences,
    shuffled_scores,
    with_contrasts,
)
from creditflow.chain.ab_test.reporting import trained_on
from creditflow.chain.ab_test.simulated_ab import CLICKS, LONG_VIEWS, summarise_ab
from creditflow.chain.reranker.data import LOGGED

NDCG = "true_ndcg_at_10"


def test_doctests():
    assert doctest.testmod(controls).failed == 0


def test_shuffled_scores_keep_each_querys_values_and_move_them():
    rng = np.random.default_rng(0)
    scores = pd.DataFrame(
        {
            "query_text": np.repeat(["a", "b", "c"], 8),
            "item_id": np.tile(np.arange(8), 3),
            "s_exp": rng.normal(size=24),
        }
    )
    out = shuffled_scores(scores, seed=1000)
    assert out[["query_text", "item_id"]].equals(scores[["query_text", "item_id"]])
    for query, part in out.groupby("query_text"):
        real = scores.loc[scores["query_text"] == query, "s_exp"]
        assert sorted(part["s_exp"]) == sorted(real), query  # the same multiset per query
        assert not np.array_equal(part["s_exp"].to_numpy(), real.to_numpy()), query
    assert shuffled_scores(scores, seed=1000).equals(out)  # seeded
    assert not shuffled_scores(scores, seed=1001).equals(out)
    # Per-item scores: one permutation over all items.
    items = scores[scores["query_text"] == "a"].drop(columns="query_text")
    moved = shuffled_scores(items, seed=0)
    assert sorted(moved["s_exp"]) == sorted(items["s_exp"])
    assert not moved["s_exp"].equals(items["s_exp"])


def _per_session() -> pd.DataFrame:
    """Three sessions; logged clicks mean 2, long views mean 1. b's rows in another session
    order than a's: the contrast pairs by session_id."""
    rows = {
        LOGGED: ([1.0, 2.0, 3.0], [0.5, 1.0, 1.5], [0.5, 0.5, 0.5]),
        "a": ([1.4, 2.2, 3.6], [1.0, 1.0, 1.0], [0.9, 0.8, 0.7]),
        "b": ([1.2, 2.0, 3.0], [0.5, 1.0, 1.5], [0.6, 0.8, 0.7]),
    }
    frames = [
        pd.DataFrame(
            {
                "ranker": name,
                "session_id": [10, 11, 12],
                "query_frequency_band": ["head", "tail", "tail"],
                CLICKS: clicks,
                LONG_VIEWS: long_views,
                NDCG: ndcg,
                "ctr": clicks,
                "long_view_rate": long_views,
            }
        )
        for name, (clicks, long_views, ndcg) in rows.items()
    ]
    frames[2] = frames[2].iloc[[2, 0, 1]]
    return pd.concat(frames, ignore_index=True)


def test_a_contrast_is_paired_over_sessions_by_hand():
    per_session = _per_session()
    differences = session_differences(per_session, "a", "b", k=10)
    # clicks a - b: +0.2, +0.2, +0.6 over the logged mean 2 -> +0.1, +0.1, +0.3.
    np.testing.assert_allclose(differences["ctr_change"].to_numpy(), [0.1, 0.1, 0.3])
    # long views a - b: +0.5, 0, -0.5 over the logged mean 1; nDCG: +0.3, 0, 0.
    np.testing.assert_allclose(differences["long_view_change"].to_numpy(), [0.5, 0.0, -0.5])
    np.testing.assert_allclose(differences["true_ndcg_diff"].to_numpy(), [0.3, 0.0, 0.0])

    row = contrast_rows(per_session, [("a", "b", "a vs b")], k=10).iloc[0]
    assert (row["contrast"], row["what"], row["sessions"]) == ("a - b", "a vs b", 3)
    # CTR: mean 0.5 / 3; deviations -1/15, -1/15, +2/15 -> s^2 = (6/225) / 2, se = s / sqrt(3)
    # = 1/15. It is a's change vs logged (7.2/3 / 2 - 1 = 0.2) minus b's (6.2/3 / 2 - 1).
    assert row["ctr_change"] == pytest.approx(0.5 / 3)
    assert row["ctr_change"] == pytest.approx((7.2 / 3 / 2 - 1) - (6.2 / 3 / 2 - 1))
    assert row["ctr_change_se"] == pytest.approx(1 / 15)
    t975, t80 = 4.302653, 1.060660  # Student t, 2 degrees of freedom
    assert row["ctr_change_low"] == pytest.approx(0.5 / 3 - t975 / 15, abs=1e-6)
    assert row["ctr_change_high"] == pytest.approx(0.5 / 3 + t975 / 15, abs=1e-6)
    assert row["ctr_change_mde"] == pytest.approx((t975 + t80) / 15, abs=1e-6)
    assert row["ctr_change_text"] == "+0.167 [-0.120, +0.454] not detectable (MDE 0.358)"
    # Long views: mean 0, s = 0.5, se = 0.5 / sqrt(3). nDCG: mean 0.1, s = sqrt(0.03), se 0.1.
    assert row["long_view_change"] == pytest.approx(0.0)
    assert row["long_view_change_se"] == pytest.approx(0.5 / math.sqrt(3))
    assert row["true_ndcg_diff"] == pytest.approx(0.1)
    assert row["true_ndcg_diff_se"] == pytest.approx(0.1)


def test_contrast_rows_follow_the_ranker_rows_and_leave_them_unchanged():
    per_session = _per_session()
    table = summarise_ab(per_session, k=10)
    out = with_contrasts(table, per_session, [("a", "b", "a vs b"), ("a", "absent", "-")], k=10)
    rankers = out[out["kind"] == RANKER]
    pd.testing.assert_frame_equal(rankers[table.columns], table)
    assert (out["basis"] == SESSIONS_BASIS).all()
    contrasts = out[out["kind"] == CONTRAST]  # the contrast with an absent ranker is left out
    assert contrasts[["ranker", "band", "what"]].values.tolist() == [["a - b", "all", "a vs b"]]
    assert contrasts["ctr_change"].iloc[0] == pytest.approx(0.5 / 3)
    assert rankers["ctr_change"].isna().all()
    # Without the controls' rankers the chain's table gets no contrast row.
    assert (with_contrasts(table, per_session, CONTRASTS, k=10)["kind"] == RANKER).all()
    assert "a - b" in controls.ab_log_text(out)


def test_each_control_sits_beside_its_method_and_says_what_it_learned():
    names = [LOGGED, "yaug_pretrained", "yaug_page_grpo", "yaug_page_grpo_sampled"]
    pages = dict.fromkeys([*names, R_OLD_ONLY, SHUFFLED_EXP])
    assert list(beside_their_methods(pages)) == [
        LOGGED,
        "yaug_pretrained",
        SHUFFLED_EXP,
        "yaug_page_grpo",
        R_OLD_ONLY,
        "yaug_page_grpo_sampled",
    ]
    assert list(beside_their_methods({LOGGED: 0, R_OLD_ONLY: 1})) == [LOGGED, R_OLD_ONLY]
    r_old_only = trained_on(R_OLD_ONLY, "fitted_click_model", 1.0)
    assert "R_old alone (alpha 1, beta 0" in r_old_only
    assert "fitted to the training logs" in r_old_only
    shuffled = trained_on(SHUFFLED_EXP, "fitted_click_model")
    assert "y_aug built from s_exp shuffled within each query" in shuffled
    assert "sees" in shuffled and "the shuffled s_exp." in shuffled
