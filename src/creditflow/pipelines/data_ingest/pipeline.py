"""The ``data_ingest`` pipeline: one node per raw source, all reading ``params:data_ingest``.

Output schemas are documented in ``creditflow.ingest.schemas``.
"""

from collections.abc import Mapping
from typing import Any

from kedro.pipeline import Node, Pipeline

from creditflow.ingest import IngestConfig
from creditflow.ingest.sources import check_raw_data, mgsm_files
from creditflow.pipelines.data_ingest import nodes

PARAMS = "params:data_ingest"
# The raw data set (creditflow.ingest.sources.RAW_SOURCES) each node reads.
NODE_SOURCES = {
    "ingest_mgsm_problems": "mgsm",
    "ingest_gsm8k_train_problems": "gsm8k",
    "ingest_gsm8k_test_problems": "gsm8k",
    "ingest_mathvision_problems": "mathvision",
    "ingest_tabmwp_problems": "tabmwp",
    "ingest_movielens": "movielens",
    "ingest_movielens_tags": "movielens",
}


def check_pipeline_raw_data(pipeline: Pipeline, params: Mapping[str, Any]) -> None:
    """RawDataMissingError, before any node runs, when a raw data set the ingest nodes of
    ``pipeline`` read is not complete under ``params``' raw_data_dir (MGSM: the files of
    ``mgsm_languages`` only); the message names the sets and says how to fetch them
    (``hooks.raw_data.RawDataHook`` calls this)."""
    keys = sorted({NODE_SOURCES[node.name] for node in pipeline.nodes if node.name in NODE_SOURCES})
    if keys:
        config = IngestConfig.from_params(params)
        files = {"mgsm": mgsm_files(config.mgsm_languages)}
        check_raw_data(config.raw_data_dir, keys, files)


def create_pipeline(**kwargs) -> Pipeline:
    """Seven ingestion nodes; only the MovieLens tags wait, for the catalogue they refer to."""
    return Pipeline(
        [
            Node(
                nodes.ingest_mgsm_problems,
                PARAMS,
                "mgsm_problems",
                name="ingest_mgsm_problems",
                tags=["math_text"],
            ),
            Node(
                nodes.ingest_gsm8k_train_problems,
                PARAMS,
                "gsm8k_train_problems",
                name="ingest_gsm8k_train_problems",
                tags=["math_text"],
            ),
            Node(
                nodes.ingest_gsm8k_test_problems,
                PARAMS,
                "gsm8k_test_problems",
                name="ingest_gsm8k_test_problems",
                tags=["math_text"],
            ),
            Node(
                nodes.ingest_mathvision_problems,
                PARAMS,
                "mathvision_problems",
                name="ingest_mathvision_problems",
                tags=["visual"],
            ),
            Node(
                nodes.ingest_tabmwp_problems,
                PARAMS,
                "tabmwp_problems",
                name="ingest_tabmwp_problems",
                tags=["visual"],
            ),
            Node(
                nodes.ingest_movielens,
                PARAMS,
                ["movielens_ratings", "movielens_items"],
                name="ingest_movielens",
                tags=["ranking"],
            ),
            Node(
                nodes.ingest_movielens_tags,
                ["movielens_items", PARAMS],
                "movielens_tags",
                name="ingest_movielens_tags",
                tags=["ranking"],
            ),
        ]
    )
