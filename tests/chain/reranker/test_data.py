"""The reranker chain's tables <-> padded tensors (``chain.reranker.data``), the seeded
reranker builder and greedy decoding; also ``checked_options``, which the preference-pair and
MovieLens-session nodes use."""

import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from creditflow.chain.config import FEATURE_NAMES
from creditflow.chain.reranker.data import (
    LOGGED,
    evaluate_pages,
    inputs_for,
    pages_frame,
    pages_from_frame,
    rankings_frame,
    rankings_from_frame,
    reranker_inputs,
    serve_pages,
    session_exp_scores,
    split_sessions,
)
from creditflow.chain.reranker.model import build_reranker
from creditflow.chain.reranker.policy import greedy_rankings
from creditflow.chain.reranker.training import session_features
from creditflow.chain.world.catalogue import generate_catalogue, generate_sessions
from creditflow.config.values import checked_options


@pytest.fixture(scope="module")
def world():
    items = generate_catalogue(30, seed=0, image_size=32)
    return items, generate_sessions(items, n_queries=4, n_sessions=12, list_length=5, seed=0)


def _train(model, steps, lr=0.1, seed=0):
    """A stand-in with one required and two optional arguments."""


def test_checked_options_rejects_unknown_and_missing_names():
    assert checked_options({"steps": 2}, _train, "x", taken=["model"]) == {"steps": 2}
    with pytest.raises(
        ValueError, match=r"unknown x option\(s\) \['model'\]; valid: \['lr', 'seed', 'steps'\]"
    ):
        checked_options({"steps": 2, "model": 1}, _train, "x", taken=["model"])
    with pytest.raises(ValueError, match=r"x needs option\(s\) \['steps'\]"):
        checked_options({"lr": 0.5}, _train, "x", taken=["model"])


@given(n=st.integers(2, 60), fraction=st.floats(0.05, 0.95), seed=st.integers(0, 3))
def test_split_sessions_partitions_in_order(n, fraction, seed):
    sessions = pd.DataFrame({"session_id": range(n), "x": range(0, 2 * n, 2)})
    n_heldout = round(fraction * n)
    if not 0 < n_heldout < n:
        with pytest.raises(ValueError, match="leaves one side empty"):
            split_sessions(sessions, fraction, seed)
        return
    train, heldout = split_sessions(sessions, fraction, seed)
    assert len(heldout) == n_heldout and len(train) == n - n_heldout
    assert sorted([*train["session_id"], *heldout["session_id"]]) == list(range(n))
    assert train["session_id"].is_monotonic_increasing
    assert heldout["session_id"].is_monotonic_increasing
    again, _ = split_sessions(sessions, fraction, seed)
    pd.testing.assert_frame_equal(again, train)


def test_split_sessions_rejects_fractions_outside_the_unit_interval():
    with pytest.raises(ValueError, match="heldout_fraction must lie in"):
        split_sessions(pd.DataFrame({"session_id": range(4)}), 1.0, seed=0)


def test_session_exp_scores_follow_the_candidates_and_pad_with_zero():
    # Session 0 has candidates [7, 3], session 1 [3, 5, 7]: scores looked up per item.
    sessions = pd.DataFrame({"candidates": [[7, 3], [3, 5, 7]]})
    scores = pd.DataFrame({"item_id": [3, 5, 7], "s_exp": [0.5, -1.0, 2.0]})
    expected = torch.tensor([[2.0, 0.5, 0.0], [0.5, -1.0, 2.0]])
    torch.testing.assert_close(session_exp_scores(sessions, scores), expected)
    with pytest.raises(ValueError, match=r"1 candidate\(s\) have no experience score, e.g. \[5\]"):
        session_exp_scores(sessions, scores[scores["item_id"] != 5])


def test_rankings_round_trip_through_a_table_with_ragged_sessions():
    sessions = pd.DataFrame({"session_id": [10, 11], "candidates": [[7, 3], [3, 5, 7]]})
    rankings = torch.tensor([[1, 0, 2], [2, 0, 1]])  # session 10's padding slot (2) comes last
    table = rankings_frame(sessions, rankings)
    assert table["ranking"].tolist() == [[1, 0], [2, 0, 1]]
    assert table["ranked_items"].tolist() == [[3, 7], [7, 3, 5]]
    shuffled = table.iloc[::-1].reset_index(drop=True)  # matched by session_id, not position
    assert torch.equal(rankings_from_frame(sessions, shuffled), rankings)
    with pytest.raises(ValueError, match=r"no ranking for session\(s\) \[11\]"):
        rankings_from_frame(sessions, table.iloc[:1])


