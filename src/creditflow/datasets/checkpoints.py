"""A catalog entry for a training run's resumable checkpoint directory.

Resuming needs a stable place that survives between runs, so this dataset is deliberately
not versioned: loading it gives a ``CheckpointStore`` over ``filepath``; the training node
writes checkpoints there as it goes (inside a sub-directory keyed by the run's fingerprint,
so changed parameters or inputs start afresh instead of resuming someone else's run). The
trained weights themselves leave the node through a versioned ``HFModelDataset``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from creditflow.training.checkpoint import CheckpointStore


class CheckpointDirectoryDataset(AbstractDataset[None, CheckpointStore]):
    """``load()`` -> ``CheckpointStore(filepath, keep)``; saving is not supported (the
    training loop writes into the store itself)."""

    def __init__(self, filepath: str, keep: int = 2, metadata: dict[str, Any] | None = None):
        self._filepath = Path(filepath)
        self._keep = keep
        self.metadata = metadata

    def load(self) -> CheckpointStore:
        return CheckpointStore(self._filepath, keep=self._keep)

    def save(self, data: None) -> None:
        raise DatasetError(
            f"{type(self).__name__} is read-only: training nodes write checkpoints into the "
            "CheckpointStore they load from it"
        )

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath), "keep": self._keep}

    def _exists(self) -> bool:
        return True
