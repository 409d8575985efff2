"""Kedro slice test of the ``movielens_eval`` pipeline on the first MovieLens users."""

import pytest
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure

from creditflow.chain.reranker.data import LOGGED
from creditflow.ingest import load_movielens, load_movielens_tags
from creditflow.pipelines.movielens_eval import create_pipeline
from creditflow.pipelines.movielens_eval.nodes import MOVIELENS_RERANKERS, ZERO_SCORES
from tests.pipelines._experience_chain import slice_catalog, smallest_params

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]


@pytest.fixture(scope="module")
def movielens(raw_data):
    folder = raw_data / "movielens_ml_latest_small"
    ratings, items = load_movielens(folder, max_rows=3000)
    return ratings, items, load_movielens_tags(folder, items)


def test_rerankers_rank_movielens_sessions_by_user_band(movielens):
    ratings, items, tags = movielens
    pipeline = create_pipeline()
    catalog = slice_catalog(
        pipeline,
        smallest_params(),
        movielens_ratings=ratings,
        movielens_items=items,
        movielens_tags=tags,
    )
    SequentialRunner().run(pipeline, catalog)

    sessions = catalog.load("movielens_sessions")
    assert 0 < len(sessions) <= 12
    assert all(len(c) == 16 for c in sessions["candidates"])
    # The text-only ExpModel scores every candidate, rated or not, annotated or not.
    scores = catalog.load("movielens_item_scores")
    item_table = catalog.load("movielens_item_table")
    assert set(item_table["item_id"]) <= set(scores["item_id"])
    assert scores["s_exp"].notna().all() and scores["s_exp_raw"].nunique() > 1
    agreement = catalog.load("movielens_expmodel_evaluation")
    assert agreement["split"].tolist() == ["train", "unseen"]
    assert len(catalog.load("movielens_expmodel_pft_metrics")) == 2

    per_session = catalog.load("movielens_evaluation_sessions")
    # yaug and page GRPO read s_exp, so they come twice; click reads none either way.
    zeroed = ["yaug_pretrained", "yaug_page_grpo"]
    rankers = [LOGGED, *MOVIELENS_RERANKERS, *(name + ZERO_SCORES for name in zeroed)]
    assert per_session["ranker"].drop_duplicates().tolist() == rankers
    assert per_session["exp_ndcg"].between(0, 1).all()
    effect = catalog.load("movielens_exp_effect")
    assert effect["ranker"].drop_duplicates().tolist() == zeroed
    assert effect[effect["band"] == "all"]["sessions"].eq(len(sessions)).all()
    assert {"true_ndcg_gain", "true_ndcg_gain_se"} <= set(effect.columns)
    # Eight of the 16 candidates are unrated negatives: the popularity order puts some on top.
    table = catalog.load("movielens_evaluation")
    overall = table[table["band"] == "all"].set_index("ranker")
    assert (overall["sessions"] == len(sessions)).all()
    assert (
        overall[["true_ndcg", "click_ndcg", "unexposed_top_k_share"]]
        .apply(lambda c: c.between(0, 1))
        .all()
        .all()
    )
    assert isinstance(catalog.load("movielens_evaluation_plot"), Figure)
