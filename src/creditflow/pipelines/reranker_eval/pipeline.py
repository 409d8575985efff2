"""``reranker_eval``: logged order vs click / y_aug / y_aug + page-GRPO rerankers on held-out
sessions by query band, and the experience model against the hidden true quality."""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.reranker_eval import nodes


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.evaluate_rerankers,
                [
                    "query_logs_heldout",
                    "catalogue_items",
                    "item_experience_scores",
                    "reranker_click",
                    "reranker_yaug",
                    "reranker_page_grpo",
                    "params:reranker_eval",
                    "params:reranker_pretrain",
                ],
                "reranker_evaluation_sessions",
                name="evaluate_rerankers",
            ),
            Node(
                nodes.summarise_reranker_evaluation,
                "reranker_evaluation_sessions",
                ["reranker_evaluation", "reranker_evaluation_plot"],
                name="summarise_reranker_evaluation",
            ),
            Node(
                nodes.evaluate_experience_model,
                [
                    "catalogue_items",
                    "item_annotations",
                    "item_experience_scores",
                    "expmodel_pft_metrics",
                ],
                "expmodel_evaluation",
                name="evaluate_experience_model",
            ),
        ],
        tags=["reranker_eval", "experience"],
    )
