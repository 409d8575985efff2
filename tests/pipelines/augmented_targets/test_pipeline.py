"""Kedro slice test of the ``augmented_targets`` pipeline, against plain-loop references."""

import numpy as np
import pandas as pd
import pytest
from kedro.runner import SequentialRunner

from creditflow.pipelines.augmented_targets import create_pipeline
from tests.pipelines._experience_chain import chain_catalog, slice_catalog, smallest_params

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]


def _y_aug(clicks: list[int], scores: list[float]) -> list[int]:
    """docs/methods/experience.md, step 4 written out: clicked by s_exp descending, then the rest by s_exp descending,
    the lower index first on ties."""
    by_score = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return [i for i in by_score if clicks[i]] + [i for i in by_score if not clicks[i]]


def _click_first(clicks: list[int], logged_order: list[int]) -> list[int]:
    return [i for i in logged_order if clicks[i]] + [i for i in logged_order if not clicks[i]]


def _per_item_scores(items) -> pd.DataFrame:
    """Item-mode scores (``item_id, s_exp``), seeded, with ties."""
    rng = np.random.default_rng(0)
    return pd.DataFrame({"item_id": items["item_id"], "s_exp": rng.integers(0, 4, len(items))})


@pytest.mark.parametrize("score_mode", ["query", "item"])
def test_targets_match_the_loop_references(score_mode):
    pipeline = create_pipeline()
    replace = {}
    if score_mode == "item":
        items = chain_catalog().load("catalogue_items")
        replace["item_experience_scores"] = _per_item_scores(items).astype({"s_exp": float})
    catalog = slice_catalog(pipeline, smallest_params(), **replace)
    SequentialRunner().run(pipeline, catalog)
    sessions = catalog.load("query_logs_train")
    table = catalog.load("item_experience_scores")
    shuffled = catalog.load("item_experience_scores_shuffled")
    lookup, shuffled_lookup = _lookup(table, sessions), _lookup(shuffled, sessions)
    # The control's scores: the same values per query (all items in item mode), moved.
    keys = ["query_text"] if score_mode == "query" else []
    assert shuffled.drop(columns="s_exp").equals(table.drop(columns="s_exp"))
    for _, (real, moved) in _groups(table, shuffled, keys):
        assert sorted(moved) == sorted(real)
    assert not shuffled["s_exp"].equals(table["s_exp"])
    y_aug = catalog.load("reranker_targets_yaug")
    y_aug_shuffled = catalog.load("reranker_targets_yaug_shuffled_exp")
    click_first = catalog.load("reranker_targets_click")
    assert y_aug["session_id"].tolist() == sessions["session_id"].tolist()
    assert click_first["session_id"].tolist() == sessions["session_id"].tolist()
    n_clicked_sessions = 0
    n_moved = 0
    for session, aug, first, aug_shuffled in zip(
        sessions.itertuples(index=False),
        y_aug.itertuples(index=False),
        click_first.itertuples(index=False),
        y_aug_shuffled.itertuples(index=False),
        strict=True,
    ):
        clicks = list(session.clicks)
        s_exp = lookup[session.query_text]
        scores = [float(s_exp[i]) for i in session.candidates]
        assert list(aug.ranking) == _y_aug(clicks, scores)
        moved = [float(shuffled_lookup[session.query_text][i]) for i in session.candidates]
        assert list(aug_shuffled.ranking) == _y_aug(clicks, moved)
        n_moved += list(aug_shuffled.ranking) != list(aug.ranking)
        assert list(first.ranking) == _click_first(clicks, list(session.logged_order))
        assert list(aug.ranked_items) == [session.candidates[i] for i in aug.ranking]
        n_clicked_sessions += 0 < sum(clicks) < len(clicks)
    assert n_clicked_sessions > 0, "no session mixes clicked and other candidates"
    assert n_moved > 0, "the shuffled s_exp orders every session's y_aug as the real one"


def _lookup(table: pd.DataFrame, sessions: pd.DataFrame) -> dict:
    """Per query, s_exp by item_id: s_{q,v} for per-query scores, the item's for per-item."""
    if "query_text" in table.columns:
        by_pair = table.set_index(["query_text", "item_id"])["s_exp"]
        return {q: by_pair.xs(q) for q in set(table["query_text"])}
    return dict.fromkeys(set(sessions["query_text"]), table.set_index("item_id")["s_exp"])


def _groups(table: pd.DataFrame, shuffled: pd.DataFrame, keys: list[str]):
    """(key, (real s_exp, shuffled s_exp)) per query (one group without ``keys``)."""
    if not keys:
        return [("", (table["s_exp"].tolist(), shuffled["s_exp"].tolist()))]
    return [
        (key, (part["s_exp"].tolist(), shuffled.loc[part.index, "s_exp"].tolist()))
        for key, part in table.groupby(keys)
    ]
