"""Kedro slice test of the ``reranker_eval`` pipeline, with loop references for the metrics."""

import math

import numpy as np
import pandas as pd
import pytest
from kedro.runner import SequentialRunner
from matplotlib.figure import Figure
from scipy.stats import kendalltau

from creditflow.chain.ab_test.controls import (
    METRICS,
    R_OLD_ONLY,
    SHUFFLED_EXP,
    variant_contrasts,
    variant_ranker,
)
from creditflow.chain.reranker.data import LOGGED, serve_pages
from creditflow.chain.world.catalogue import ClickModel, candidate_response
from creditflow.pipelines.reranker_eval import create_pipeline
from creditflow.pipelines.reranker_eval.nodes import SAMPLED_PAGES
from tests.pipelines._experience_chain import slice_catalog, smallest_params

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning"),
]
# Each control right after the ranker it controls for.
VARIANTS = list(smallest_params()["reranker_grpo"]["r_old_variants"])
RANKERS = [
    LOGGED,
    "click_pretrained",
    "click_exp_pretrained",
    "yaug_no_exp_pretrained",
    "yaug_pretrained",
    SHUFFLED_EXP,
    "yaug_page_grpo",
    R_OLD_ONLY,
    *(variant_ranker(name) for name in VARIANTS),
    *SAMPLED_PAGES,
]
ORACLES = ["oracle_clicks", "oracle_quality"]


def _ndcg(gains_in_order: list[float], k: int) -> float:
    """nDCG@k written out: DCG = sum_j g_j / log2(j + 1) over the first k (j from 1)."""
    dcg = sum(g / math.log2(j + 2) for j, g in enumerate(gains_in_order[:k]))
    ideal = sum(
        g / math.log2(j + 2) for j, g in enumerate(sorted(gains_in_order, reverse=True)[:k])
    )
    return dcg / ideal if ideal > 0 else 0.0


@pytest.fixture(scope="module")
def evaluated():
    params = smallest_params()
    pipeline = create_pipeline()
    catalog = slice_catalog(pipeline, params)
    SequentialRunner().run(pipeline, catalog)
    return params, catalog


def test_evaluation_table_covers_every_ranker_and_band(evaluated):
    params, catalog = evaluated
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

    summary = catalog.load("expmodel_evaluation").set_index("target")
    items = catalog.load("catalogue_items").set_index("item_id")
    scores = catalog.load("item_experience_scores")
    # Per-(query, item) scores (the default score_mode) enter the per-item rows as each item's
    # mean over its queries.
    per_item = scores.groupby("item_id")["s_exp"].mean()
    expected = kendalltau(per_item, items.loc[per_item.index, "true_quality"]).statistic
    assert summary.loc["quality", "kendall_tau_s_exp"] == pytest.approx(expected)
    heldout = catalog.load("expmodel_pft_metrics")["pft/heldout_accuracy"].iloc[-1]
    assert summary.loc["quality", "pft_heldout_pair_accuracy"] == pytest.approx(heldout)
    assert summary.loc["quality", "items"] == len(per_item)
    assert np.isfinite(summary.loc["quality", "kendall_tau_annotation"])
    # The query row: within each query, s_{q,v} against the logs' hidden per-candidate quality.
    logs = pd.concat([catalog.load("query_logs_train"), sessions])
    truth = {
        (q, c): t
        for q, cs, ts in zip(
            logs["query_text"], logs["candidates"], logs["true_quality"], strict=True
        )
        for c, t in zip(cs, ts, strict=True)
    }
    s_qv = scores.set_index(["query_text", "item_id"])["s_exp"]
    taus = []
    for query in sorted({q for q, _ in truth}):
        keys = [key for key in truth if key[0] == query]
        if len(keys) >= 2:
            tau = kendalltau([s_qv[k] for k in keys], [truth[k] for k in keys]).statistic
            taus += [] if np.isnan(tau) else [tau]
    assert summary.loc["query_quality", "kendall_tau_s_exp"] == pytest.approx(np.mean(taus))
    assert summary.loc["query_quality", "items"] == len(truth)
    assert 0 <= summary.loc["query_quality", "pair_accuracy_in_sample"] <= 1


