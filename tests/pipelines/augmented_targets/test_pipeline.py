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
    if score_mode == "query":
        # s_{q,v}: each candidate's score for its session's query.
        by_pair = table.set_index(["query_text", "item_id"])["s_exp"]
        lookup = {q: by_pair.xs(q) for q in set(table["query_text"])}
    else:
        by_item = table.set_index("item_id")["s_exp"]
        lookup = dict.fromkeys(set(sessions["query_text"]), by_item)
    y_aug = catalog.load("reranker_targets_yaug")
    click_first = catalog.load("reranker_targets_click")
    assert y_aug["session_id"].tolist() == sessions["session_id"].tolist()
    assert click_first["session_id"].tolist() == sessions["session_id"].tolist()
    n_clicked_sessions = 0
    for session, aug, first in zip(
        sessions.itertuples(index=False),
        y_aug.itertuples(index=False),
        click_first.itertuples(index=False),
        strict=True,
    ):
        clicks = list(session.clicks)
        s_exp = lookup[session.query_text]
        scores = [float(s_exp[i]) for i in session.candidates]
        assert list(aug.ranking) == _y_aug(clicks, scores)
        assert list(first.ranking) == _click_first(clicks, list(session.logged_order))
        assert list(aug.ranked_items) == [session.candidates[i] for i in aug.ranking]
        n_clicked_sessions += 0 < sum(clicks) < len(clicks)
    assert n_clicked_sessions > 0, "no session mixes clicked and other candidates"
