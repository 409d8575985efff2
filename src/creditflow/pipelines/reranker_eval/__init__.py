"""The ``reranker_eval`` pipeline: rankers and the experience model on held-out sessions (SPEC 3)."""

from creditflow.pipelines.reranker_eval.pipeline import create_pipeline

__all__ = ["create_pipeline"]
