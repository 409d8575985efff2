"""kedro-datasets' text, CSV, Parquet and matplotlib datasets, each saving through
:func:`creditflow.io_atomic.atomic_open`: a report cut short by a full disk never becomes the
newest version of its dataset, and the previous one stays readable.

Loading, versioning and the save options are kedro-datasets' own; only the write differs, and
only on the local file system (an object store such as S3 shows an object only once its upload
is complete, so the parent's direct write is already whole or nothing there).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pandas as pd
from kedro.io.core import get_filepath_str
from kedro_datasets.matplotlib import MatplotlibDataset
from kedro_datasets.pandas import CSVDataset, ParquetDataset
from kedro_datasets.text import TextDataset
from matplotlib.figure import Figure

from creditflow.io_atomic import atomic_open


@contextlib.contextmanager
def _open_whole(path: str, open_args: dict[str, Any]) -> Iterator[IO]:
    """:func:`atomic_open` on ``path``, making its folder (a new version's) and removing that
    folder again when the write fails, so a failed save leaves no empty version behind."""
    folder = Path(path).parent
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_open(path, **open_args) as handle:
            yield handle
    except BaseException:
        if made:
            with contextlib.suppress(OSError):  # another writer put a file there meanwhile
                folder.rmdir()
        raise


def _save_whole(dataset: Any, write: Callable[[IO], Any]) -> None:
    """``write(handle)`` into ``dataset``'s save path through :func:`_open_whole` (a local
    file only), then the cache of its load version dropped, as kedro-datasets' ``save``
    does."""
    path = get_filepath_str(dataset._get_save_path(), dataset._protocol)
    with _open_whole(path, dataset._fs_open_args_save) as handle:
        write(handle)
    dataset._invalidate_cache()


class AtomicTextDataset(TextDataset):
    """``text.TextDataset`` (the HTML credit reports), saved whole or not at all."""

    def save(self, data: str) -> None:
        if self._protocol != "file":
            super().save(data)
            return
        _save_whole(self, lambda handle: handle.write(data))


class AtomicCSVDataset(CSVDataset):
    """``pandas.CSVDataset`` (the comparison and evaluation tables), saved whole or not at all."""

    def save(self, data: pd.DataFrame) -> None:
        if self._protocol != "file":
            super().save(data)
            return
        _save_whole(self, lambda handle: data.to_csv(path_or_buf=handle, **self._save_args))


class AtomicParquetDataset(ParquetDataset):
    """``pandas.ParquetDataset`` (the per-step metrics and credit-inspector tables), saved
    whole or not at all."""

    def save(self, data: pd.DataFrame) -> None:
        if self._protocol != "file" or "partition_cols" in self._save_args:
            super().save(data)  # the parent's checks and messages
            return
        _save_whole(self, lambda handle: data.to_parquet(handle, **self._save_args))


class AtomicMatplotlibDataset(MatplotlibDataset):
    """``matplotlib.MatplotlibDataset`` (the reward curves and credit figures), each figure
    saved whole or not at all."""

    def _save_to_fs(self, full_key_path: str, plot: Figure) -> None:
        if self._protocol != "file":
            super()._save_to_fs(full_key_path, plot)
            return
        buffer = io.BytesIO()
        plot.savefig(buffer, **self._save_args)
        with _open_whole(full_key_path, self._fs_open_args_save) as handle:
            handle.write(buffer.getvalue())
