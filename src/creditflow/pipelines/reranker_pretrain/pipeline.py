"""``reranker_pretrain``: one reranker per target, from the same initial weights (SPEC 3.4).

``reranker_yaug`` learns y_aug (clicked first, each group by s_exp); ``reranker_click`` learns
the logged click-first order, the baseline a click-log reranker imitates. What each reads is
``params:reranker_pretrain.rerankers``.
"""

from functools import partial, update_wrapper

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.reranker_pretrain import nodes

PARAMS = "params:reranker_pretrain"
# Reranker name -> its target table (reranker_targets_<name>) and model (reranker_<name>).
RERANKERS = ("yaug", "click")


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
                    f"reranker_targets_{kind}",
                    "query_logs_train",
                    "catalogue_items",
                    "item_experience_scores",
                    "reranker_pretrain_checkpoints",
                    PARAMS,
                ],
                [f"reranker_{kind}", f"reranker_pretrain_{kind}_metrics"],
                name=f"pretrain_reranker_{kind}",
            )
            for kind in RERANKERS
        ],
        tags=["reranker_pretrain", "experience"],
    )
