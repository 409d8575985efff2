"""The MovieLens text-only ExpModel's inputs: the training part of the ratings and tags, the
item text and the rating teacher, which must never read a held-back rating."""

import numpy as np
import pandas as pd
import pytest

from creditflow.chain.annotation.ratings import RATING_ANNOTATION_COLUMNS, rating_annotations
from creditflow.chain.world.movielens import (
    held_back_pairs,
    movielens_item_texts,
    movielens_sessions,
    without_held_back,
)
from creditflow.ingest import load_movielens, load_movielens_tags
from creditflow.pipelines.movielens_eval.nodes import (
    annotate_movielens_items,
    build_movielens_item_texts,
)

PARAMS = {"expmodel": {"item_text": {"max_tags": 3}, "teacher": {"min_ratings": 3}}}


@pytest.fixture(scope="module")
def movielens(raw_data):
    folder = raw_data / "movielens_ml_latest_small"
    ratings, items = load_movielens(folder, max_rows=12_000)
    return ratings, items, load_movielens_tags(folder, items)


@pytest.fixture(scope="module")
def built(movielens):
    ratings, items, _ = movielens
    return movielens_sessions(ratings, items, n_candidates=12, history_length=8, n_negatives=5)


@pytest.fixture(scope="module")
def sessions(built):
    return built[0]


def _held_back_rows(ratings: pd.DataFrame, sessions: pd.DataFrame) -> np.ndarray:
    held = held_back_pairs(sessions)
    keys = pd.MultiIndex.from_frame(ratings[["user_id", "item_id"]])
    return keys.isin(pd.MultiIndex.from_frame(held))


def test_held_back_pairs_are_each_sessions_user_and_its_rated_candidates(sessions):
    held = held_back_pairs(sessions)
    assert len(held) == 7 * len(sessions)  # 12 candidates - 5 unrated negatives per user
    first = sessions.iloc[0]
    rated = [
        c for c, label in zip(first["candidates"], first["labels"], strict=True) if label != "U"
    ]
    assert held[held["user_id"] == first["query_id"]]["item_id"].tolist() == rated


def test_training_part_counts_are_the_item_tables_popularity(movielens, built):
    """The teacher's ratings are the ones the session builder counts as the training part."""
    ratings, _, _ = movielens
    sessions, item_table = built
    counts = without_held_back(ratings, sessions)["item_id"].value_counts()
    expected = counts.reindex(item_table["item_id"], fill_value=0).to_numpy()
    np.testing.assert_array_equal(item_table["n_ratings"].to_numpy(), expected)
    assert len(without_held_back(ratings, sessions)) == len(ratings) - 7 * len(sessions)


def test_the_teacher_never_reads_a_held_back_rating(movielens, sessions):
    """Held-back ratings changed to anything, or dropped, leave the annotations as they are;
    the same change reaching the teacher would have moved them (the test has power)."""
    ratings, items, tags = movielens
    texts = build_movielens_item_texts(items, tags, sessions, PARAMS)
    baseline = annotate_movielens_items(texts, ratings, sessions, PARAMS)
    held = _held_back_rows(ratings, sessions)
    assert held.sum() == 7 * len(sessions)
    flipped = ratings.copy()
    flipped.loc[held, "rating"] = 5.5 - flipped.loc[held, "rating"]  # 0.5 <-> 5.0, 4 <-> 1.5
    for changed in (flipped, ratings[~held]):
        pd.testing.assert_frame_equal(
            annotate_movielens_items(texts, changed, sessions, PARAMS), baseline
        )
    leaked = rating_annotations(texts, flipped, min_ratings=3)
    assert not leaked.set_index("item_id")["overall"].equals(
        baseline.set_index("item_id")["overall"]
    )


def test_a_tag_on_a_held_back_movie_by_its_user_is_dropped():
    items = pd.DataFrame(
        {
            "item_id": [1, 2],
            "title": ["A (2001)", "B"],
            "genres": [["Drama"], []],
            "year": [2001, None],
        }
    )
    sessions = pd.DataFrame({"query_id": [7], "candidates": [[1, 2]], "labels": [["C", "U"]]})
    tags = pd.DataFrame(
        {
            "user_id": [7, 8, 9, 8, 7],
            "item_id": [1, 1, 1, 2, 2],
            "tag": ["spoiler", "Slow", "slow ", "fun", "twist"],
            "timestamp": [0] * 5,
        }
    )
    texts = movielens_item_texts(items, without_held_back(tags, sessions), max_tags=5)
    # User 7 rated movie 1 in a held-back slot: its tag goes; movie 2 is an unrated negative.
    assert texts["tags"].tolist() == [["slow"], ["fun", "twist"]]
    assert texts["year"].isna().tolist() == [False, True]


def test_rating_annotations_by_hand():
    texts = pd.DataFrame(
        {
            "item_id": [10, 11, 12],
            "title": ["A", "B", "C"],
            "year": [2000, 2001, 2002],
            "genres": [["Drama"], ["Comedy", "Crime"], []],
            "tags": [["slow"], [], []],
        }
    )
    ratings = pd.DataFrame(
        {
            "user_id": [1, 2, 3, 1, 2, 3, 1],
            "item_id": [10, 10, 10, 11, 11, 11, 12],
            "rating": [5.0, 4.0, 4.5, 2.0, 3.0, 1.0, 5.0],
        }
    )
    frame = rating_annotations(texts, ratings, min_ratings=3, prior_ratings=2.0)
    assert tuple(frame.columns) == RATING_ANNOTATION_COLUMNS
    # m = 24.5 / 7 = 3.5; item 10: (13.5 + 2 * 3.5) / 5 = 4.1; item 11: (6 + 7) / 5 = 2.6;
    # item 12 has one rating (< 3): no annotation.
    assert frame["item_id"].tolist() == [10, 11]
    assert frame["overall"].tolist() == [4.1, 2.6]
    assert frame["liked_share"].tolist() == [1.0, 0.0]
    assert frame["analysis"][0] == (
        "3 viewers rated it 4.50 stars on average, above the catalogue's 3.50; 100% gave 4 "
        "stars or more. Genres: Drama. Tags: slow. Overall 4.10 / 5."
    )
    assert "Genres: Comedy, Crime. Tags: none." in frame["analysis"][1]
    with pytest.raises(ValueError, match="min_ratings"):
        rating_annotations(texts, ratings, min_ratings=0)
