"""``reranker_grpo``: a click model fitted to the training logs (page GRPO's default R_old), then
page-level GRPO from ``reranker_yaug`` -> ``reranker_page_grpo`` (docs/methods/experience.md, step 5),
and the same on R_old alone -> ``reranker_page_grpo_r_old_only``, the control of the experience
term (``reranker_grpo.controls.r_old_only``), and once per R_old variant
(``reranker_grpo.r_old_variants``) -> ``reranker_page_grpo_r_old_variants``."""

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.reranker_grpo import nodes

# Page GRPO's and its R_old-only control's: the same start, data, worlds and checkpoint store
# (each run keyed inside it by its reward, so the two never share a run).
GRPO_INPUTS = [
    "reranker_yaug",
    "query_logs_train",
    "catalogue_items",
    "item_experience_scores",
    "logged_click_model",
    "reranker_grpo_checkpoints",
    "params:reranker_grpo",
    "params:reranker_pretrain",
    "params:annotation",
]


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.fit_click_model_on_logs,
                ["query_logs_train", "catalogue_items", "params:reranker_grpo"],
                ["logged_click_model", "logged_click_model_fit"],
                name="fit_click_model_on_logs",
            ),
            Node(
                nodes.train_reranker_page_grpo,
                GRPO_INPUTS,
                ["reranker_page_grpo", "reranker_grpo_metrics", "reranker_grpo_samples"],
                name="train_reranker_page_grpo",
            ),
            Node(
                nodes.train_reranker_page_grpo_r_old_only,
                GRPO_INPUTS,
                ["reranker_page_grpo_r_old_only", "reranker_grpo_r_old_only_metrics"],
                name="train_reranker_page_grpo_r_old_only",
            ),
            Node(
                nodes.train_reranker_r_old_variants,
                GRPO_INPUTS,
                "reranker_page_grpo_r_old_variants",
                name="train_reranker_r_old_variants",
            ),
            Node(
                nodes.plot_reranker_grpo_curves,
                ["reranker_grpo_metrics", "reranker_grpo_r_old_only_metrics"],
                "reranker_grpo_reward_curves",
                name="plot_reranker_grpo_curves",
            ),
        ],
        tags=["reranker_grpo", "experience"],
    )
