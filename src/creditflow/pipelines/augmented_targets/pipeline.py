"""``augmented_targets``: the reranker's pre-training targets per training session (docs/methods/experience.md, step 4),
and those of the shuffled-s_exp control: y_aug built from s_exp shuffled within each query
(``chain.ab_test.controls``)."""

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
                nodes.shuffle_experience_scores,
                ["item_experience_scores", "params:reranker_pretrain"],
                "item_experience_scores_shuffled",
                name="shuffle_experience_scores",
            ),
            Node(
                nodes.build_augmented_targets,
                ["query_logs_train", "item_experience_scores_shuffled"],
                "reranker_targets_yaug_shuffled_exp",
                name="build_augmented_targets_shuffled_exp",
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
