"""Thin nodes of the ``reranker_eval`` pipeline; the work happens in creditflow.training/reporting."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from creditflow.chain.ab_test.controls import (
    CONTRAST,
    R_OLD_ONLY,
    SHUFFLED_EXP,
    ab_log_text,
    beside_their_methods,
    variant_contrasts,
    variant_ranker,
    with_contrasts,
    with_variant_names,
)
from creditflow.chain.ab_test.reporting import (
    evaluate_experience_scores,
    plot_metrics_by_band,
    plot_sweep,
    summarise_rankers_by_band,
    trained_on,
)
from creditflow.chain.ab_test.simulated_ab import (
    CHANGE_METRICS,
    CTR,
    ab_plot_columns,
    ab_session_metrics,
    break_even,
    oracle_pages,
    simulated_users,
    summarise_ab,
    sweep_click_model,
)
from creditflow.chain.clicks.logged import (
    attractiveness_recovery,
    click_model_from_table,
    has_truth,
    recovery_table,
)
from creditflow.chain.expmodel.pft import HELDOUT_ACCURACY
from creditflow.chain.reranker.data import (
    RERANKER_INPUTS,
    evaluate_pages,
    named_rerankers,
    pages_frame,
    pages_from_frame,
    serve_pages,
)
from creditflow.chain.reranker.model import PointerReranker
from creditflow.chain.reranker.training import EVALUATION_METRICS
from creditflow.chain.world.catalogue import ClickModel

logger = logging.getLogger(__name__)
CTR_CHANGE = CHANGE_METRICS[CTR]
# Logs of your own without a known quality (chain.world.sources) have no hidden truth for
# simulated users to react to: the A/B and its sweep are left out, said in the log and the plot.
NO_TRUTH = "no true_quality in the catalogue: the simulated A/B is left out"

# Pages sampled at the GRPO temperature (the pages page GRPO trained on): name -> model.
SAMPLED_PAGES = {
    "yaug_pretrained_sampled": "yaug_pretrained",
    "yaug_page_grpo_sampled": "yaug_page_grpo",
}
# The controls (chain.ab_test.controls), each read like the y_aug reranker it controls for.
CONTROL_INPUTS = {R_OLD_ONLY: "yaug", SHUFFLED_EXP: "yaug"}


def serve_heldout_pages(  # noqa: PLR0913 - one input per trained reranker
    query_logs_heldout: pd.DataFrame,
    catalogue_items: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    item_experience_scores_shuffled: pd.DataFrame,
    reranker_click: PointerReranker,
    reranker_click_exp: PointerReranker,
    reranker_yaug_no_exp: PointerReranker,
    reranker_yaug: PointerReranker,
    reranker_page_grpo: PointerReranker,
    reranker_page_grpo_r_old_only: PointerReranker,
    reranker_page_grpo_r_old_variants: dict[str, PointerReranker],
    reranker_yaug_shuffled_exp: PointerReranker,
    params: dict[str, Any],
    pretrain_params: dict[str, Any],
    grpo_params: dict[str, Any],
) -> pd.DataFrame:
    """Every ranker's pages of the held-out sessions: the logged order, each reranker's greedy
    page (each control beside its method, then page GRPO on each R_old variant), and pages of
    the y_aug rerankers sampled at the GRPO temperature. The shuffled-s_exp control reads the
    shuffled scores it was trained on."""
    models = named_rerankers(
        reranker_click, reranker_click_exp, reranker_yaug_no_exp, reranker_yaug, reranker_page_grpo
    ) | with_variant_names(
        {R_OLD_ONLY: reranker_page_grpo_r_old_only},
        _in_order(reranker_page_grpo_r_old_variants, grpo_params),
    )
    sessions = (query_logs_heldout, catalogue_items)
    pages = serve_pages(
        *sessions,
        item_experience_scores,
        models,
        _kinds(models),
        pretrain_params,
        **_sampled_pages(params, grpo_params),
    )
    shuffled = {SHUFFLED_EXP: reranker_yaug_shuffled_exp}
    pages[SHUFFLED_EXP] = serve_pages(  # its LOGGED page is the same one: not taken
        *sessions, item_experience_scores_shuffled, shuffled, CONTROL_INPUTS, pretrain_params
    )[SHUFFLED_EXP]
    return pages_frame(beside_their_methods(pages), query_logs_heldout)


def _in_order(variants: dict[str, PointerReranker], grpo_params: dict[str, Any]) -> dict:
    """The R_old variants in the order the parameters list them (their dataset loads them by
    name), so the tables' rows follow the YAML."""
    order = list(grpo_params.get("r_old_variants", {}))
    return dict(
        sorted(
            variants.items(),
            key=lambda item: order.index(item[0]) if item[0] in order else len(order),
        )
    )


