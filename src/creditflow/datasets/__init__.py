"""Kedro catalog datasets for creditflow's heavy artifacts (models, tokenizers, checkpoints)
and its reports (text, CSV and figures written whole or not at all).

Used from ``conf/base/catalog.yml`` as ``type: creditflow.datasets.HFModelDataset``.
"""

from creditflow.datasets.checkpoints import CheckpointDirectoryDataset
from creditflow.datasets.hf_artifacts import (
    HFModelDataset,
    HFModelsByNameDataset,
    HFModelsBySeedDataset,
    HFTokenizerDataset,
    resolve_pretrained_class,
)
from creditflow.datasets.reports import (
    AtomicCSVDataset,
    AtomicMatplotlibDataset,
    AtomicParquetDataset,
    AtomicTextDataset,
)

__all__ = [
    "AtomicCSVDataset",
    "AtomicMatplotlibDataset",
    "AtomicParquetDataset",
    "AtomicTextDataset",
    "CheckpointDirectoryDataset",
    "HFModelDataset",
    "HFModelsByNameDataset",
    "HFModelsBySeedDataset",
    "HFTokenizerDataset",
    "resolve_pretrained_class",
]
