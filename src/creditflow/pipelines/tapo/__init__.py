"""The ``tapo`` pipeline: TAPO (SPEC section 1) against GRPO baselines on multilingual math."""

from creditflow.pipelines.tapo.pipeline import create_pipeline

__all__ = ["create_pipeline"]
