"""The ``reranker_grpo`` pipeline: page-level GRPO of the y_aug reranker (docs/methods/experience.md, step 5)."""

from creditflow.pipelines.reranker_grpo.pipeline import create_pipeline

__all__ = ["create_pipeline"]
