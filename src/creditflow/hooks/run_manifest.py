"""RunManifestHook and its helpers: a JSON manifest per run (git state, package versions, device,
seeds, parameters, the datasets read and written)."""

from __future__ import annotations

import json
import logging
import platform
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kedro.framework.hooks import hook_impl
from kedro.io import AbstractVersionedDataset, CatalogProtocol
from kedro.io.core import VersionNotFoundError
from kedro.pipeline import Pipeline

from creditflow.errors import RunInterrupted
from creditflow.integrity import (
    combined_digest,
    file_digests,
    local_path,
    record_version,
    verify_version,
    version_folder,
)
from creditflow.io_atomic import atomic_write_text
from creditflow.redaction import redact, scrub

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

MANIFEST_DIR = "data/08_reporting/run_manifests"
# Distributions whose versions every manifest records (None when one is not installed).
MANIFEST_PACKAGES = (
    "creditflow",
    "torch",
    "transformers",
    "accelerate",
    "kedro",
    "kedro-datasets",
    "numpy",
    "pandas",
)


def git_state(path: str | Path) -> dict[str, Any]:
    """Commit checked out at ``path`` and whether the work tree differs from it.

    ``dirty`` counts untracked files that git does not ignore too: new source files change what
    runs. Both are None outside a git work tree or where git is not installed.
    """

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(path), *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain"))
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def package_versions() -> dict[str, str | None]:
    """Python's version and those of :data:`MANIFEST_PACKAGES`."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in MANIFEST_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_info() -> dict[str, Any]:
    """The accelerator a run sees: ``{"type": "cpu"}`` or CUDA's device names."""
    import torch  # noqa: PLC0415 - read once per run; kedro commands without runs skip it

    if not torch.cuda.is_available():
        return {"type": "cpu"}
    names = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    return {"type": "cuda", "names": names, "cuda_version": torch.version.cuda}


