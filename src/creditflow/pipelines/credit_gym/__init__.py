"""The ``credit_gym`` pipeline: every strategy of its parameters on a world with planted
credit, swept over five knobs (docs/methods/credit_gym.md). Its parameter schema lives in
``creditflow.pipelines.credit_gym_parameters`` (torch-free, as every schema)."""

from creditflow.pipelines.credit_gym.pipeline import create_pipeline

__all__ = ["create_pipeline"]