def test_reranker_inputs_zero_only_the_excluded_features(world):
    items, sessions = world
    scores = pd.DataFrame({"item_id": items["item_id"], "s_exp": items.index * 0.1})
    excluded = ["label_clicked", "exp_score"]
    features, mask = reranker_inputs(sessions, items, scores, excluded)
    reference, reference_mask = session_features(
        sessions, items, session_exp_scores(sessions, scores)
    )
    assert torch.equal(mask, reference_mask)
    for column, name in enumerate(FEATURE_NAMES):
        expected = (
            torch.zeros_like(reference[..., column]) if name in excluded else reference[..., column]
        )
        assert torch.equal(features[..., column], expected), name
    no_scores, _ = reranker_inputs(sessions, items, None)
    assert torch.equal(
        no_scores[..., FEATURE_NAMES.index("exp_rank_gain")], torch.zeros(mask.shape)
    )
    with pytest.raises(ValueError, match=r"unknown feature\(s\) \['clicks'\]"):
        reranker_inputs(sessions, items, scores, ["clicks"])


def test_greedy_rankings_do_not_depend_on_the_batch_size(world):
    items, sessions = world
    features, mask = reranker_inputs(sessions, items, None)
    model = build_reranker(features.shape[-1], {"d_model": 8, "n_heads": 2}, seed=3)
    same_seed = build_reranker(features.shape[-1], {"d_model": 8, "n_heads": 2}, seed=3)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), same_seed.parameters(), strict=True)
    )
    whole = greedy_rankings(model, features, mask)
    assert torch.equal(greedy_rankings(model, features, mask, batch_size=5), whole)
    assert all(sorted(row) == list(range(5)) for row in whole.tolist())


def test_inputs_for_follows_the_reranker_setting(world):
    items, sessions = world
    scores = pd.DataFrame({"item_id": items["item_id"], "s_exp": items.index * 0.1})
    params = {
        "features": {"exclude": []},
        "rerankers": {"with": {"use_exp_scores": True}, "without": {"use_exp_scores": False}},
    }
    column = FEATURE_NAMES.index("exp_score")
    with_scores, _ = inputs_for(sessions, items, scores, params, "with")
    without, _ = inputs_for(sessions, items, scores, params, "without")
    assert with_scores[..., column].abs().sum() > 0
    assert torch.equal(without[..., column], torch.zeros(without.shape[:2]))
    with pytest.raises(
        ValueError, match=r"unknown reranker 'other'; parameters define \['with', 'without'\]"
    ):
        inputs_for(sessions, items, scores, params, "other")


def test_served_pages_round_trip_and_sampled_pages_are_seeded(world):
    items, sessions = world
    scores = pd.DataFrame({"item_id": items["item_id"], "s_exp": items["true_quality"]})
    params = {"rerankers": {"a": {"use_exp_scores": True}}, "features": {"exclude": []}}
    model = build_reranker(len(FEATURE_NAMES), {"d_model": 8, "n_heads": 2}, seed=0)
    serve = {
        "sessions": sessions,
        "item_table": items,
        "item_scores": scores,
        "models": {"m": model},
        "kinds": {"m": "a"},
        "params": params,
        "sampled": {"m_sampled": "m"},
        "temperature": 1.5,
        "samples": 3,
    }
    pages = serve_pages(**serve, seed=4)
    assert list(pages) == [LOGGED, "m", "m_sampled"]
    assert pages[LOGGED].shape == pages["m"].shape == (1, 12, 5)
    assert pages["m_sampled"].shape == (3, 12, 5)
    assert torch.equal(pages["m_sampled"], serve_pages(**serve, seed=4)["m_sampled"])
    assert not torch.equal(pages["m_sampled"], serve_pages(**serve, seed=5)["m_sampled"])
    assert torch.equal(
        pages["m"][0], greedy_rankings(model, *inputs_for(sessions, items, scores, params, "a"))
    )
    back = pages_from_frame(pages_frame(pages, sessions), sessions)
    assert list(back) == list(pages) and all(torch.equal(back[k], pages[k]) for k in pages)
    # Sampled pages are evaluated per draw and averaged per session.
    table = evaluate_pages(pages, sessions, scores, k=3)
    sampled = table[table["ranker"] == "m_sampled"].reset_index(drop=True)
    draws = [
        evaluate_pages({"d": p.unsqueeze(0)}, sessions, scores, k=3) for p in pages["m_sampled"]
    ]
    expected = sum(d["true_ndcg"] for d in draws) / 3
    pd.testing.assert_series_equal(sampled["true_ndcg"], expected, check_names=False)
    with pytest.raises(ValueError, match="unknown model"):
        serve_pages(**{**serve, "sampled": {"x": "nope"}})
