"""The ``expmodel_pft`` pipeline: long-tail preference pairs and the scalar-head scorer (docs/methods/experience.md, step 3)."""

from creditflow.pipelines.expmodel_pft.pipeline import create_pipeline

__all__ = ["create_pipeline"]
