"""``movielens_eval``: MovieLens users as ranking sessions -> the logged popularity order and the
click / y_aug / y_aug + page-GRPO rerankers (trained on the synthetic logs) by user band.

Reads ``movielens_ratings`` / ``movielens_items`` (the registry adds the data_ingest node that
makes them) and the rerankers of ``reranker_pretrain`` / ``reranker_grpo``. Not part of the
default run: ``kedro run --pipelines movielens_eval``.
"""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.movielens_eval import nodes

PARAMS = "params:movielens_eval"


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.build_movielens_sessions,
                ["movielens_ratings", "movielens_items", PARAMS],
                ["movielens_sessions", "movielens_item_table"],
                name="build_movielens_sessions",
            ),
            Node(
                nodes.evaluate_rerankers_on_movielens,
                [
                    "movielens_sessions",
                    "movielens_item_table",
                    "reranker_click",
                    "reranker_yaug",
                    "reranker_page_grpo",
                    PARAMS,
                    "params:reranker_pretrain",
                ],
                "movielens_evaluation_sessions",
                name="evaluate_rerankers_on_movielens",
            ),
            Node(
                nodes.summarise_movielens_evaluation,
                "movielens_evaluation_sessions",
                ["movielens_evaluation", "movielens_evaluation_plot"],
                name="summarise_movielens_evaluation",
            ),
        ],
        tags=["movielens_eval"],
    )
