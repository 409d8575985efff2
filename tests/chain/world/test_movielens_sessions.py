"""MovieLens ranking sessions (docs/methods/experience.md on real data): schema parity with the synthetic logs, the
time split, labels, popularity order, negatives, and the reranker's feature code on top."""

from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch

from creditflow.chain.config import FEATURE_NAMES
from creditflow.chain.reranker.training import (
    evaluate_rankings,
    logged_sessions,
    session_features,
)
from creditflow.chain.world.catalogue import SESSION_COLUMNS, generate_catalogue, generate_sessions
from creditflow.chain.world.movielens import ITEM_TABLE_COLUMNS, movielens_sessions
from creditflow.ingest import load_movielens

L, HISTORY, NEGATIVES = 12, 8, 5
N_RATED = L - NEGATIVES


@pytest.fixture(scope="module")
def movielens(raw_data):
    # The first 12k ratings (file order = by user) hold 80-odd whole users: fast and real.
    return load_movielens(raw_data / "movielens_ml_latest_small", max_rows=12_000)


@pytest.fixture(scope="module")
def built(movielens):
    ratings, items = movielens
    return movielens_sessions(
        ratings, items, n_candidates=L, history_length=HISTORY, n_negatives=NEGATIVES, seed=3
    )


def test_columns_and_dtypes_equal_the_synthetic_sessions(built):
    sessions, item_table = built
    synthetic = generate_sessions(
        generate_catalogue(40, seed=0, image_size=32), n_queries=5, n_sessions=6, list_length=10
    )
    assert list(sessions.columns) == list(SESSION_COLUMNS) == list(synthetic.columns)
    pd.testing.assert_series_equal(sessions.dtypes, synthetic.dtypes)
    for column in ("candidates", "logged_order", "labels", "clicks", "true_quality"):
        kinds = {type(v) for cell in sessions[column] for v in cell}
        assert kinds == {type(v) for cell in synthetic[column] for v in cell}, column
        assert sessions[column].map(type).eq(list).all()
    assert len(sessions) > 50 and sessions["candidates"].map(len).eq(L).all()
    assert tuple(item_table.columns) == ITEM_TABLE_COLUMNS
    assert item_table["item_id"].is_monotonic_increasing and item_table["item_id"].is_unique


def test_sessions_follow_the_time_split(movielens, built):
    """A slow per-user loop over the raw ratings rebuilds every session's rated part."""
    ratings, _ = movielens
    sessions, _ = built
    by_user = {u: frame for u, frame in ratings.groupby("user_id")}
    eligible = sorted(u for u, frame in by_user.items() if len(frame) >= HISTORY + N_RATED)
    assert sessions["query_id"].tolist() == eligible
    assert sessions["session_id"].tolist() == list(range(len(eligible)))
    for row in sessions.itertuples(index=False):
        frame = by_user[row.query_id].sort_values(["timestamp", "item_id"])
        rating_of = dict(zip(frame["item_id"], frame["rating"], strict=True))
        held = frame["item_id"].tolist()[-N_RATED:]
        history = frame["item_id"].tolist()[-(N_RATED + HISTORY) : -N_RATED]
        candidates = row.candidates
        assert sorted(candidates) == sorted(set(candidates))  # no repeats
        assert set(held) <= set(candidates)
        assert not set(history) & set(candidates)  # no leakage of the query context
        for item, label, click, gain in zip(
            candidates, row.labels, row.clicks, row.true_quality, strict=True
        ):
            if item in held:
                assert label == ("C" if rating_of[item] >= 4 else "E")
                assert gain == rating_of[item] / 5
            else:
                assert item not in rating_of and label == "U" and gain == 0.0
            assert click == int(label == "C")


def test_logged_order_ranks_by_training_popularity(movielens, built):
    ratings, _ = movielens
    sessions, item_table = built
    counts = training_counts(ratings, sessions)
    expected = [counts.get(i, 0) for i in item_table["item_id"]]
    assert item_table["n_ratings"].tolist() == expected
    np.testing.assert_array_equal(item_table["popularity"], 1.0 + np.array(expected))
    for candidates, order in zip(sessions["candidates"], sessions["logged_order"], strict=True):
        assert sorted(order) == list(range(L))
        shown = [counts.get(candidates[j], 0) for j in order]
        assert shown == sorted(shown, reverse=True)