def test_served_pages_are_permutations_and_sampled_ones_have_their_draws(evaluated):
    params, catalog = evaluated
    sessions = catalog.load("query_logs_heldout")
    pages = catalog.load("reranker_heldout_pages")
    assert pages["ranker"].drop_duplicates().tolist() == RANKERS
    L = len(sessions["candidates"].iloc[0])
    assert pages["ranking"].map(lambda r: sorted(r) == list(range(L))).all()
    draws = pages.groupby("ranker")["draw"].nunique()
    samples = params["reranker_eval"]["ab"]["sampled_pages"]["samples"]
    assert (draws[list(SAMPLED_PAGES)] == samples).all()
    assert (draws.drop(list(SAMPLED_PAGES)) == 1).all()
    logged = pages[pages["ranker"] == LOGGED].set_index("session_id")["ranking"]
    for session in sessions.itertuples(index=False):
        assert list(logged.loc[session.session_id]) == list(session.logged_order)


def test_ab_table_applies_the_world_click_model_to_every_page(evaluated):
    params, catalog = evaluated
    sessions = catalog.load("query_logs_heldout")
    items = catalog.load("catalogue_items")
    ab = params["reranker_eval"]["ab"]
    model = ClickModel.from_params(params["annotation"]["click_model"])
    # The logged page's expected clicks, written out: sum over positions of
    # P(depth > p) * (p + 1)^-bias * P(click | examined) of the candidate shown there.
    click, _ = candidate_response(sessions, items, model)
    L = click.shape[1]
    lo, hi = model.exposure_depth
    weights = [
        sum(d > p for d in range(lo, hi + 1)) / (hi - lo + 1) * (p + 1) ** -model.position_bias
        for p in range(L)
    ]
    per_session = catalog.load("reranker_ab_sessions")
    logged = per_session[per_session["ranker"] == LOGGED].set_index("session_id")
    for row, session in enumerate(sessions.itertuples(index=False)):
        expected = sum(weights[p] * click[row, c] for p, c in enumerate(session.logged_order))
        assert logged.loc[session.session_id, "clicks_per_page"] == pytest.approx(expected)

    table = catalog.load("reranker_ab")
    table = table[table["kind"] == "ranker"]
    bands = [b for b in ("head", "torso", "tail") if b in set(sessions["query_frequency_band"])]
    assert table["ranker"].tolist() == [r for r in RANKERS + ORACLES for _ in range(len(bands) + 1)]
    assert table["band"].tolist() == (bands + ["all"]) * len(RANKERS + ORACLES)
    ndcg = f"true_ndcg_at_{ab['k']}"
    for column in ("ctr", "long_view_rate", ndcg, "ctr_change_vs_logged"):
        assert {column, f"{column}_se"} <= set(table.columns), column
    assert {"quality_weighted_clicks", f"ips_click_ndcg_at_{ab['k']}"} <= set(table.columns)
    overall = table[table["band"] == "all"].set_index("ranker")
    assert overall.loc[LOGGED, "ctr_change_vs_logged"] == 0
    assert (overall["ctr"] <= overall.loc["oracle_clicks", "ctr"] + 1e-9).all()
    assert overall.loc["oracle_quality", ndcg] == pytest.approx(1.0)
    # One sentence per ranker: the reward it learned from and what it could see.
    assert "fitted to the training logs" in overall.loc["yaug_page_grpo", "trained_on"]
    assert "hidden" in overall.loc["oracle_clicks", "trained_on"]
    assert "R_old alone (alpha 1, beta 0" in overall.loc[R_OLD_ONLY, "trained_on"]
    assert "shuffled s_exp" in overall.loc[SHUFFLED_EXP, "trained_on"]
    assert isinstance(catalog.load("reranker_ab_plot"), Figure)
    recovery = catalog.load("logged_click_model_recovery")
    assert recovery["examination_fitted"].iloc[0] == recovery["examination_true"].iloc[0] == 1.0

    sweep = catalog.load("reranker_ab_sweep")
    assert sweep["quality"].drop_duplicates().tolist() == ab["sweep"]["quality_weights"]
    default = sweep[sweep["quality"] == model.quality].drop(columns="quality")
    pd_table = table.set_index(["ranker", "band"])
    for row in default.itertuples(index=False):
        assert row.ctr == pytest.approx(pd_table.loc[(row.ranker, row.band), "ctr"])
    assert isinstance(catalog.load("reranker_ab_sweep_plot"), Figure)


