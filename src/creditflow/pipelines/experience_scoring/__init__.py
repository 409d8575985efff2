"""The ``experience_scoring`` pipeline: the experience score s_{q,v} of every (query, candidate),
or s_exp of every item (docs/methods/experience.md, step 3)."""

from creditflow.pipelines.experience_scoring.pipeline import create_pipeline

__all__ = ["create_pipeline"]