def _kinds(models: dict[str, PointerReranker]) -> dict[str, str]:
    """The reranker setting each model reads: its own for the chain's rerankers, y_aug's for
    the controls and the R_old variants."""
    return RERANKER_INPUTS | dict.fromkeys(set(models) - set(RERANKER_INPUTS), "yaug")


def _sampled_pages(params: dict[str, Any], grpo_params: dict[str, Any]) -> dict[str, Any]:
    """``serve_pages``' keywords of the pages sampled at the GRPO temperature."""
    sampled = params["ab"]["sampled_pages"]
    return {
        "sampled": SAMPLED_PAGES,
        "temperature": grpo_params["grpo"]["temperature"],
        "samples": sampled["samples"],
        "seed": sampled["seed"],
    }


def evaluate_rerankers(
    reranker_heldout_pages: pd.DataFrame,
    query_logs_heldout: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    params: dict[str, Any],
    grpo_params: dict[str, Any],
) -> pd.DataFrame:
    """Per held-out session and ranker: experience nDCG@K against the hidden true quality,
    click nDCG@K against the clicks logged under the old order (counterfactual), nDCG@K against
    y^s (with the page reward's gains) and the share of top-K slots given to never-exposed
    items (sampled pages: their mean)."""
    pages = pages_from_frame(reranker_heldout_pages, query_logs_heldout)
    gain_mode = grpo_params["reward"]["gain_mode"]
    return evaluate_pages(pages, query_logs_heldout, item_experience_scores, params["k"], gain_mode)


def simulate_reranker_ab(
    reranker_heldout_pages: pd.DataFrame,
    query_logs_heldout: pd.DataFrame,
    catalogue_items: pd.DataFrame,
    annotation_params: dict[str, Any],
    params: dict[str, Any],
) -> pd.DataFrame:
    """The simulated online A/B per session: every ranker's pages (and two oracle pages that
    read the hidden truth) shown to the world's click model (``annotation.click_model``);
    empty for logs without a known quality."""
    if not has_truth(query_logs_heldout):
        logger.info(NO_TRUTH)
        return pd.DataFrame()
    ab = params["ab"]
    users = simulated_users(
        query_logs_heldout,
        catalogue_items,
        ClickModel.from_params(annotation_params["click_model"]),
    )
    pages = pages_from_frame(reranker_heldout_pages, query_logs_heldout)
    pages |= oracle_pages(users, query_logs_heldout)
    return ab_session_metrics(
        pages,
        query_logs_heldout,
        users,
        k=ab["k"],
        method=ab["method"],
        draws=ab["draws"],
        seed=ab["seed"],
    )


def summarise_reranker_ab(
    reranker_ab_sessions: pd.DataFrame, params: dict[str, Any], grpo_params: dict[str, Any]
) -> tuple[pd.DataFrame, Figure]:
    """The A/B table (ranker x band, paired changes vs the logged order, and per ranker one
    sentence, ``trained_on``, on the reward it learned from and what it could see), then the
    controls' contrast rows (``chain.ab_test.controls.with_contrasts``: paired over the held-out
    sessions), and its bar plot of the rankers."""
    if reranker_ab_sessions.empty:
        return _note_table(), _note_figure(NO_TRUTH)
    k = params["ab"]["k"]
    table = summarise_ab(reranker_ab_sessions, k=k)
    r_old, alpha = grpo_params["reward"]["r_old"], grpo_params["controls"]["r_old_only"]["alpha"]
    variants = grpo_params.get("r_old_variants", {})
    sources = {variant_ranker(n): v.get("r_old") or r_old for n, v in variants.items()}
    table["trained_on"] = [trained_on(ranker, r_old, alpha, sources) for ranker in table["ranker"]]
    table = with_contrasts(table, reranker_ab_sessions, variant_contrasts(list(variants)), k=k)
    logger.info("simulated online A/B on held-out sessions:\n%s", ab_log_text(table))
    rankers = table[table["kind"] != CONTRAST]
    return table, plot_metrics_by_band(rankers, ab_plot_columns(k))


