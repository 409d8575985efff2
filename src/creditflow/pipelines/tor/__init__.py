"""The ``tor`` pipeline: ToR token reweighting (docs/methods/tor.md) against GRPO and its ablations,
on a tiny (or pretrained) Qwen2.5-VL policy."""

from creditflow.pipelines.tor.pipeline import create_pipeline

__all__ = ["create_pipeline"]
