"""The ``annotation`` pipeline: synthetic catalogue, biased query logs and item annotations
(SPEC section 3, step 1)."""

from creditflow.pipelines.annotation.pipeline import create_pipeline

__all__ = ["create_pipeline"]
