"""Thin nodes of the ``reranker_eval`` pipeline; the work happens in creditflow.training/reporting."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from creditflow.models.reranker import PointerReranker
from creditflow.pipelines.expmodel_pft.nodes import HELDOUT_ACCURACY
from creditflow.reporting import kendall_tau, plot_metrics_by_band, summarise_rankers_by_band
from creditflow.training.expmodel import ok_annotations
from creditflow.training.reranker_data import rank_and_evaluate
from creditflow.training.reranking import EVALUATION_METRICS

logger = logging.getLogger(__name__)

# Evaluated rankers, in table order: the logged production order (reranker_data.LOGGED), then
# the greedy pages of the rerankers (name -> which reranker_pretrain setting says what the model
# reads).
RERANKER_INPUTS = {"click_pretrained": "click", "yaug_pretrained": "yaug", "yaug_page_grpo": "yaug"}


def evaluate_rerankers(
    query_logs_heldout: pd.DataFrame,
    catalogue_items: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    reranker_click: PointerReranker,
    reranker_yaug: PointerReranker,
    reranker_page_grpo: PointerReranker,
    params: dict[str, Any],
    pretrain_params: dict[str, Any],
) -> pd.DataFrame:
    """Per held-out session and ranker: experience nDCG@K against the hidden true quality,
    click nDCG@K (R_old), nDCG@K against y^s and the share of top-K slots given to never-exposed
    items. Rankers: the logged order and the greedy pages of the three rerankers."""
    models = named_rerankers(reranker_click, reranker_yaug, reranker_page_grpo)
    return rank_and_evaluate(
        query_logs_heldout,
        catalogue_items,
        item_experience_scores,
        models,
        RERANKER_INPUTS,
        pretrain_params,
        k=params["k"],
    )


def named_rerankers(*models: PointerReranker) -> dict[str, PointerReranker]:
    """``models`` (click, y_aug, page-GRPO rerankers) under their ``RERANKER_INPUTS`` names."""
    return dict(zip(RERANKER_INPUTS, models, strict=True))


def summarise_reranker_evaluation(
    reranker_evaluation_sessions: pd.DataFrame,
) -> tuple[pd.DataFrame, Figure]:
    """The evaluation table (ranker x band: head, torso, tail, all) and its grouped bar plot."""
    table = summarise_rankers_by_band(reranker_evaluation_sessions)
    logger.info("reranker evaluation on held-out sessions:\n%s", table.to_string(index=False))
    return table, plot_metrics_by_band(table, EVALUATION_METRICS)


def evaluate_experience_model(
    catalogue_items: pd.DataFrame,
    item_annotations: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    expmodel_pft_metrics: pd.DataFrame,
) -> pd.DataFrame:
    """One row: Kendall's tau between s_exp and the hidden true quality over the catalogue,
    the same for the annotator's overall score (the teacher's ceiling, over its ok items),
    and the PFT pair accuracy on held-out pairs."""
    truth = catalogue_items.set_index("item_id")["true_quality"]
    scores = item_experience_scores.set_index("item_id")["s_exp"]
    annotated = ok_annotations(item_annotations).set_index("item_id")["overall"]
    heldout = expmodel_pft_metrics[HELDOUT_ACCURACY].dropna()
    row = {
        "items": len(scores),
        "kendall_tau_s_exp": kendall_tau(scores, truth.loc[scores.index]),
        "annotated_items": len(annotated),
        "kendall_tau_annotation": kendall_tau(annotated, truth.loc[annotated.index]),
        "pft_heldout_pair_accuracy": float(heldout.iloc[-1]) if len(heldout) else float("nan"),
    }
    logger.info("experience model: %s", row)
    return pd.DataFrame([row])
