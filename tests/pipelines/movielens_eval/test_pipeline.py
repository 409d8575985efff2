"""Kedro slice test of the ``movielens_eval`` pipeline on the first MovieLens users."""

import pytest
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure

from creditflow.ingest import load_movielens
from creditflow.pipelines.movielens_eval import create_pipeline
from creditflow.pipelines.movielens_eval.nodes import MOVIELENS_RERANKERS
from creditflow.training.reranker_data import LOGGED
from tests.pipelines._experience_chain import slice_catalog, smallest_params

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]


@pytest.fixture(scope="module")
def movielens(shared_data):
    return load_movielens(shared_data / "movielens_ml_latest_small", max_rows=3000)


def test_rerankers_rank_movielens_sessions_by_user_band(movielens):
    ratings, items = movielens
    pipeline = create_pipeline()
    catalog = slice_catalog(
        pipeline, smallest_params(), movielens_ratings=ratings, movielens_items=items
    )
    SequentialRunner().run(pipeline, catalog)

    sessions = catalog.load("movielens_sessions")
    assert 0 < len(sessions) <= 12
    assert all(len(c) == 16 for c in sessions["candidates"])
    per_session = catalog.load("movielens_evaluation_sessions")
    rankers = [LOGGED, *MOVIELENS_RERANKERS]
    assert per_session["ranker"].drop_duplicates().tolist() == rankers
    assert "exp_ndcg" not in per_session.columns  # no covers, so no experience scores
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
