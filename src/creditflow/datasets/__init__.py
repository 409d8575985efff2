"""Kedro catalog datasets for creditflow's heavy artifacts (models, tokenizers, checkpoints).

Used from ``conf/base/catalog.yml`` as ``type: creditflow.datasets.HFModelDataset``.
"""

from creditflow.datasets.checkpoints import CheckpointDirectoryDataset
from creditflow.datasets.hf_artifacts import (
    HFModelDataset,
    HFModelsBySeedDataset,
    HFTokenizerDataset,
    resolve_pretrained_class,
)

__all__ = [
    "CheckpointDirectoryDataset",
    "HFModelDataset",
    "HFModelsBySeedDataset",
    "HFTokenizerDataset",
    "resolve_pretrained_class",
]
