"""``annotation``: catalogue -> query logs (train / held-out) and item annotations (docs/methods/experience.md, step 1),
and the annotations the ExpModel learns from (per (query, item) in ``expmodel_sft.score_mode:
query``, else the item annotations).

The catalogue and logs are the synthetic world, or files of your own (``annotation.source``),
read through the fixed inputs ``annotation_source_items`` / ``annotation_source_impressions``
that ``hooks.task_source.TaskSourceHook`` fills (docs/howto/own_data.md)."""

from kedro.pipeline import Node, Pipeline

from creditflow.config.task_sources import TASK_SOURCES
from creditflow.pipelines.annotation import nodes

PARAMS = "params:annotation"


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.generate_items,
                [TASK_SOURCES["annotation_items"].dataset, PARAMS],
                "catalogue_items",
                name="generate_items",
            ),
            Node(
                nodes.generate_query_logs,
                ["catalogue_items", TASK_SOURCES["annotation_impressions"].dataset, PARAMS],
                ["query_logs_train", "query_logs_heldout"],
                name="generate_query_logs",
            ),
            Node(
                nodes.annotate_items,
                ["catalogue_items", PARAMS, "credentials"],
                "item_annotations",
                name="annotate_items",
            ),
            Node(
                nodes.annotate_for_expmodel,
                [
                    "catalogue_items",
                    "query_logs_train",
                    "item_annotations",
                    "params:expmodel_sft",
                    PARAMS,
                    "credentials",
                ],
                "expmodel_annotations",
                name="annotate_for_expmodel",
            ),
        ],
        tags=["annotation", "experience"],
    )
