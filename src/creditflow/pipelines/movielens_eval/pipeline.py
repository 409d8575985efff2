"""``movielens_eval``: MovieLens users as ranking sessions -> a text-only ExpModel's s_exp ->
the logged popularity order and the click / y_aug / y_aug + page-GRPO rerankers (trained on
the synthetic logs) by user band, each reranker that reads s_exp also with zero scores.

The text-only ExpModel: a rating teacher annotates the movies with
enough ratings that no session holds back (``annotation.ratings``), a tiny Qwen2 learns to
write that annotation from the movie's title, year, genres and tags (SFT) and then to score
pairs of movies (PFT), and scores every candidate from its text alone
(``chain.expmodel.text``).

Reads ``movielens_ratings`` / ``movielens_items`` / ``movielens_tags`` (as ``kedro run
--pipelines data_ingest`` saved them), the rerankers of ``reranker_pretrain`` / ``reranker_grpo``
and the synthetic chain's ``item_experience_scores`` (the scale the rerankers learnt s_exp on).
Not part of the default run: ``kedro run --pipelines movielens_eval``.
"""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.movielens_eval import nodes

PARAMS = "params:movielens_eval"
TEXTS = "movielens_item_texts"
ANNOTATIONS = "movielens_item_annotations"
SPLIT = "movielens_expmodel_item_split"
TOKENIZER = "movielens_expmodel_tokenizer"


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.build_movielens_sessions,
                ["movielens_ratings", "movielens_items", PARAMS],
                ["movielens_sessions", "movielens_item_table"],
                name="build_movielens_sessions",
            ),
            Node(
                nodes.build_movielens_item_texts,
                ["movielens_items", "movielens_tags", "movielens_sessions", PARAMS],
                TEXTS,
                name="build_movielens_item_texts",
            ),
            Node(
                nodes.annotate_movielens_items,
                [TEXTS, "movielens_ratings", "movielens_sessions", PARAMS],
                ANNOTATIONS,
                name="annotate_movielens_items",
            ),
            Node(
                nodes.split_movielens_expmodel_items,
                [ANNOTATIONS, PARAMS],
                SPLIT,
                name="split_movielens_expmodel_items",
            ),
            Node(
                nodes.build_movielens_expmodel,
                [TEXTS, ANNOTATIONS, SPLIT, PARAMS],
                [TOKENIZER, "movielens_expmodel_initial_model"],
                name="build_movielens_expmodel",
            ),
            Node(
                nodes.train_movielens_expmodel_sft,
                ["movielens_expmodel_initial_model", TOKENIZER, TEXTS, ANNOTATIONS, SPLIT, PARAMS],
                ["movielens_expmodel_sft_model", "movielens_expmodel_sft_metrics"],
                name="train_movielens_expmodel_sft",
            ),
            Node(
                nodes.train_movielens_expmodel_pft,
                ["movielens_expmodel_sft_model", TOKENIZER, TEXTS, ANNOTATIONS, SPLIT, PARAMS],
                ["movielens_expmodel_scorer", "movielens_expmodel_pft_metrics"],
                name="train_movielens_expmodel_pft",
            ),
            Node(
                nodes.score_movielens_items,
                [
                    "movielens_expmodel_scorer",
                    TOKENIZER,
                    TEXTS,
                    "movielens_item_table",
                    ANNOTATIONS,
                    "item_experience_scores",
                    PARAMS,
                ],
                "movielens_item_scores",
                name="score_movielens_items",
            ),
            Node(
                nodes.evaluate_movielens_expmodel,
                ["movielens_item_scores", ANNOTATIONS, SPLIT],
                "movielens_expmodel_evaluation",
                name="evaluate_movielens_expmodel",
            ),
            Node(
                nodes.evaluate_rerankers_on_movielens,
                [
                    "movielens_sessions",
                    "movielens_item_table",
                    "movielens_item_scores",
                    "reranker_click",
                    "reranker_yaug",
                    "reranker_page_grpo",
                    PARAMS,
                    "params:reranker_pretrain",
                ],
                "movielens_evaluation_sessions",
                name="evaluate_rerankers_on_movielens",
            ),
            Node(
                nodes.summarise_movielens_evaluation,
                "movielens_evaluation_sessions",
                [
                    "movielens_evaluation",
                    "movielens_evaluation_plot",
                    "movielens_exp_effect",
                ],
                name="summarise_movielens_evaluation",
            ),
        ],
        tags=["movielens_eval"],
    )
