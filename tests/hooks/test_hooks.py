"""RunManifestHook: manifests of tiny versioned runs, through Kedro's hook manager and runner,
and of a real ``KedroSession`` run of the project (conf copied into tmp_path)."""

import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import torch
from kedro.framework.hooks.manager import _create_hook_manager
from kedro.framework.session import KedroSession
from kedro.io import DataCatalog
from kedro.pipeline import Node, Pipeline
from kedro.runner import SequentialRunner
from mlflow.tracking import MlflowClient

from creditflow.hooks.credentials import CREDENTIALS_DATASET, CredentialsHook
from creditflow.hooks.mlflow_tracking import MlflowTrackingHook
from creditflow.hooks.run_manifest import (
    MANIFEST_DIR,
    RunManifestHook,
    find_seeds,
    git_state,
    package_versions,
)
from tests.kedro_project import copy_project

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

SAVE_VERSION = "2026-01-02T03.04.05.678Z"
OLD, NEW = "2025-01-01T00.00.00.000Z", "2025-06-01T00.00.00.000Z"
PARAMETERS = {
    "tiny": {"scale": 3, "seed": 7, "sampler": {"data_seed": 11}},
    # Not an input of the tiny pipeline: neither it nor its seed belongs in the manifest.
    "unused": {"seed": 99},
}


def run_like_session(
    hooks: list[Any],
    pipeline: Pipeline,
    catalog: DataCatalog,
    parameters: dict[str, Any],
    project_path: Path,
    run_id: str = SAVE_VERSION,
) -> None:
    """Call the hooks in the order ``KedroSession.run`` does (kedro/framework/session/session.py).

    The hook manager checks each hook implementation's argument names against Kedro's specs.
    """
    manager = _create_hook_manager()
    for hook in hooks:
        manager.register(hook)
    catalog["parameters"] = parameters
    for name, value in parameters.items():
        catalog[f"params:{name}"] = value
    manager.hook.after_catalog_created(
        catalog=catalog,
        conf_catalog={},
        conf_creds={},
        parameters=parameters,
        save_version=run_id,
        load_versions={},
    )
    run_params = {"run_id": run_id, "project_path": project_path.as_posix(), "env": "local"}
    manager.hook.before_pipeline_run(run_params=run_params, pipeline=pipeline, catalog=catalog)
    try:
        result = SequentialRunner().run(pipeline, catalog, manager, run_id=run_id)
    except Exception as error:
        manager.hook.on_pipeline_error(
            error=error, run_params=run_params, pipeline=pipeline, catalog=catalog
        )
        raise
    manager.hook.after_pipeline_run(
        run_params=run_params, run_result=result, pipeline=pipeline, catalog=catalog
    )


def scale_table(table: pd.DataFrame, lookup: pd.DataFrame, params: dict) -> pd.DataFrame:
    return table.assign(x=table["x"] * params["scale"] + lookup["offset"].sum())


def summarise(table: pd.DataFrame) -> float:
    return float(table["x"].sum())


def explode(table: pd.DataFrame) -> float:
    raise RuntimeError(f"boom after reading {len(table)} rows")


TINY = Pipeline(
    [
        Node(scale_table, ["raw_table", "lookup_table", "params:tiny"], "scaled_table"),
        Node(summarise, "scaled_table", "summary"),
    ]
)


def _write_version(root: Path, name: str, version: str, frame: pd.DataFrame) -> None:
    path = root / f"{name}.csv" / version / f"{name}.csv"
    path.parent.mkdir(parents=True)
    frame.to_csv(path, index=False)


