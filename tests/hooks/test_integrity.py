"""A bit flipped in a saved dataset version is an error naming the dataset and the version
when it is loaded, and `creditflow verify <manifest>` finds it afterwards."""

import json
from pathlib import Path

import pandas as pd
import pytest
from kedro.io import DataCatalog, Version
from kedro.pipeline import Pipeline
from kedro_datasets.pandas import ParquetDataset

from creditflow.__main__ import main
from creditflow.hooks.run_manifest import RunManifestHook
from creditflow.integrity import DataIntegrityError, digest_path, run_versions, verify_manifest

VERSION = "2026-01-01T00.00.00.000Z"


def _catalog(tmp_path: Path, load: str | None = None) -> DataCatalog:
    path = tmp_path / "data/03_primary/problems.parquet"
    return DataCatalog(
        {"problems": ParquetDataset(filepath=str(path), version=Version(load, VERSION))}
    )


def _saved_run(tmp_path: Path) -> tuple[RunManifestHook, Path]:
    hook = RunManifestHook(manifest_dir=tmp_path / "manifests")
    catalog = _catalog(tmp_path)
    hook.after_catalog_created(catalog, VERSION)
    hook.before_pipeline_run(Pipeline([]), catalog)
    frame = pd.DataFrame({"question": [f"Ihre Frage {i}" for i in range(200)]})
    catalog.save("problems", frame)
    hook.after_dataset_saved("problems")
    run = {"run_id": "r1", "project_path": str(tmp_path)}
    return hook, hook.write_manifest(run, Pipeline([]), catalog, status="completed")


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_bit_fails_the_load_naming_dataset_and_version(tmp_path):
    hook, manifest = _saved_run(tmp_path)
    folder = tmp_path / "data/03_primary/problems.parquet" / VERSION
    assert digest_path(folder).is_file() and sorted(p.name for p in folder.iterdir()) == [
        "problems.parquet"
    ]  # the version folder holds what Kedro wrote, the digests sit beside it
    record = json.loads(manifest.read_text())["datasets"]["saved"]["problems"]
    assert record["version"] == VERSION and len(record["sha256"]) == 64
    catalog = _catalog(tmp_path, load=VERSION)
    hook.before_pipeline_run(Pipeline([]), catalog)
    hook.before_dataset_loaded("problems")  # intact: loads
    _flip_a_bit(folder / "problems.parquet")
    with pytest.raises(
        DataIntegrityError, match=rf"`problems` version {VERSION}: problems.parquet"
    ):
        hook.before_dataset_loaded("problems")


def test_verify_checks_a_manifests_versions(tmp_path, capsys):
    _, manifest = _saved_run(tmp_path)
    lines = verify_manifest(json.loads(manifest.read_text()))
    assert lines == [f"saved problems @ {VERSION}: ok"]
    _flip_a_bit(tmp_path / "data/03_primary/problems.parquet" / VERSION / "problems.parquet")
    (line,) = verify_manifest(json.loads(manifest.read_text()))
    assert line.startswith(f"saved problems @ {VERSION}: DAMAGED")
    with pytest.raises(SystemExit) as exit_:
        main(["verify", str(manifest)])
    assert exit_.value.code == 1
    assert "DAMAGED" in capsys.readouterr().out


def test_run_versions_are_the_versions_one_run_read_and_wrote():
    manifest = {
        "datasets": {
            "loaded": {
                "tapo_tokenizer": {"version": "2026-01-01T00.00.00.000Z"},
                "tapo_train_tasks": {"version": "2026-01-01T00.00.00.000Z"},
                "tapo_source_problems": {"type": "MemoryDataset", "version": None},
            },
            "saved": {
                "tapo_train_tasks": {"version": "2026-01-02T00.00.00.000Z"},
                "tapo_policies_tapo": {"version": "2026-01-02T00.00.00.000Z"},
            },
        }
    }
    assert run_versions(manifest) == {
        "tapo_tokenizer": "2026-01-01T00.00.00.000Z",  # read: trained by an earlier run
        "tapo_train_tasks": "2026-01-02T00.00.00.000Z",  # written by this run
        "tapo_policies_tapo": "2026-01-02T00.00.00.000Z",
    }
