"""The ``movielens_eval`` pipeline: the synthetic-trained rerankers on real MovieLens sessions."""

from creditflow.pipelines.movielens_eval.pipeline import create_pipeline

__all__ = ["create_pipeline"]
