"""Thin nodes: parse ``params:data_ingest`` and call one loader of ``creditflow.ingest``."""

from __future__ import annotations

from typing import Any

import pandas as pd

from creditflow.ingest import (
    IngestConfig,
    load_gsm8k,
    load_mathvision,
    load_mgsm,
    load_movielens,
    load_movielens_tags,
    load_tabmwp,
)


def ingest_mgsm_problems(params: dict[str, Any]) -> pd.DataFrame:
    """MGSM in the configured languages, each problem paired with its English text."""
    config = IngestConfig.from_params(params)
    return load_mgsm(
        config.source_dir("mgsm"), config.mgsm_languages, max_rows=config.max_rows_per_source
    )


def ingest_gsm8k_train_problems(params: dict[str, Any]) -> pd.DataFrame:
    """The full GSM8K train split (ids from its line numbers)."""
    config = IngestConfig.from_params(params)
    return load_gsm8k(config.source_dir("gsm8k"), "train", max_rows=config.max_rows_per_source)


def ingest_gsm8k_test_problems(params: dict[str, Any]) -> pd.DataFrame:
    """The shared 923 GSM8K test problems (ids from their original line numbers)."""
    config = IngestConfig.from_params(params)
    return load_gsm8k(config.source_dir("gsm8k"), "test", max_rows=config.max_rows_per_source)


def ingest_mathvision_problems(params: dict[str, Any]) -> pd.DataFrame:
    """MATH-Vision testmini (shared part) with checked image paths."""
    config = IngestConfig.from_params(params)
    return load_mathvision(config.source_dir("mathvision"), max_rows=config.max_rows_per_source)


def ingest_tabmwp_problems(params: dict[str, Any]) -> pd.DataFrame:
    """TabMWP numeric subset as an image-only task (table text dropped)."""
    config = IngestConfig.from_params(params)
    return load_tabmwp(config.source_dir("tabmwp"), max_rows=config.max_rows_per_source)


def ingest_movielens(params: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """MovieLens ratings and the item catalogue they refer to."""
    config = IngestConfig.from_params(params)
    return load_movielens(config.source_dir("movielens"), max_rows=config.max_rows_per_source)


def ingest_movielens_tags(movielens_items: pd.DataFrame, params: dict[str, Any]) -> pd.DataFrame:
    """MovieLens tags of movies in the catalogue (the text-only ExpModel's item text)."""
    config = IngestConfig.from_params(params)
    return load_movielens_tags(
        config.source_dir("movielens"), movielens_items, max_rows=config.max_rows_per_source
    )
