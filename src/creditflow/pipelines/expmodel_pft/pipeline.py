"""``expmodel_pft``: preference pairs of long-tail sessions -> pairwise fine-tuning (docs/methods/experience.md, step 3)."""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.expmodel_pft import nodes

PARAMS = "params:expmodel_pft"


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.build_preference_pairs,
                ["query_logs_train", "expmodel_annotations", PARAMS],
                "expmodel_preference_pairs",
                name="build_preference_pairs",
            ),
            Node(
                nodes.train_expmodel_pft,
                [
                    "expmodel_sft_model",
                    "expmodel_processor",
                    "catalogue_items",
                    "expmodel_preference_pairs",
                    "expmodel_item_split",
                    "expmodel_pft_checkpoints",
                    PARAMS,
                ],
                ["expmodel_scorer", "expmodel_pft_metrics"],
                name="train_expmodel_pft",
            ),
        ],
        tags=["expmodel_pft", "experience"],
    )
