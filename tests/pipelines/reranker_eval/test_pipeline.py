"""Kedro slice test of the ``reranker_eval`` pipeline, with loop references for the metrics."""

import math

import numpy as np
import pytest
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure
from scipy.stats import kendalltau

from creditflow.pipelines.reranker_eval import create_pipeline
from creditflow.pipelines.reranker_eval.nodes import RERANKER_INPUTS
from creditflow.training.reranker_data import LOGGED
from tests.pipelines._experience_chain import slice_catalog, smallest_params

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]
RANKERS = [LOGGED, *RERANKER_INPUTS]


def _ndcg(gains_in_order: list[float], k: int) -> float:
    """nDCG@k written out: DCG = sum_j g_j / log2(j + 1) over the first k (j from 1)."""
    dcg = sum(g / math.log2(j + 2) for j, g in enumerate(gains_in_order[:k]))
    ideal = sum(
        g / math.log2(j + 2) for j, g in enumerate(sorted(gains_in_order, reverse=True)[:k])
    )
    return dcg / ideal if ideal > 0 else 0.0


def test_evaluation_table_covers_every_ranker_and_band():
    params = smallest_params()
    pipeline = create_pipeline()
    catalog = slice_catalog(pipeline, params)
    SequentialRunner().run(pipeline, catalog)
    k = params["reranker_eval"]["k"]

    sessions = catalog.load("query_logs_heldout")
    per_session = catalog.load("reranker_evaluation_sessions")
    assert per_session.groupby("ranker", sort=False).size().to_dict() == dict.fromkeys(
        RANKERS, len(sessions)
    )
    # The logged order, scored by hand: click and true-quality nDCG@k, unexposed top-k share.
    logged = per_session[per_session["ranker"] == LOGGED].set_index("session_id")
    for session in sessions.itertuples(index=False):
        order = list(session.logged_order)
        row = logged.loc[session.session_id]
        assert row["click_ndcg"] == pytest.approx(_ndcg([session.clicks[i] for i in order], k))
        truth = [session.true_quality[i] for i in order]
        assert row["true_ndcg"] == pytest.approx(_ndcg(truth, k), rel=1e-5)
        top = order[: min(k, len(order))]
        share = sum(session.labels[i] == "U" for i in top) / len(top)
        assert row["unexposed_top_k_share"] == pytest.approx(share)

    table = catalog.load("reranker_evaluation")
    bands = [b for b in ("head", "torso", "tail") if b in set(sessions["query_frequency_band"])]
    assert table["ranker"].tolist() == [r for r in RANKERS for _ in range(len(bands) + 1)]
    assert table["band"].tolist() == (bands + ["all"]) * len(RANKERS)
    assert (table.loc[table["band"] == "all", "sessions"] == len(sessions)).all()
    metrics = ["true_ndcg", "click_ndcg", "exp_ndcg", "unexposed_top_k_share"]
    assert table[metrics].apply(lambda c: c.between(0, 1)).all().all()
    assert isinstance(catalog.load("reranker_evaluation_plot"), Figure)

    summary = catalog.load("expmodel_evaluation")
    items = catalog.load("catalogue_items")
    scores = catalog.load("item_experience_scores")
    expected = kendalltau(scores["s_exp"], items["true_quality"]).statistic
    assert summary.loc[0, "kendall_tau_s_exp"] == pytest.approx(expected)
    heldout = catalog.load("expmodel_pft_metrics")["pft/heldout_accuracy"].iloc[-1]
    assert summary.loc[0, "pft_heldout_pair_accuracy"] == pytest.approx(heldout)
    assert summary.loc[0, "items"] == len(items)
    assert np.isfinite(summary.loc[0, "kendall_tau_annotation"])
