"""Thin nodes of the ``reranker_grpo`` pipeline; the work happens in creditflow.training."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from creditflow.chain.clicks.logged import (
    click_model_from_table,
    click_model_table,
    fit_click_model,
    fit_logged_click_model,
    has_truth,
)
from creditflow.chain.config import page_grpo_config
from creditflow.chain.reranker.data import inputs_for, session_exp_scores
from creditflow.chain.reranker.model import PointerReranker
from creditflow.chain.reranker.page_grpo import run_page_grpo
from creditflow.chain.reranker.page_reward import (
    check_user_budget,
    needs_truth,
    page_reward_of,
    variant_params,
)
from creditflow.chain.world.catalogue import ClickModel
from creditflow.reporting.tables import metrics_frame, plot_reward_curves
from creditflow.training import CheckpointStore

logger = logging.getLogger(__name__)

REWARD_COLUMNS = ("reward/page", "reward/r_old", "reward/exp_ndcg", "actor/kl", "actor/entropy")


def fit_click_model_on_logs(
    query_logs_train: pd.DataFrame, catalogue_items: pd.DataFrame, params: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The click model of page GRPO's default R_old, fitted to the training logs' impressions,
    clicks and long views (``reranker_grpo.validation`` / ``click_model``), as a table, and
    every candidate click model's fit on the fit and validation sessions."""
    model, diagnostics = fit_logged_click_model(query_logs_train, catalogue_items, params)
    shown = [c for c in diagnostics.columns if not c.startswith("perplexity_at_")]
    logger.info(
        "click models fitted to the logs (per position: logged_click_model_fit.csv):\n%s",
        diagnostics[shown].round(4).to_string(index=False),
    )
    return click_model_table(model), diagnostics


def train_reranker_page_grpo(  # noqa: PLR0913 - the model, its data, the worlds and three groups
    reranker_yaug: PointerReranker,
    query_logs_train: pd.DataFrame,
    catalogue_items: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    logged_click_model: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
    pretrain_params: dict[str, Any],
    annotation_params: dict[str, Any],
) -> tuple[PointerReranker, pd.DataFrame, pd.DataFrame]:
    """docs/methods/experience.md, step 5: GRPO from the y_aug reranker with the page reward
    ``alpha * R_old + beta * nDCG@K(y, y^s)`` (R_old the business objective of the sampled page:
    by default its clicks + long views under the click model fitted to the logs; the
    simulator's users, ``annotation.click_model``, only when ``r_old`` names them; y^s the
    candidates by s_exp) and a KL term to the pre-trained reranker."""
    features, mask = inputs_for(
        query_logs_train, catalogue_items, item_experience_scores, pretrain_params, "yaug"
    )  # (N, L, F), (N, L)
    config = page_grpo_config(params["grpo"], n_candidates=mask.shape[1])
    users = check_user_budget(params["reward"], config)
    reward = page_reward_of(
        params["reward"],
        query_logs_train,
        catalogue_items,
        session_exp_scores(query_logs_train, item_experience_scores),
        ClickModel.from_params(annotation_params["click_model"]),
        click_model_from_table(logged_click_model),
    )
    model, result = run_page_grpo(reranker_yaug, features, mask, reward, config, checkpoints)
    if users:
        logger.info("online_sampled: %d simulated users shown a page", reward.business.users)
    return model, metrics_frame(result.history), pd.DataFrame(result.samples)


def train_reranker_page_grpo_r_old_only(  # noqa: PLR0913 - as train_reranker_page_grpo
    reranker_yaug: PointerReranker,
    query_logs_train: pd.DataFrame,
    catalogue_items: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    logged_click_model: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
    pretrain_params: dict[str, Any],
    annotation_params: dict[str, Any],
) -> tuple[PointerReranker, pd.DataFrame]:
    """The control of the experience term: ``train_reranker_page_grpo`` with the reward
    weights of ``reranker_grpo.controls.r_old_only`` (R_old alone, beta 0), everything else the
    same. Its run has its own key in ``checkpoints`` (the key holds alpha and beta)."""
    control = {**params, "reward": {**params["reward"], **params["controls"]["r_old_only"]}}
    model, metrics, _ = train_reranker_page_grpo(
        reranker_yaug,
        query_logs_train,
        catalogue_items,
        item_experience_scores,
        logged_click_model,
        checkpoints,
        control,
        pretrain_params,
        annotation_params,
    )
    return model, metrics


def train_reranker_r_old_variants(  # noqa: PLR0913 - as train_reranker_page_grpo
    reranker_yaug: PointerReranker,
    query_logs_train: pd.DataFrame,
    catalogue_items: pd.DataFrame,
    item_experience_scores: pd.DataFrame,
    logged_click_model: pd.DataFrame,
    checkpoints: CheckpointStore,
    params: dict[str, Any],
    pretrain_params: dict[str, Any],
    annotation_params: dict[str, Any],
) -> dict[str, PointerReranker]:
    """``train_reranker_page_grpo`` once per ``reranker_grpo.r_old_variants`` entry with its
    changes (``page_reward.variant_params``; one that changes the click model's knobs fits its
    own to the same logs); a variant of the simulated users is left out, with a log line, on
    logs without the hidden truth. Each run has its own key in ``checkpoints``."""
    models = {}
    data = (reranker_yaug, query_logs_train, catalogue_items, item_experience_scores)
    for name, variant in params.get("r_old_variants", {}).items():
        changed = variant_params(params, variant)
        if needs_truth(changed["reward"]) and not has_truth(query_logs_train):
            logger.info("R_old variant %r left out: these logs have no hidden truth", name)
            continue
        table = logged_click_model
        if variant.get("click_model"):
            table = click_model_table(fit_click_model(query_logs_train, catalogue_items, changed))
        logger.info("page GRPO with the R_old variant %r", name)
        models[name], _, _ = train_reranker_page_grpo(
            *data, table, checkpoints, changed, pretrain_params, annotation_params
        )
    return models


def plot_reranker_grpo_curves(
    reranker_grpo_metrics: pd.DataFrame, reranker_grpo_r_old_only_metrics: pd.DataFrame
) -> Figure:
    """Page reward, its two parts, the KL to the pre-trained reranker and the pointer entropy
    against the GRPO step, of page GRPO and of its R_old-only control."""
    metrics = pd.concat(
        [
            reranker_grpo_metrics.assign(run="page_grpo"),
            reranker_grpo_r_old_only_metrics.assign(run="page_grpo_r_old_only"),
        ],
        ignore_index=True,
    )
    return plot_reward_curves(metrics, REWARD_COLUMNS, group="run")
