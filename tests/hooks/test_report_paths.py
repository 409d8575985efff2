"""A run's last log line names the reports it wrote, at the version it wrote them."""

from pathlib import Path

import pandas as pd
from kedro.io import DataCatalog, MemoryDataset, Version
from kedro_datasets.pandas import CSVDataset

from creditflow.hooks.run_manifest import report_paths


def test_the_saved_reports_are_named_at_their_saved_version(tmp_path: Path):
    reports = tmp_path / "data/08_reporting"
    catalog = DataCatalog(
        {
            "table": CSVDataset(
                filepath=str(reports / "table.csv"),
                version=Version(None, "2026-01-01T00.00.00.000Z"),
            ),
            "plain": CSVDataset(filepath=str(reports / "plain.csv")),
            "model_input": CSVDataset(filepath=str(tmp_path / "data/05_model_input/x.csv")),
            "in_memory": MemoryDataset(),
        }
    )
    for name in ("table", "plain", "model_input"):
        catalog.save(name, pd.DataFrame({"a": [1]}))
    found = report_paths(catalog, ["table", "plain", "model_input", "in_memory", "gone"], tmp_path)
    assert found == [
        Path("data/08_reporting/table.csv/2026-01-01T00.00.00.000Z/table.csv"),
        Path("data/08_reporting/plain.csv"),
    ]
    assert all((tmp_path / p).is_file() for p in found)