def sweep_click_quality_weight(
    reranker_heldout_pages: pd.DataFrame,
    query_logs_heldout: pd.DataFrame,
    catalogue_items: pd.DataFrame,
    annotation_params: dict[str, Any],
    params: dict[str, Any],
) -> tuple[pd.DataFrame, Figure]:
    """The A/B of the same pages in worlds whose click model weighs quality differently
    (``reranker_eval.ab.sweep.quality_weights``), and the CTR / long-view change of each ranker
    against that weight; logs where each reranker breaks even on CTR."""
    if not has_truth(query_logs_heldout):
        return _note_table(), _note_figure(NO_TRUTH)
    ab = params["ab"]
    world = ClickModel.from_params(annotation_params["click_model"])
    sweep = sweep_click_model(
        pages_from_frame(reranker_heldout_pages, query_logs_heldout),
        query_logs_heldout,
        catalogue_items,
        world,
        "quality",
        ab["sweep"]["quality_weights"],
        k=ab["k"],
    )
    logger.info("CTR break-even quality weights: %s", break_even(sweep, "quality", CTR_CHANGE))
    return sweep, plot_sweep(sweep, "quality", list(CHANGE_METRICS.values()), mark=world.quality)


def summarise_reranker_evaluation(
    reranker_evaluation_sessions: pd.DataFrame,
) -> tuple[pd.DataFrame, Figure]:
    """The evaluation table (ranker x band: head, torso, tail, all) and its grouped bar plot."""
    table = summarise_rankers_by_band(reranker_evaluation_sessions)
    logger.info("reranker evaluation on held-out sessions:\n%s", table.to_string(index=False))
    return table, plot_metrics_by_band(table, EVALUATION_METRICS)


def evaluate_experience_model(  # noqa: PLR0913 - the scores and every truth they are held to
    catalogue_items: pd.DataFrame,
    item_annotations: pd.DataFrame,
    expmodel_annotations: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    expmodel_item_split: pd.DataFrame,
    expmodel_preference_pairs: pd.DataFrame,
    expmodel_pft_metrics: pd.DataFrame,
    query_logs_train: pd.DataFrame,
    query_logs_heldout: pd.DataFrame,
) -> pd.DataFrame:
    """Kendall's tau between s_exp and the hidden true quality and each of its dimensions, on
    the ExpModel's training items and on the unseen ones, beside the annotator's (the teacher's
    ceiling), and within each query against the hidden per-(query, candidate) quality of the
    logs (row ``query_quality``, the order y_aug and page GRPO use); the pair accuracy on
    preference pairs of train / unseen items, and PFT's own held-out pair accuracy
    (``reporting.evaluate_experience_scores``). Without a known quality the tau columns are
    NaN."""
    if "true_quality" not in catalogue_items.columns:
        logger.info("no true_quality in the catalogue: the Kendall tau columns are left out")
    table = evaluate_experience_scores(
        catalogue_items,
        item_annotations,
        item_experience_scores,
        expmodel_item_split,
        expmodel_preference_pairs,
        sessions=pd.concat([query_logs_train, query_logs_heldout], ignore_index=True),
        query_annotations=expmodel_annotations,
    )
    heldout = expmodel_pft_metrics[HELDOUT_ACCURACY].dropna()
    table["pft_heldout_pair_accuracy"] = float(heldout.iloc[-1]) if len(heldout) else float("nan")
    logger.info("experience model:\n%s", table.to_string(index=False))
    return table


def evaluate_click_model_recovery(
    logged_click_model: pd.DataFrame,
    query_logs_heldout: pd.DataFrame,
    catalogue_items: pd.DataFrame,
    annotation_params: dict[str, Any],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What the click model learned from the logs beside the simulator
    (``annotation.click_model``), the one place the two meet, after the fit: per position its
    position bias, and on the held-out sessions' candidates its attractiveness and long-view
    rate (logs without a known quality: the second is a note)."""
    world = ClickModel.from_params(annotation_params["click_model"])
    fitted = click_model_from_table(logged_click_model)
    table = recovery_table(fitted, world)
    logger.info("click model recovery:\n%s", table.round(3).to_string(index=False))
    if not has_truth(query_logs_heldout):
        return table, _note_table()
    items = attractiveness_recovery(fitted, query_logs_heldout, catalogue_items, world)
    logger.info("click model recovery per candidate:\n%s", items.round(3).to_string(index=False))
    return table, items


def _note_table() -> pd.DataFrame:
    """The A/B tables without a known quality: one ``note`` saying why (an empty CSV would not
    even read back)."""
    return pd.DataFrame({"note": [NO_TRUTH]})


def _note_figure(text: str) -> Figure:
    figure = Figure(figsize=(6, 1.5))
    figure.text(0.5, 0.5, text, ha="center", va="center")
    return figure
