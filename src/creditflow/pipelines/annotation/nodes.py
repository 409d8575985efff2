"""Thin nodes of the ``annotation`` pipeline; the work happens in creditflow.tasks/annotation
(and creditflow.chain.world.sources for a catalogue and logs of your own)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pandas as pd

from creditflow.chain.annotation.base import build_annotator
from creditflow.chain.annotation.credentials import resolve_annotator_options
from creditflow.chain.expmodel import data as expmodel_data
from creditflow.chain.reranker.data import split_sessions
from creditflow.chain.world.catalogue import (
    ClickModel,
    LoggingRanker,
    generate_catalogue,
    generate_sessions,
)
from creditflow.chain.world.sources import ranking_items, ranking_sessions
from creditflow.tasks.splits import SYNTHETIC

logger = logging.getLogger(__name__)


def generate_items(
    annotation_source_items: pd.DataFrame | None, params: dict[str, Any]
) -> pd.DataFrame:
    """The catalogue: with ``source.items: synthetic``, the seeded short-video world (cover,
    title, popularity and the hidden true quality); else the catalog dataset of that name
    (``annotation_source_items``, put there by ``hooks.task_source.TaskSourceHook``), checked and
    converted by ``chain.world.sources.ranking_items``."""
    source = params["source"]["items"]
    if source == SYNTHETIC:
        items = params["items"]
        return generate_catalogue(
            items["n_items"], seed=items["seed"], image_size=items["image_size"]
        )
    catalogue = ranking_items(annotation_source_items, source)
    if "true_quality" not in catalogue.columns:
        logger.info(
            "%s has no true_quality: the simulated A/B, the true nDCG and the Kendall tau "
            "columns are left out",
            source,
        )
    return catalogue


def generate_query_logs(
    catalogue_items: pd.DataFrame,
    annotation_source_impressions: pd.DataFrame | None,
    params: dict[str, Any],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Search sessions, split (seeded) into the training logs and the held-out logs the
    rerankers are evaluated on. With ``source.impressions: synthetic`` they are click-biased
    sessions over the catalogue (ranked by ``logging_ranker``, clicked and long-viewed by
    ``click_model``); else the catalog dataset of that name, one row per impression
    (``chain.world.sources.ranking_sessions``)."""
    logs = params["query_logs"]
    source = params["source"]["impressions"]
    if source == SYNTHETIC:
        sessions = generate_sessions(
            catalogue_items,
            **{k: logs[k] for k in ("n_queries", "n_sessions", "list_length", "seed")},
            zipf_exponent=logs["zipf_exponent"],
            ranker=LoggingRanker(**params["logging_ranker"]),
            click_model=ClickModel.from_params(params["click_model"]),
        )
    else:
        sessions = ranking_sessions(
            annotation_source_impressions, catalogue_items, source, logs["list_length"]
        )
    train, heldout = split_sessions(sessions, logs["heldout_fraction"], seed=logs["split_seed"])
    bands = heldout["query_frequency_band"].value_counts().to_dict()
    message = "query logs: %d training and %d held-out sessions; held-out bands %s"
    logger.info(message, len(train), len(heldout), bands)
    return train, heldout


def annotate_items(
    catalogue_items: pd.DataFrame, params: dict[str, Any], credentials: Mapping[str, Any]
) -> pd.DataFrame:
    """One annotation per item by the annotator named in ``params``; failed ones stay in the
    table with their status, raw text and error (no scores invented). A key comes from the
    Kedro ``credentials`` entry the options name (or ``OPENAI_API_KEY``), never from params."""
    return _annotate(catalogue_items, params, credentials)


def annotate_for_expmodel(
    catalogue_items: pd.DataFrame,
    query_logs_train: pd.DataFrame,
    item_annotations: pd.DataFrame,
    expmodel_params: dict[str, Any],
    params: dict[str, Any],
    credentials: Mapping[str, Any],
) -> pd.DataFrame:
    """The annotations the ExpModel learns from (``expmodel_sft.score_mode``): in ``query``
    mode the annotator judges every (query, candidate) of the training sessions for its query
    (relevance to the query, docs/methods/experience.md, step 3's s_{q,v}), one row per pair with its ``query_text``; in
    ``item`` mode they are ``item_annotations`` (the query logs are not read)."""
    if expmodel_data.check_score_mode(expmodel_params["score_mode"]) == expmodel_data.ITEM_MODE:
        return item_annotations
    units = expmodel_data.query_candidates(query_logs_train)
    items = units.merge(catalogue_items, on="item_id", how="left", validate="many_to_one")
    logger.info(
        "annotating %d (query, item) pairs of %d queries",
        len(units),
        units[expmodel_data.QUERY_COLUMN].nunique(),
    )
    return _annotate(items, params, credentials)


def _annotate(
    items: pd.DataFrame, params: dict[str, Any], credentials: Mapping[str, Any]
) -> pd.DataFrame:
    settings = params["annotator"]
    options = settings.get("options") or {}
    options = resolve_annotator_options(settings["name"], options, credentials)
    annotator = build_annotator(settings["name"], **options)
    annotations = annotator.annotate(items)
    failed = int((annotations["status"] != "ok").sum())
    if failed:
        logger.warning("%d of %d annotations failed", failed, len(annotations))
    return annotations
