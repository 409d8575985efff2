"""The ``reranker_eval`` pipeline: rankers and the experience model on held-out sessions (docs/methods/experience.md)."""

from creditflow.pipelines.reranker_eval.pipeline import create_pipeline

__all__ = ["create_pipeline"]
