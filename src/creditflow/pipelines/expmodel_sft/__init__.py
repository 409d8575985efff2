"""The ``expmodel_sft`` pipeline: the ExpModel learns to write item annotations (docs/methods/experience.md, step 2)."""

from creditflow.pipelines.expmodel_sft.pipeline import create_pipeline

__all__ = ["create_pipeline"]
