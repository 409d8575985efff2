"""``annotation``: catalogue -> query logs (train / held-out) and item annotations (SPEC 3.1)."""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.annotation import nodes

PARAMS = "params:annotation"


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(nodes.generate_items, PARAMS, "catalogue_items", name="generate_items"),
            Node(
                nodes.generate_query_logs,
                ["catalogue_items", PARAMS],
                ["query_logs_train", "query_logs_heldout"],
                name="generate_query_logs",
            ),
            Node(
                nodes.annotate_items,
                ["catalogue_items", PARAMS, "credentials"],
                "item_annotations",
                name="annotate_items",
            ),
        ],
        tags=["annotation", "experience"],
    )
