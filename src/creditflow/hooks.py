"""Project hooks for reproducible runs (registered in ``settings.py``; docs/reproducibility.md).

- :class:`RunManifestHook` writes one JSON manifest per ``kedro run``: git state, parameters,
  package versions, dataset versions, seeds, device and timing.
- :class:`MlflowTrackingHook` logs each run to MLflow: the parameters once, every ``*_metrics``
  table per step and every ``*_plot`` / ``*_curves`` figure as a PNG artifact.
- :class:`CredentialsHook` hands the Kedro credentials to the nodes that need them, as the
  ``credentials`` dataset.
- :class:`ParameterCheckHook` checks every parameter group the run reads (and the tapo / tor
  comparisons' strategy lists) before the first node.

Neither a manifest nor MLflow ever holds a secret: parameters (and run_params, whose
``runtime_params`` are the ``--params`` overrides) pass through
:func:`creditflow.redaction.redact` first.

Both record datasets through the dataset hooks, which Kedro calls in the process that loads or
saves: under ``ParallelRunner`` the per-dataset records stay in the worker processes, so the
manifest lists no dataset versions and MLflow gets no metrics; use the sequential or thread
runner for tracked runs.
"""

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
from kedro.io import AbstractVersionedDataset, CatalogProtocol, MemoryDataset
from kedro.pipeline import Pipeline

from creditflow.redaction import redact, scrub

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

logger = logging.getLogger(__name__)

MANIFEST_DIR = "data/08_reporting/run_manifests"
CREDENTIALS_DATASET = "credentials"
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


def _now() -> datetime:
    return datetime.now(UTC)


class ParameterCheckHook:
    """Fails a run before its first node when its parameters cannot work: every parameter
    group the run's nodes take is checked against its schema
    (:mod:`creditflow.pipelines.parameters`: unknown keys at any depth with a "did you mean",
    wrong types naming the key, ranges and cross-field rules), then the tapo / tor
    comparisons build the config of every strategy the run trains and check that no strategy
    of the parameters was left out of the pipeline (the strategy list is fixed when the
    pipeline is built, so one added with ``--params`` or ``--env`` would train nothing).

    All problems of all groups come in one ConfigError, in seconds, before anything trains.
    """

    @hook_impl
    def before_pipeline_run(self, pipeline: Pipeline, catalog: CatalogProtocol) -> None:
        # Imported here: settings.py imports this module for every kedro command (kedro
        # --help, kedro viz), and the checks pull in the training engine (torch,
        # transformers: ~3 s); by the time a run starts its pipelines have imported it.
        from creditflow.pipelines.comparison import check_strategies  # noqa: PLC0415
        from creditflow.pipelines.parameters import check_parameters  # noqa: PLC0415

        def group_params(group: str) -> Mapping[str, Any] | None:
            name = f"params:{group}"
            return catalog.load(name) if name in catalog else None

        check_parameters(_parameter_groups(pipeline, catalog))
        check_strategies(pipeline, group_params)


def _parameter_groups(pipeline: Pipeline, catalog: CatalogProtocol) -> dict[str, Any]:
    """The top-level parameter groups the pipeline's nodes read (``params:tapo`` and
    ``params:tapo.strategies.tapo`` both read ``tapo``; ``parameters`` reads all), as the
    catalog holds them (overrides applied)."""
    inputs = pipeline.inputs()
    if "parameters" in inputs and "parameters" in catalog:
        return dict(catalog.load("parameters"))
    groups = {name.removeprefix("params:").split(".")[0] for name in inputs if _is_parameter(name)}
    return {
        group: catalog.load(f"params:{group}")
        for group in sorted(groups)
        if f"params:{group}" in catalog
    }


class CredentialsHook:
    """Puts the Kedro credentials in the catalog as the ``credentials`` dataset.

    Kedro hands credentials to datasets only (a catalog entry's ``credentials: <name>``); a
    node that talks to a service itself (the ``openai`` annotator) takes this dataset as an
    input instead and picks the entry its options name. The values are whatever the config
    loader read from ``conf/base`` and ``conf/<env>`` (``credentials*.yml``, ``${oc.env:...}``
    resolved), held in memory only: the dataset is a MemoryDataset, so manifests record its
    type, never its data.
    """

    @hook_impl
    def after_catalog_created(self, catalog: CatalogProtocol, conf_creds: dict[str, Any]) -> None:
        catalog[CREDENTIALS_DATASET] = MemoryDataset(dict(conf_creds))