def _catalog(data: Path, load_versions: dict[str, str]) -> DataCatalog:
    config = {
        name: {
            "type": "pandas.CSVDataset",
            "filepath": str(data / f"{name}.csv"),
            "versioned": True,
        }
        for name in ("raw_table", "lookup_table", "scaled_table")
    }
    return DataCatalog.from_config(config, load_versions=load_versions, save_version=SAVE_VERSION)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A clean git work tree (manifests under data/ are git-ignored, as in the real repo)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / ".gitignore").write_text("data/\n")
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    return project


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """Two versions of each input table; the newer raw_table would give other outputs."""
    data = tmp_path / "data"
    _write_version(data, "raw_table", OLD, pd.DataFrame({"x": [1, 2]}))
    _write_version(data, "raw_table", NEW, pd.DataFrame({"x": [100, 200]}))
    _write_version(data, "lookup_table", OLD, pd.DataFrame({"offset": [1000]}))
    _write_version(data, "lookup_table", NEW, pd.DataFrame({"offset": [1, -1]}))
    return data


def _manifest(project: Path, run_id: str = SAVE_VERSION) -> dict[str, Any]:
    return json.loads((project / MANIFEST_DIR / f"{run_id}.json").read_text())


def test_manifest_of_a_versioned_run(project: Path, data: Path) -> None:
    catalog = _catalog(data, load_versions={"raw_table": OLD})
    run_like_session([RunManifestHook()], TINY, catalog, PARAMETERS, project)

    # raw_table pinned to OLD: x = [1, 2] * 3 + (1 - 1) (lookup_table unpinned -> NEW).
    scaled = catalog.load("scaled_table")
    assert scaled["x"].tolist() == [3, 6]
    manifest = _manifest(project)
    assert manifest["run_id"] == SAVE_VERSION == manifest["save_version"]
    assert manifest["status"] == "completed" and manifest["error"] is None
    csv = "CSVDataset"
    # Each local file's content digest is recorded too (creditflow.integrity).
    for records in manifest["datasets"].values():
        for name, record in records.items():
            assert name == "summary" or len(record.pop("sha256")) == 64 and record.pop("path")
    assert manifest["datasets"] == {
        "loaded": {
            "raw_table": {"type": csv, "version": OLD},
            "lookup_table": {"type": csv, "version": NEW},
            "scaled_table": {"type": csv, "version": SAVE_VERSION},
        },
        "saved": {
            "scaled_table": {"type": csv, "version": SAVE_VERSION},
            "summary": {"type": "MemoryDataset", "version": None},
        },
    }
    assert manifest["parameters"] == {"tiny": PARAMETERS["tiny"]}
    assert manifest["seeds"] == {"tiny.seed": 7, "tiny.sampler.data_seed": 11}
    head = subprocess.run(
        ["git", "-C", str(project), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert manifest["git"] == {"commit": head, "dirty": False}
    packages = manifest["packages"]
    assert packages["python"] == platform.python_version()
    assert packages["kedro"] == metadata.version("kedro")
    assert packages["torch"] == torch.__version__
    assert set(packages) >= {"transformers", "kedro-datasets", "accelerate", "numpy", "pandas"}
    assert manifest["device"]["type"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert manifest["started_at"] <= manifest["finished_at"]
    assert manifest["run_params"]["project_path"] == project.as_posix()


def test_failed_run_gets_a_manifest_and_a_reused_hook_starts_afresh(
    project: Path, data: Path
) -> None:
    hook = RunManifestHook()
    run_like_session([hook], TINY, _catalog(data, {}), PARAMETERS, project)
    failing = Pipeline([Node(explode, "raw_table", "never_saved")])
    with pytest.raises(RuntimeError, match="boom after reading 2 rows"):
        run_like_session([hook], failing, _catalog(data, {}), PARAMETERS, project, run_id="r2")

    manifest = _manifest(project, "r2")
    manifest["datasets"]["loaded"]["raw_table"].pop("sha256")
    manifest["datasets"]["loaded"]["raw_table"].pop("path")
    assert manifest["status"] == "failed"
    assert manifest["error"] == "RuntimeError: boom after reading 2 rows"
    # Only what the second run touched: the first run's loads and saves are not carried over.
    assert manifest["datasets"] == {
        "loaded": {"raw_table": {"type": "CSVDataset", "version": NEW}},
        "saved": {},
    }
    assert manifest["parameters"] == {} and manifest["seeds"] == {}
    assert _manifest(project)["status"] == "completed"


def test_git_state_clean_dirty_and_absent(project: Path, tmp_path: Path, monkeypatch) -> None:
    assert git_state(project)["dirty"] is False
    (project / "new_module.py").write_text("")  # untracked, not ignored: code that may run
    state = git_state(project)
    assert state["dirty"] is True and len(state["commit"]) == 40
    outside = tmp_path / "not_a_repo"
    outside.mkdir()
    assert git_state(outside) == {"commit": None, "dirty": None}
    monkeypatch.setenv("PATH", "")  # no git executable at all
    assert git_state(project) == {"commit": None, "dirty": None}


def test_find_seeds_walks_mappings_only() -> None:
    params = {
        "seed": 0,
        "train": {"seed": 1, "lr": 0.1, "rollout": {"sampling_seed": 2, "seeds": [3, 4]}},
        "eval": {"seeded": True, "reseed": 5},
    }
    # "seeds" and "seeded" are not seed names; "reseed" does not end in "_seed".
    assert find_seeds(params) == {"seed": 0, "train.seed": 1, "train.rollout.sampling_seed": 2}


def test_package_versions_report_missing_distributions(monkeypatch) -> None:
    monkeypatch.setattr(
        "creditflow.hooks.run_manifest.MANIFEST_PACKAGES", ("numpy", "no-such-dist-xyz")
    )
    assert package_versions() == {
        "python": platform.python_version(),
        "numpy": metadata.version("numpy"),
        "no-such-dist-xyz": None,
    }


def test_session_run_of_the_project_writes_manifest_and_mlflow_run(
    project_root: Path, raw_data: Path, tmp_path: Path, monkeypatch
) -> None:
    """One data_ingest node through ``KedroSession`` with the hooks of settings.py.

    The project's conf is copied to tmp_path, so the session's project path (where relative
    catalog paths, manifests and mlruns/ resolve) is tmp_path and the repo stays untouched.
    """
    copy_project(project_root, tmp_path, monkeypatch)
    overrides = {"data_ingest": {"max_rows_per_source": 3, "raw_data_dir": str(raw_data)}}
    with KedroSession.create(project_path=tmp_path, runtime_params=overrides) as session:
        run_id = session.session_id
        session.run(pipeline_names=["data_ingest"], node_names=["ingest_mathvision_problems"])

    manifest = _manifest(tmp_path, run_id)
    assert manifest["status"] == "completed"
    assert manifest["parameters"]["data_ingest"]["max_rows_per_source"] == 3
    assert manifest["run_params"]["node_names"] == ["ingest_mathvision_problems"]
    record = manifest["datasets"]["saved"]["mathvision_problems"]
    assert {k: record[k] for k in ("type", "version")} == {
        "type": "ParquetDataset",
        "version": run_id,
    }
    assert len(record["sha256"]) == 64
    saved = tmp_path / "data/03_primary/mathvision_problems.parquet" / run_id
    assert len(pd.read_parquet(saved / "mathvision_problems.parquet")) == 3
    assert not any(run_id in str(path) for path in (project_root / "data").rglob("*"))

    # MlflowTrackingHook (kedro-mlflow, conf/base/mlflow.yml: a SQLite store under mlruns/ of
    # the working directory) filed the same run, once.
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("creditflow")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["run_id"] == run_id
    assert run.data.params["data_ingest.max_rows_per_source"] == "3"


SECRET = "sk-hooks-0123456789abcdef"


def test_manifest_redacts_secret_parameters_run_params_and_errors(
    project: Path, data: Path
) -> None:
    parameters = {
        "tiny": {**PARAMETERS["tiny"], "service": {"api_key": SECRET, "url": "http://x"}},
    }
    hook, catalog = RunManifestHook(), _catalog(data, {})
    run_like_session([hook], TINY, catalog, parameters, project)
    assert SECRET not in (project / MANIFEST_DIR / f"{SAVE_VERSION}.json").read_text()
    manifest = _manifest(project)
    assert manifest["parameters"]["tiny"]["service"] == {"api_key": "[REDACTED]", "url": "http://x"}
    assert manifest["parameters"]["tiny"]["scale"] == 3 and manifest["seeds"]["tiny.seed"] == 7

    # `kedro run --params` overrides land in run_params.runtime_params too; an error message
    # echoing a Bearer token is scrubbed.
    run_params = {
        "run_id": "r3",
        "project_path": project.as_posix(),
        "runtime_params": {"tiny": {"service": {"api_key": SECRET}}},
    }
    error = RuntimeError(f"HTTP 401: Authorization: Bearer {SECRET}")
    hook.write_manifest(run_params, TINY, catalog, status="failed", error=error)
    text = (project / MANIFEST_DIR / "r3.json").read_text()
    assert SECRET not in text
    manifest = json.loads(text)
    assert manifest["run_params"]["runtime_params"] == {
        "tiny": {"service": {"api_key": "[REDACTED]"}}
    }
    assert manifest["error"] == "RuntimeError: HTTP 401: Authorization: Bearer [REDACTED]"


def test_credentials_hook_puts_the_kedro_credentials_in_the_catalog() -> None:
    manager = _create_hook_manager()
    manager.register(CredentialsHook())
    catalog = DataCatalog()
    creds = {"openai_annotator": {"api_key": SECRET}}
    manager.hook.after_catalog_created(
        catalog=catalog,
        conf_catalog={},
        conf_creds=creds,
        parameters={},
        save_version=SAVE_VERSION,
        load_versions={},
    )
    assert catalog.load(CREDENTIALS_DATASET) == creds
    assert SECRET not in repr(catalog.get(CREDENTIALS_DATASET))  # logs name the type only


class BrokenKedroMlflow:
    """kedro-mlflow's hook for a pipeline it does not track, failing as it ends the run."""

    run_id = None
    mlflow_config = SimpleNamespace(server=SimpleNamespace(mlflow_tracking_uri="sqlite:///x.db"))

    def after_catalog_created(self, *args) -> None:
        pass

    def before_pipeline_run(self, *args) -> None:
        pass

    def after_pipeline_run(self, *args) -> None:
        raise RuntimeError("kedro-mlflow broke")

    def on_pipeline_error(self, *args) -> None:
        raise RuntimeError("kedro-mlflow broke")


@pytest.mark.parametrize("fails", [False, True], ids=["completed", "failed"])
def test_a_failing_tracking_hook_stops_neither_the_run_nor_the_manifest(
    project: Path, data: Path, caplog, fails: bool
) -> None:
    tracker = MlflowTrackingHook()
    tracker._mlflow = BrokenKedroMlflow()
    pipeline = Pipeline([Node(explode, "raw_table", "never_saved")]) if fails else TINY
    # In settings.HOOKS' order: pluggy calls the tracker's hooks first, the manifest's after.
    hooks = [RunManifestHook(), tracker]
    if fails:
        with pytest.raises(RuntimeError, match="boom after reading"):  # the node's error only
            run_like_session(hooks, pipeline, _catalog(data, {}), PARAMETERS, project)
    else:
        run_like_session(hooks, pipeline, _catalog(data, {}), PARAMETERS, project)
    assert _manifest(project)["status"] == ("failed" if fails else "completed")
    method = "on_pipeline_error" if fails else "after_pipeline_run"
    (record,) = [r for r in caplog.records if "MlflowTrackingHook." in r.getMessage()]
    assert record.levelname == "ERROR" and method in record.getMessage()
    assert "kedro-mlflow broke" in record.exc_text
