"""The ``annotation`` pipeline: synthetic catalogue, biased query logs and item annotations
(docs/methods/experience.md, step 1)."""

from creditflow.pipelines.annotation.pipeline import create_pipeline

__all__ = ["create_pipeline"]