def find_seeds(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every parameter named ``seed`` or ``*_seed``, keyed by its dotted path.

    >>> find_seeds({"train": {"seed": 1, "sampler": {"data_seed": 2}}, "seeds": [3]})
    {'train.seed': 1, 'train.sampler.data_seed': 2}
    """
    seeds: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            seeds |= find_seeds(value, f"{name}.")
        elif key == "seed" or str(key).endswith("_seed"):
            seeds[name] = value
    return seeds


def pipeline_parameters(pipeline: Pipeline, catalog: CatalogProtocol) -> dict[str, Any]:
    """The parameters the pipeline's nodes take, as the catalog holds them (overrides applied).

    Keyed by name without the ``params:`` prefix (``params:train.lr`` -> ``train.lr``); a node
    taking ``parameters`` (all of them) makes this the whole parameter tree.
    """
    inputs = pipeline.inputs()
    if "parameters" in inputs:
        return dict(catalog.load("parameters"))
    names = sorted(name for name in inputs if name.startswith("params:"))
    return {name.removeprefix("params:"): catalog.load(name) for name in names}


def _dataset_record(catalog: CatalogProtocol, name: str, operation: str) -> dict[str, Any]:
    """Type and resolved version of dataset ``name`` right after a load or save."""
    dataset = catalog.get(name)
    version = None
    if isinstance(dataset, AbstractVersionedDataset):
        # Right after the operation both resolve from the dataset's cache: the pinned or
        # latest version that was just read, or the session's save version.
        if operation == "load":
            version = dataset.resolve_load_version()
        else:
            version = dataset.resolve_save_version()
    return {"type": type(dataset).__name__ if dataset is not None else None, "version": version}


def _content_record(
    catalog: CatalogProtocol,
    name: str,
    version: str | None,
    digest: str | None,
    saved: bool = False,
) -> dict[str, Any]:
    """``path`` and ``sha256`` of a local file dataset's content (``{}`` for others): a version
    just saved gets its ``<version>.sha256`` (``creditflow.integrity``); an unversioned file its
    digest as it is now."""
    dataset = catalog.get(name)
    folder = version_folder(dataset, version)
    if folder is not None:
        if not folder.is_dir():
            return {}
        if saved:
            digest = record_version(folder)
        return {"path": str(folder), "sha256": digest}
    path = local_path(dataset)
    if path is None or not path.exists():
        return {}
    return {"path": str(path), "sha256": combined_digest(file_digests(path))}


def _now() -> datetime:
    return datetime.now(UTC)


class RunManifestHook:
    """Writes ``<manifest_dir>/<run_id>.json`` when a run completes or fails.

    Args:
        manifest_dir: folder of the manifests; a relative one is taken from the project root.

    The manifest holds: ``run_id``, ``status`` ("completed", "failed" or "interrupted": stopped
    by SIGTERM, ``hooks.termination.SigtermHook``) and ``error``,
    ``started_at`` / ``finished_at`` / ``duration_s`` (UTC), ``run_params`` (Kedro's, with the
    runtime parameter overrides), ``git``, ``packages``, ``device``, ``parameters`` (those the
    pipeline's nodes take), ``seeds`` found in them, the session's ``save_version`` and
    ``datasets.loaded`` / ``datasets.saved``: dataset name -> type and resolved version (None
    for unversioned datasets). Parameter datasets appear under ``parameters`` only.

    Secret-named values (``api_key``, ``token`` ...; :func:`creditflow.redaction.redact`) in
    ``run_params`` and ``parameters`` read ``[REDACTED]``, and ``error`` is scrubbed.
    """

    def __init__(self, manifest_dir: str | Path = MANIFEST_DIR) -> None:
        self.manifest_dir = Path(manifest_dir)
        self._save_version: str | None = None
        self._catalog: CatalogProtocol | None = None
        self._started_at: datetime | None = None
        self._loaded: dict[str, dict[str, Any]] = {}
        self._saved: dict[str, dict[str, Any]] = {}
        self._digests: dict[str, str] = {}  # verified before a load

    @hook_impl
    def after_catalog_created(self, catalog: CatalogProtocol, save_version: str) -> None:
        self._catalog = catalog
        self._save_version = save_version

    @hook_impl
    def before_pipeline_run(self, pipeline: Pipeline, catalog: CatalogProtocol) -> None:
        # Hook instances live as long as the process (settings.HOOKS): reset per run.
        self._catalog = catalog
        self._started_at = _now()
        self._loaded, self._saved, self._digests = {}, {}, {}

    @hook_impl
    def before_dataset_loaded(self, dataset_name: str) -> None:
        # A damaged version fails here, naming itself, before a node trains on it.
        if self._catalog is None or is_parameter_dataset(dataset_name):
            return
        dataset = self._catalog.get(dataset_name)
        if isinstance(dataset, AbstractVersionedDataset):
            try:
                version = dataset.resolve_load_version()
            except VersionNotFoundError:
                return  # the load itself says so
            folder = version_folder(dataset, version)
            if folder is not None and folder.is_dir():
                self._digests[dataset_name] = verify_version(folder, dataset_name)

    @hook_impl
    def after_dataset_loaded(self, dataset_name: str) -> None:
        if self._catalog is not None and not is_parameter_dataset(dataset_name):
            record = _dataset_record(self._catalog, dataset_name, "load")
            self._loaded[dataset_name] = record | _content_record(
                self._catalog, dataset_name, record["version"], self._digests.get(dataset_name)
            )

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:
        if self._catalog is not None:
            record = _dataset_record(self._catalog, dataset_name, "save")
            self._saved[dataset_name] = record | _content_record(
                self._catalog, dataset_name, record["version"], None, saved=True
            )

    @hook_impl
    def after_pipeline_run(
        self, run_params: dict[str, Any], pipeline: Pipeline, catalog: CatalogProtocol
    ) -> None:
        saved = list(self._saved)
        self.write_manifest(run_params, pipeline, catalog, status="completed")
        reports = report_paths(catalog, saved, Path(run_params.get("project_path") or Path.cwd()))
        if reports:
            # The run's last line: where a person looks next.
            logger.info("Results of this run: %s", ", ".join(str(p) for p in reports))

    @hook_impl
    def on_pipeline_error(
        self,
        error: Exception,
        run_params: dict[str, Any],
        pipeline: Pipeline,
        catalog: CatalogProtocol,
    ) -> None:
        status = "interrupted" if isinstance(error, RunInterrupted) else "failed"
        # Kedro re-raises the pipeline's error after this hook: a manifest that cannot be
        # written (the same full disk, often) is logged, so that error is the one shown.
        try:
            self.write_manifest(run_params, pipeline, catalog, status=status, error=error)
        except Exception:
            logger.exception("The run manifest (%s) could not be written", status)

    def write_manifest(
        self,
        run_params: Mapping[str, Any],
        pipeline: Pipeline,
        catalog: CatalogProtocol,
        status: str,
        error: BaseException | None = None,
    ) -> Path:
        """Write this run's manifest and return its path."""
        finished_at = _now()
        started_at = self._started_at or finished_at
        run_id = run_params.get("run_id") or self._save_version or finished_at.isoformat()
        project_path = Path(run_params.get("project_path") or Path.cwd())
        parameters = redact(pipeline_parameters(pipeline, catalog))
        manifest = {
            "run_id": run_id,
            "status": status,
            "error": None if error is None else scrub(f"{type(error).__name__}: {error}"),
            "started_at": started_at.isoformat(),
            "finished_at": finished_at.isoformat(),
            "duration_s": round((finished_at - started_at).total_seconds(), 3),
            "run_params": redact(run_params),
            "git": git_state(project_path),
            "packages": package_versions(),
            "device": device_info(),
            "parameters": parameters,
            "seeds": find_seeds(parameters),
            "save_version": self._save_version,
            "datasets": {"loaded": self._loaded, "saved": self._saved},
        }
        path = project_path / self.manifest_dir / f"{run_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        # default=str: runtime parameters from the CLI may hold dates or paths. Whole or not at
        # all: a full disk leaves no empty manifest.
        atomic_write_text(path, json.dumps(manifest, indent=2, default=str) + "\n")
        logger.info("Run manifest (%s) written to %s", status, path)
        self._started_at = None
        return path


REPORTS_DIR = "data/08_reporting"


def report_paths(catalog: CatalogProtocol, names: list[str], project: Path) -> list[Path]:
    """The files of the datasets ``names`` (saved by the run) that are reports: those under
    ``data/08_reporting`` (the manifests aside), versioned ones at the version just saved,
    relative to ``project`` where they lie inside it."""
    reports = (project / REPORTS_DIR).resolve()
    found = []
    for name in names:
        dataset = catalog.get(name) if name in catalog else None
        path = local_path(dataset)
        if path is None:
            continue
        path = (path if path.is_absolute() else project / path).resolve()
        if not path.is_relative_to(reports) or "run_manifests" in path.parts:
            continue
        if isinstance(dataset, AbstractVersionedDataset) and dataset._version:
            path = path / dataset.resolve_save_version() / path.name  # Kedro's versioned layout
        found.append(path.relative_to(project.resolve()))
    return found


def is_parameter_dataset(dataset_name: str) -> bool:
    return dataset_name == "parameters" or dataset_name.startswith("params:")
