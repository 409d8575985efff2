"""The ``tapo`` pipeline: TAPO (docs/methods/tapo.md) against GRPO baselines on multilingual math."""

from creditflow.pipelines.tapo.pipeline import create_pipeline

__all__ = ["create_pipeline"]
