"""The ``augmented_targets`` pipeline: y_aug and click-first pre-training targets (docs/methods/experience.md, step 4)."""

from creditflow.pipelines.augmented_targets.pipeline import create_pipeline

__all__ = ["create_pipeline"]
