"""``experience_scoring``: the PFT scorer scores every (query, candidate) of the sessions
(s_{q,v}) or every catalogue item (s_exp), by ``expmodel_sft.score_mode`` (docs/methods/experience.md, steps 3-4)."""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.experience_scoring import nodes


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.score_items,
                [
                    "expmodel_scorer",
                    "expmodel_processor",
                    "catalogue_items",
                    "query_logs_train",
                    "query_logs_heldout",
                    "params:expmodel_sft",
                    "params:experience_scoring",
                ],
                "item_experience_scores",
                name="score_items",
            ),
        ],
        tags=["experience_scoring", "experience"],
    )
