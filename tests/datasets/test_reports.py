"""The report datasets (creditflow.datasets.reports): kedro-datasets' text, CSV, Parquet and matplotlib
datasets whose saves are whole or nothing. A full disk halfway through a new version's write
leaves the previous version the newest, whole, and no partial file or empty version folder."""

from __future__ import annotations

import errno
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from kedro.config import OmegaConfigLoader  # noqa: E402
from kedro.io import DataCatalog, DatasetError, Version  # noqa: E402

from creditflow.datasets import (  # noqa: E402
    AtomicCSVDataset,
    AtomicMatplotlibDataset,
    AtomicParquetDataset,
    AtomicTextDataset,
)
from tests.full_disk import fill_disk_halfway  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

OLD, NEW = "2026-01-01T00.00.00.000Z", "2026-02-01T00.00.00.000Z"


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _figure(title: str):
    figure, axes = plt.subplots(figsize=(2, 2))
    axes.set_title(title)
    return figure


CASES = {
    "html": (
        AtomicTextDataset,
        "tapo_token_credit.html",
        {},
        lambda: "<html>" + "credit " * 2000 + "</html>",
    ),
    "csv": (
        AtomicCSVDataset,
        "tapo_comparison.csv",
        {},
        lambda: pd.DataFrame({"policy": ["grpo", "tapo"] * 500, "accuracy": [0.25, 0.5] * 500}),
    ),
    "parquet": (
        AtomicParquetDataset,
        "tapo_tapo_metrics.parquet",
        {},
        lambda: pd.DataFrame({"step": range(2000), "reward/total": [0.5] * 2000}),
    ),
    "png": (
        AtomicMatplotlibDataset,
        "tapo_reward_curves.png",
        {"save_args": {"dpi": 50}},
        lambda: _figure("r"),
    ),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_save_round_trips_like_the_kedro_dataset(tmp_path: Path, kind: str) -> None:
    cls, name, options, make = CASES[kind]
    dataset = cls(filepath=str(tmp_path / name), **options)
    dataset.save(make())
    assert _files(tmp_path) == [name]
    if kind == "html":
        assert dataset.load() == make()
    elif kind in ("csv", "parquet"):
        pd.testing.assert_frame_equal(dataset.load(), make())
    else:
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_full_disk_keeps_the_previous_version_newest_and_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    cls, name, options, make = CASES[kind]
    path = str(tmp_path / name)

    def versioned(save: str | None) -> object:
        return cls(filepath=path, version=Version(None, save), **options)

    versioned(OLD).save(make())
    old_bytes = (tmp_path / name / OLD / name).read_bytes()
    opened = fill_disk_halfway(monkeypatch)
    with pytest.raises(DatasetError) as error:
        versioned(NEW).save(make())
    assert isinstance(error.value.__cause__, OSError)
    assert error.value.__cause__.errno == errno.ENOSPC
    assert opened, "the save went around creditflow.io_atomic"
    monkeypatch.undo()
    # No half-written file, no empty NEW folder: the newest version is still OLD, whole.
    assert _files(tmp_path) == [name, f"{name}/{OLD}", f"{name}/{OLD}/{name}"]
    assert (tmp_path / name / OLD / name).read_bytes() == old_bytes
    assert versioned(None).resolve_load_version() == OLD


def test_the_catalog_writes_every_report_through_the_atomic_datasets(project_root: Path) -> None:
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    types = {entry["type"] for entry in loader["catalog"].values()}
    assert not types & {"text.TextDataset", "pandas.CSVDataset", "matplotlib.MatplotlibDataset"}
    reporting = {  # the Parquet tables among the reports (metrics, credit-inspector rows)
        name: entry["type"]
        for name, entry in loader["catalog"].items()
        if str(entry.get("filepath", "")).startswith("data/08_reporting")
        and entry["type"].endswith("ParquetDataset")
    }
    assert reporting and set(reporting.values()) == {"creditflow.datasets.AtomicParquetDataset"}
    catalog = DataCatalog.from_config(loader["catalog"])
    assert isinstance(catalog.get("tapo_token_credit_html"), AtomicTextDataset)
    assert isinstance(catalog.get("tapo_comparison"), AtomicCSVDataset)
    assert isinstance(catalog.get("tapo_reward_curves"), AtomicMatplotlibDataset)