def test_hand_computed_session():
    items = pd.DataFrame(
        {
            "item_id": [1, 2, 3, 4, 5, 6],
            "title": ["A (1990)", "B (1991)", "C (1992)", "D", "E (1994)", "F (1995)"],
            "genres": [["Drama", "War"], ["Comedy"], ["Drama"], [], ["Comedy", "Drama"], ["War"]],
            "year": pd.array([1990, 1991, 1992, None, 1994, 1995], dtype="Int64"),
        }
    )
    ratings = pd.DataFrame(
        {
            "user_id": [10, 10, 10, 10, 20, 20, 20],
            "item_id": [5, 1, 3, 2, 1, 2, 3],
            "rating": [2.5, 5.0, 4.0, 3.0, 4.0, 4.5, 1.0],
            "timestamp": [9, 1, 5, 2, 1, 2, 5],
        }
    )
    sessions, table = movielens_sessions(
        ratings, items, n_candidates=3, history_length=2, n_negatives=1, seed=0
    )
    # User 20 has 3 < history 2 + rated 2 ratings: skipped. User 10 by time: 1, 2 | 3, 5.
    assert sessions["query_id"].tolist() == [10]
    row = sessions.iloc[0]
    # History genres Drama, War (item 1), Comedy (item 2): one each, ties alphabetical.
    assert row["query_text"] == "Comedy Drama War"
    assert row["query_frequency_band"] == "head"  # the only user carries all traffic
    gains = zip(row["labels"], row["true_quality"], strict=True)
    labelled = dict(zip(row["candidates"], gains, strict=True))
    negative = next(i for i, (label, _) in labelled.items() if label == "U")
    assert negative in (4, 6)  # the movies user 10 never rated
    assert labelled[3] == ("C", 0.8) and labelled[5] == ("E", 0.5)  # 4.0 / 5, 2.5 / 5
    # Training counts leave out (10, 3) and (10, 5): item 3 has user 20's rating, 5 and the
    # negative none, so item 3 is logged first.
    assert row["candidates"][row["logged_order"][0]] == 3
    table = table.set_index("item_id")
    assert table.loc[3, "n_ratings"] == 1 and table.loc[5, "n_ratings"] == 0
    assert table.loc[[3, 5], "category"].tolist() == ["Drama", "Comedy"]
    assert table.loc[negative, "category"] == ("unknown" if negative == 4 else "War")


def test_deterministic_per_seed_and_per_user(movielens, built):
    ratings, items = movielens
    sessions, table = built
    again, again_table = movielens_sessions(
        ratings, items, n_candidates=L, history_length=HISTORY, n_negatives=NEGATIVES, seed=3
    )
    pd.testing.assert_frame_equal(sessions, again)
    pd.testing.assert_frame_equal(table, again_table)
    other, _ = movielens_sessions(
        ratings, items, n_candidates=L, history_length=HISTORY, n_negatives=NEGATIVES, seed=4
    )
    assert not sessions["candidates"].equals(other["candidates"])
    # Each user draws from its own stream: keeping fewer users changes no uniform draw (the
    # popularity counts, and so the logged order, do change: fewer ratings are held back).
    few, _ = movielens_sessions(ratings, items, L, HISTORY, NEGATIVES, max_users=5, seed=3)
    assert len(few) == 5
    for column in ("query_id", "query_text", "candidates", "labels", "true_quality"):
        assert few[column].tolist() == sessions[column].head(5).tolist()


def test_genre_arrays_from_parquet_give_the_same_sessions(movielens, built):
    ratings, items = movielens
    as_arrays = items.assign(genres=items["genres"].map(lambda g: np.array(g, dtype=object)))
    sessions, table = movielens_sessions(
        ratings, as_arrays, n_candidates=L, history_length=HISTORY, n_negatives=NEGATIVES, seed=3
    )
    pd.testing.assert_frame_equal(sessions, built[0])
    assert table["category"].tolist() == built[1]["category"].tolist()


