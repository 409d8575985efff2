"""Kedro catalog datasets for creditflow's heavy artifacts (checkpoints, tokenizers).

Used from ``conf/base/catalog.yml`` as ``type: creditflow.datasets.HFModelDataset``.
"""

from creditflow.datasets.hf_artifacts import (
    HFModelDataset,
    HFTokenizerDataset,
    resolve_pretrained_class,
)

__all__ = ["HFModelDataset", "HFTokenizerDataset", "resolve_pretrained_class"]
