"""The ``data_ingest`` pipeline: one node per raw source, all reading ``params:data_ingest``.

Output schemas are documented in ``creditflow.ingest.schemas``.
"""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.data_ingest import nodes

PARAMS = "params:data_ingest"


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