class RunManifestHook:
    """Writes ``<manifest_dir>/<run_id>.json`` when a run completes or fails.

    Args:
        manifest_dir: folder of the manifests; a relative one is taken from the project root.

    The manifest holds: ``run_id``, ``status`` ("completed" or "failed") and ``error``,
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

    @hook_impl
    def after_catalog_created(self, catalog: CatalogProtocol, save_version: str) -> None:
        self._catalog = catalog
        self._save_version = save_version

    @hook_impl
    def before_pipeline_run(self, pipeline: Pipeline, catalog: CatalogProtocol) -> None:
        # Hook instances live as long as the process (settings.HOOKS): reset per run.
        self._catalog = catalog
        self._started_at = _now()
        self._loaded, self._saved = {}, {}

    @hook_impl
    def after_dataset_loaded(self, dataset_name: str) -> None:
        if self._catalog is not None and not _is_parameter(dataset_name):
            self._loaded[dataset_name] = _dataset_record(self._catalog, dataset_name, "load")

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:
        if self._catalog is not None:
            self._saved[dataset_name] = _dataset_record(self._catalog, dataset_name, "save")

    @hook_impl
    def after_pipeline_run(
        self, run_params: dict[str, Any], pipeline: Pipeline, catalog: CatalogProtocol
    ) -> None:
        self.write_manifest(run_params, pipeline, catalog, status="completed")

    @hook_impl
    def on_pipeline_error(
        self,
        error: Exception,
        run_params: dict[str, Any],
        pipeline: Pipeline,
        catalog: CatalogProtocol,
    ) -> None:
        self.write_manifest(run_params, pipeline, catalog, status="failed", error=error)

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
        # default=str: runtime parameters from the CLI may hold dates or paths.
        path.write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
        logger.info("Run manifest (%s) written to %s", status, path)
        self._started_at = None
        return path


def _is_parameter(dataset_name: str) -> bool:
    return dataset_name == "parameters" or dataset_name.startswith("params:")


class MlflowTrackingHook:
    """Logs each ``kedro run`` as one MLflow run, configured by ``params:tracking``.

    At the start: the run (named after Kedro's run id, tagged with the pipeline names, env and
    git commit) and the flattened parameters of the pipeline's nodes. After each save: a
    ``*_metrics`` dataset per step, a ``*_plot`` / ``*_curves`` dataset as PNG artifacts (see
    :mod:`creditflow.tracking`). At the end: status FINISHED or FAILED.

    With no ``tracking`` parameter group, or ``tracking.enabled: false``, it does nothing.
    """

    def __init__(self) -> None:
        self._client: MlflowClient | None = None
        self._run_id: str | None = None

    @property
    def run_id(self) -> str | None:
        """The MLflow run id of the run in progress (None when not tracking)."""
        return self._run_id

    @hook_impl
    def before_pipeline_run(
        self, run_params: dict[str, Any], pipeline: Pipeline, catalog: CatalogProtocol
    ) -> None:
        self._client, self._run_id = None, None
        all_params = catalog.load("parameters") if "parameters" in catalog else {}
        if "tracking" not in all_params:
            logger.info("MLflow tracking off: no 'tracking' parameter group")
            return
        # MLflow takes about a second to import: only tracked runs pay for it, not every
        # `kedro` command that loads settings.py.
        from creditflow import tracking  # noqa: PLC0415

        config = tracking.TrackingConfig.from_params(all_params["tracking"])
        if not config.enabled:
            logger.info("MLflow tracking off: tracking.enabled is false")
            return
        project_path = run_params.get("project_path") or Path.cwd()
        client = tracking.make_client(config.resolved_uri(project_path))
        experiment = client.get_experiment_by_name(config.experiment_name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else client.create_experiment(config.experiment_name)
        )
        git = git_state(project_path)
        tags = {
            "kedro.run_id": str(run_params.get("run_id")),
            "kedro.pipelines": ",".join(run_params.get("pipeline_names") or ["__default__"]),
            "kedro.env": str(run_params.get("env")),
            "git.commit": str(git["commit"]),
            "git.dirty": str(git["dirty"]),
        }
        run = client.create_run(experiment_id, run_name=run_params.get("run_id"), tags=tags)
        self._client, self._run_id = client, run.info.run_id
        parameters = pipeline_parameters(pipeline, catalog)
        parameters.pop("tracking", None)
        tracking.log_params(client, self._run_id, parameters)
        logger.info("MLflow run %s in %s", self._run_id, client.tracking_uri)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data: Any) -> None:
        if self._client is None or self._run_id is None:
            return
        from creditflow import tracking  # noqa: PLC0415 - imported by before_pipeline_run

        if dataset_name.endswith(tracking.METRICS_SUFFIX):
            tracking.log_metrics(self._client, self._run_id, dataset_name, data)
        elif dataset_name.endswith(tracking.PLOT_SUFFIXES):
            tracking.log_plots(self._client, self._run_id, dataset_name, data)

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._end_run("FINISHED")

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._end_run("FAILED")

    def _end_run(self, status: str) -> None:
        if self._client is not None and self._run_id is not None:
            self._client.set_terminated(self._run_id, status)
        self._client, self._run_id = None, None