def training_counts(ratings, sessions):
    """Ratings per item outside the sessions' held-back (rated) candidates, by a plain loop."""
    held = {
        (user, item)
        for user, candidates, labels in zip(
            sessions["query_id"], sessions["candidates"], sessions["labels"], strict=True
        )
        for item, label in zip(candidates, labels, strict=True)
        if label != "U"
    }
    return Counter(
        item
        for user, item in zip(ratings["user_id"], ratings["item_id"], strict=True)
        if (user, item) not in held
    )


def test_popularity_band_negatives_share_the_rated_candidates_bands(movielens):
    ratings, items = movielens
    kwargs = dict(n_candidates=L, history_length=HISTORY, n_negatives=NEGATIVES, seed=1)
    banded, table = movielens_sessions(
        ratings, items, negative_sampling="popularity_band", **kwargs
    )
    uniform, uniform_table = movielens_sessions(ratings, items, **kwargs)
    counts = training_counts(ratings, banded)

    def band(item):
        return int(np.floor(np.log2(1 + counts.get(item, 0))))

    catalogue_bands = Counter(band(i) for i in items["item_id"])
    checked = 0
    for row in banded.itertuples(index=False):
        frame = ratings[ratings["user_id"] == row.query_id].sort_values(["timestamp", "item_id"])
        # Negative k copies the band of rated candidate k mod 7 (time order): here the first 5.
        anchors = Counter(band(i) for i in frame["item_id"].tolist()[-N_RATED:][:NEGATIVES])
        unrated = catalogue_bands - Counter(band(i) for i in frame["item_id"])
        drawn = Counter(
            band(i) for i, label in zip(row.candidates, row.labels, strict=True) if label == "U"
        )
        if all(unrated[b] >= n for b, n in anchors.items()):  # no band can have run out
            assert drawn == anchors
            checked += 1
    assert checked > len(banded) // 2

    def mean_negative_popularity(sessions, item_table):
        pop = item_table.set_index("item_id")["n_ratings"]
        return np.mean(
            [
                pop[i]
                for cs, ls in zip(sessions["candidates"], sessions["labels"], strict=True)
                for i, label in zip(cs, ls, strict=True)
                if label == "U"
            ]
        )

    # Uniform negatives are mostly never-rated movies; banded ones look like the rated ones.
    assert mean_negative_popularity(banded, table) > 3 * mean_negative_popularity(
        uniform, uniform_table
    )


def test_reranker_features_accept_the_sessions(built):
    sessions, item_table = built
    logs = logged_sessions(sessions)
    N = len(sessions)
    assert logs.mask.shape == (N, L) and bool(logs.mask.all())
    clicks = torch.tensor(sessions["clicks"].tolist(), dtype=torch.float32)
    torch.testing.assert_close(logs.clicks, clicks)
    features, mask = session_features(sessions, item_table)
    assert features.shape == (N, L, len(FEATURE_NAMES)) and torch.isfinite(features).all()
    column = {name: i for i, name in enumerate(FEATURE_NAMES)}
    category = item_table.set_index("item_id")["category"]
    for i, row in enumerate(sessions.itertuples(index=False)):
        # The query's category is its first (most frequent) genre.
        top = row.query_text.split()[0]
        expected = [float(category[c] == top) for c in row.candidates]
        assert features[i, :, column["category_match"]].tolist() == expected
        labels = [["C", "E", "U"][j] for j in features[i, :, -3:].argmax(dim=1).tolist()]
        assert labels == row.labels
    per_session = evaluate_rankings(logs.logged_order, sessions, None, k=5)
    assert per_session["true_ndcg"].between(0, 1).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_negatives": 12}, "n_negatives .* must be below n_candidates"),
        ({"negative_sampling": "popular"}, "valid: \\['uniform', 'popularity_band'\\]"),
        ({"history_length": 0}, "history_length must be an int >= 1"),
        ({"max_users": 0}, "max_users must be an int >= 1"),
    ],
)
def test_invalid_arguments_are_explained(movielens, kwargs, message):
    ratings, items = movielens
    with pytest.raises(ValueError, match=message):
        movielens_sessions(ratings, items, **{"n_candidates": L, **kwargs})


def test_rated_item_outside_the_catalogue_is_rejected(movielens):
    ratings, items = movielens
    with pytest.raises(ValueError, match="missing from items"):
        movielens_sessions(ratings, items[items["item_id"] != ratings["item_id"].iloc[0]])
