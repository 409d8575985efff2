"""``reranker_pretrain``: one reranker per (target, inputs), from the same initial weights
(docs/methods/experience.md, step 4).

``reranker_yaug`` learns y_aug (clicked first, each group by s_exp); ``reranker_click`` learns
the logged click-first order, the baseline a click-log reranker imitates. The ablations
``reranker_click_exp`` (click target, s_exp inputs) and ``reranker_yaug_no_exp`` (y_aug target,
no s_exp inputs) complete the 2 x 2, so the target and the s_exp inputs are compared one at a
time. Whether each reads s_exp is ``params:reranker_pretrain.rerankers``; every other feature
is the same for all four.

The control ``reranker_yaug_shuffled_exp`` is ``reranker_yaug`` again (setting ``yaug``), from
s_exp shuffled within each query: its y_aug targets and its s_exp features both come from
``item_experience_scores_shuffled`` (``augmented_targets``), so against ``reranker_yaug`` it
measures what s_exp's order adds (``chain.ab_test.controls``).
"""

from functools import partial, update_wrapper

from kedro.pipeline import Node, Pipeline

from creditflow.chain.config import RERANKERS
from creditflow.pipelines.reranker_pretrain import nodes

PARAMS = "params:reranker_pretrain"
SHUFFLED = "yaug_shuffled_exp"  # the control's name in its datasets


def _named(func, name: str, **bound):
    """``partial(func, **bound)`` that keeps ``func``'s docstring for kedro-viz."""
    wrapped = partial(func, **bound)
    update_wrapper(wrapped, func)
    wrapped.__name__ = name
    return wrapped


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                _named(nodes.pretrain_reranker, "pretrain_reranker", kind=kind),
                [
                    f"reranker_targets_{target}",
                    "query_logs_train",
                    "catalogue_items",
                    "item_experience_scores",
                    "reranker_pretrain_checkpoints",
                    PARAMS,
                ],
                [f"reranker_{kind}", f"reranker_pretrain_{kind}_metrics"],
                name=f"pretrain_reranker_{kind}",
            )
            for kind, target in RERANKERS.items()
        ]
        + [
            Node(
                _named(nodes.pretrain_reranker, "pretrain_reranker", kind="yaug", label=SHUFFLED),
                [
                    f"reranker_targets_{SHUFFLED}",
                    "query_logs_train",
                    "catalogue_items",
                    "item_experience_scores_shuffled",
                    "reranker_pretrain_checkpoints",
                    PARAMS,
                ],
                [f"reranker_{SHUFFLED}", f"reranker_pretrain_{SHUFFLED}_metrics"],
                name=f"pretrain_reranker_{SHUFFLED}",
            )
        ],
        tags=["reranker_pretrain", "experience"],
    )
