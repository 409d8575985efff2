"""The ``grpo`` pipeline: the strategies of its parameters compared on any prompt set (a
synthetic default, or a catalog dataset of the prompts schema) with any rewards."""

from creditflow.pipelines.grpo.pipeline import create_pipeline

__all__ = ["create_pipeline"]