def test_the_controls_are_served_with_their_own_scores(evaluated):
    _, catalog = evaluated
    pages = catalog.load("reranker_heldout_pages")
    ranking = pages[pages["draw"] == 0].set_index(["ranker", "session_id"])["ranking"]
    sessions = catalog.load("query_logs_heldout")
    params = smallest_params()
    # The shuffled-s_exp control's pages are its greedy pages on the shuffled scores, not on
    # the real ones (serve_pages, called here on each score table).
    model = catalog.load("reranker_yaug_shuffled_exp")
    served = {}
    for scores in ("item_experience_scores_shuffled", "item_experience_scores"):
        page = serve_pages(
            sessions,
            catalog.load("catalogue_items"),
            catalog.load(scores),
            {SHUFFLED_EXP: model},
            {SHUFFLED_EXP: "yaug"},
            params["reranker_pretrain"],
        )[SHUFFLED_EXP][0]
        served[scores] = [list(r) for r in page.tolist()]
    chain = [list(ranking.loc[(SHUFFLED_EXP, s)]) for s in sessions["session_id"]]
    assert chain == served["item_experience_scores_shuffled"]
    assert chain != served["item_experience_scores"]


def test_the_ab_table_ends_with_the_controls_contrasts_paired_over_sessions(evaluated):
    params, catalog = evaluated
    k = params["reranker_eval"]["ab"]["k"]
    table = catalog.load("reranker_ab")  # read back from CSV
    n = len(catalog.load("query_logs_heldout"))
    contrasts = table[table["kind"] == "contrast"].set_index("ranker")
    expected = [f"{a} - {b}" for a, b, _ in variant_contrasts(VARIANTS)]
    assert contrasts.index.tolist() == expected and len(VARIANTS) == 3
    assert (contrasts["band"] == "all").all() and (contrasts["sessions"] == n).all()
    assert (table["basis"] == "held-out sessions, one run").all()
    for metric in METRICS:
        for suffix in ("", "_se", "_low", "_high", "_mde"):
            assert np.isfinite(contrasts[metric + suffix].astype(float)).all(), metric + suffix
        assert (contrasts[f"{metric}_low"] <= contrasts[metric]).all()
        assert (contrasts[metric] <= contrasts[f"{metric}_high"]).all()
    # The mean CTR change of a contrast is the difference of its rankers' changes vs logged.
    overall = table[(table["kind"] == "ranker") & (table["band"] == "all")].set_index("ranker")
    for a, b, _ in variant_contrasts(VARIANTS):
        row = contrasts.loc[f"{a} - {b}"]
        for metric, column in (
            ("ctr_change", "ctr_change_vs_logged"),
            ("long_view_change", "long_view_change_vs_logged"),
            ("true_ndcg_diff", f"true_ndcg_at_{k}_diff_vs_logged"),
        ):
            expected = overall.loc[a, column] - overall.loc[b, column]
            assert row[metric] == pytest.approx(expected, abs=1e-9), (a, metric)
    assert "the experience term" in contrasts.iloc[0]["what"]
