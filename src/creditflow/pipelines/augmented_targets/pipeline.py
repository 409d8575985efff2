"""``augmented_targets``: the reranker's pre-training targets per training session (docs/methods/experience.md, step 4)."""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.augmented_targets import nodes


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.build_augmented_targets,
                ["query_logs_train", "item_experience_scores"],
                "reranker_targets_yaug",
                name="build_augmented_targets",
            ),
            Node(
                nodes.build_click_first_targets,
                "query_logs_train",
                "reranker_targets_click",
                name="build_click_first_targets",
            ),
        ],
        tags=["augmented_targets", "experience"],
    )
