"""``reranker_eval``: logged order vs the click / y_aug rerankers (with and without s_exp
inputs), y_aug + page GRPO and the two controls of what s_exp adds (page GRPO on R_old alone,
y_aug from a shuffled s_exp) on held-out sessions by query band: the counterfactual table, the
simulated online A/B with its quality-weight sweep, and the experience model against the hidden
true quality."""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.reranker_eval import nodes

HELDOUT = "query_logs_heldout"
PAGES = "reranker_heldout_pages"


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.serve_heldout_pages,
                [
                    HELDOUT,
                    "catalogue_items",
                    "item_experience_scores",
                    "item_experience_scores_shuffled",
                    "reranker_click",
                    "reranker_click_exp",
                    "reranker_yaug_no_exp",
                    "reranker_yaug",
                    "reranker_page_grpo",
                    "reranker_page_grpo_r_old_only",
                    "reranker_page_grpo_r_old_variants",
                    "reranker_yaug_shuffled_exp",
                    "params:reranker_eval",
                    "params:reranker_pretrain",
                    "params:reranker_grpo",
                ],
                PAGES,
                name="serve_heldout_pages",
            ),
            Node(
                nodes.evaluate_rerankers,
                [
                    PAGES,
                    HELDOUT,
                    "item_experience_scores",
                    "params:reranker_eval",
                    "params:reranker_grpo",
                ],
                "reranker_evaluation_sessions",
                name="evaluate_rerankers",
            ),
            Node(
                nodes.summarise_reranker_evaluation,
                "reranker_evaluation_sessions",
                ["reranker_evaluation", "reranker_evaluation_plot"],
                name="summarise_reranker_evaluation",
            ),
            Node(
                nodes.simulate_reranker_ab,
                [PAGES, HELDOUT, "catalogue_items", "params:annotation", "params:reranker_eval"],
                "reranker_ab_sessions",
                name="simulate_reranker_ab",
            ),
            Node(
                nodes.summarise_reranker_ab,
                ["reranker_ab_sessions", "params:reranker_eval", "params:reranker_grpo"],
                ["reranker_ab", "reranker_ab_plot"],
                name="summarise_reranker_ab",
            ),
            Node(
                nodes.sweep_click_quality_weight,
                [PAGES, HELDOUT, "catalogue_items", "params:annotation", "params:reranker_eval"],
                ["reranker_ab_sweep", "reranker_ab_sweep_plot"],
                name="sweep_click_quality_weight",
            ),
            Node(
                nodes.evaluate_click_model_recovery,
                ["logged_click_model", HELDOUT, "catalogue_items", "params:annotation"],
                ["logged_click_model_recovery", "logged_click_model_attractiveness"],
                name="evaluate_click_model_recovery",
            ),
            Node(
                nodes.evaluate_experience_model,
                [
                    "catalogue_items",
                    "item_annotations",
                    "expmodel_annotations",
                    "item_experience_scores",
                    "expmodel_item_split",
                    "expmodel_preference_pairs",
                    "expmodel_pft_metrics",
                    "query_logs_train",
                    HELDOUT,
                ],
                "expmodel_evaluation",
                name="evaluate_experience_model",
            ),
        ],
        tags=["reranker_eval", "experience"],
    )
