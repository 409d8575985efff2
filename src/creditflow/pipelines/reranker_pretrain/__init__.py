"""The ``reranker_pretrain`` pipeline: teacher-forced pre-training of the generative reranker on
y_aug and on the click-first baseline (docs/methods/experience.md, step 4)."""

from creditflow.pipelines.reranker_pretrain.pipeline import create_pipeline

__all__ = ["create_pipeline"]
