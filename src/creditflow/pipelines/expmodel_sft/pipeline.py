"""``expmodel_sft``: train / unseen item split -> processor -> initial tiny VL model -> its
vision tower pre-trained on unannotated covers (``vision_pretraining``; off at 0 steps) -> SFT on
the ExpModel's annotations, per (query, item) or per item by ``score_mode`` (docs/methods/experience.md, step 2)."""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.expmodel_sft import nodes

PARAMS = "params:expmodel_sft"


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.split_expmodel_items,
                ["catalogue_items", PARAMS],
                "expmodel_item_split",
                name="split_expmodel_items",
            ),
            Node(
                nodes.build_expmodel_processor,
                ["catalogue_items", "expmodel_annotations", "expmodel_item_split", PARAMS],
                "expmodel_processor",
                name="build_expmodel_processor",
            ),
            Node(
                nodes.build_expmodel,
                ["expmodel_processor", PARAMS],
                "expmodel_initial_model",
                name="build_expmodel",
            ),
            Node(
                nodes.pretrain_expmodel_vision,
                [
                    "expmodel_initial_model",
                    "expmodel_processor",
                    "expmodel_sft_checkpoints",
                    PARAMS,
                ],
                ["expmodel_vision_pretrained_model", "expmodel_vision_pretraining_metrics"],
                name="pretrain_expmodel_vision",
            ),
            Node(
                nodes.train_expmodel_sft,
                [
                    "expmodel_vision_pretrained_model",
                    "expmodel_processor",
                    "catalogue_items",
                    "expmodel_annotations",
                    "expmodel_item_split",
                    "expmodel_sft_checkpoints",
                    PARAMS,
                ],
                ["expmodel_sft_model", "expmodel_sft_metrics"],
                name="train_expmodel_sft",
            ),
        ],
        tags=["expmodel_sft", "experience"],
    )
