"""Project hooks for reproducible runs (registered in ``settings.py``; docs/reproducibility.md).

- :class:`RunManifestHook` writes one JSON manifest per ``kedro run``: git state, parameters,
  package versions, dataset versions, seeds, device and timing.
- :class:`MlflowTrackingHook` files each run in MLflow through kedro-mlflow: the parameters
  (redacted), every training step's metrics while the node trains, result tables and plots.
- :class:`PinnedVersionsHook` makes every versioned dataset of a run load the version this
  run saved (or the newest at its start), never one a concurrent run wrote later.
- :class:`CredentialsHook` hands the Kedro credentials to the nodes that need them, as the
  ``credentials`` dataset.
- :class:`ParameterCheckHook` checks every parameter group the run reads (and the tapo / tor
  comparisons' strategy lists) before the first node.

Neither a manifest nor MLflow ever holds a secret: parameters (and run_params, whose
``runtime_params`` are the ``--params`` overrides) pass through
:func:`creditflow.redaction.redact` first.

Both record datasets through the dataset hooks, which Kedro calls in the process that loads or
saves: under ``ParallelRunner`` the per-dataset records stay in the worker processes, so the
manifest lists no dataset versions and MLflow gets no metrics or artifacts; use the sequential
or thread runner for tracked runs.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
from collections.abc import Mapping
from contextlib import ExitStack
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kedro.framework.hooks import hook_impl
from kedro.io import AbstractVersionedDataset, CatalogProtocol, MemoryDataset
from kedro.pipeline import Pipeline

from creditflow.redaction import redact, scrub

if TYPE_CHECKING:
    from kedro.framework.context import KedroContext
    from kedro.pipeline.node import Node
    from kedro_mlflow.framework.hooks import MlflowHook

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


class PinnedVersionsHook:
    """Keeps a run to its own dataset versions when other runs share the project folder.

    Kedro loads an unpinned versioned dataset at the newest version on disk at the moment of
    the load, so a run that saved ``tapo_sft_policy`` could load another run's newer one a
    node later (Kedro only warns). Before the first node this pins, for every versioned
    dataset of the run without a ``--load-versions`` pin:

    - a dataset the run writes: its load version to the run's save version (a node reads what
      this run's own upstream node saved);
    - a dataset the run only reads: its load version to the newest version at the start of the
      run (a run started later cannot change the inputs of one in progress). One with no
      version yet fails the run before its first node, naming the pipeline that saves it
      (``kedro run --pipelines data_ingest`` for the ingested tables).
    """

    @hook_impl
    def before_pipeline_run(self, pipeline: Pipeline, catalog: CatalogProtocol) -> None:
        from kedro.io.core import VersionNotFoundError  # noqa: PLC0415

        outputs = pipeline.all_outputs()
        pinned: dict[str, str] = {}
        never_saved: list[str] = []
        for name in sorted(pipeline.datasets()):
            dataset = catalog.get(name) if name in catalog else None
            if not isinstance(dataset, AbstractVersionedDataset) or not dataset._version:
                continue
            version = dataset._version  # Kedro's Version(load, save); no public setter
            if version.load:
                continue  # --load-versions: the user's choice stands
            if name in outputs:
                save = dataset.resolve_save_version()
                dataset._version = version._replace(load=save, save=save)
            else:
                try:
                    pinned[name] = dataset.resolve_load_version()
                except VersionNotFoundError:
                    never_saved.append(name)
                    continue
                dataset._version = version._replace(load=pinned[name])
        if never_saved:
            raise MissingInputsError(_missing_inputs_message(never_saved))
        if pinned:
            logger.info(
                "inputs pinned for this run: %s",
                ", ".join(f"{name}@{version}" for name, version in pinned.items()),
            )


def _every_pipeline() -> dict[str, Pipeline]:
    """Each pipeline package's ``create_pipeline()`` by its name, as ``find_pipelines`` finds
    them; not through it: within a ``kedro run --pipelines X`` it returns only X."""
    import importlib  # noqa: PLC0415
    import pkgutil  # noqa: PLC0415

    import creditflow.pipelines as package  # noqa: PLC0415

    found = {}
    for module in pkgutil.iter_modules(package.__path__):
        if module.ispkg:
            create = getattr(
                importlib.import_module(f"{package.__name__}.{module.name}"),
                "create_pipeline",
                None,
            )
            if create is not None:
                found[module.name] = create()
    return found


class MissingInputsError(RuntimeError):
    """A run reads datasets that were never saved."""


def _missing_inputs_message(names: list[str]) -> str:
    """Which registered pipeline saves each of ``names`` (the smallest one that does)."""
    pipelines = _every_pipeline()
    lines = []
    for name in names:
        producers = sorted(
            (len(p.nodes), pipeline_name)
            for pipeline_name, p in pipelines.items()
            if name in p.all_outputs()
        )
        how = (
            f"run `kedro run --pipelines {producers[0][1]}` first"
            if producers
            else "no registered pipeline saves it: add it to the catalog's data"
        )
        lines.append(f"{name}: {how}")
    return (
        "this run reads datasets that have no saved version yet (nothing ran):\n  "
        + "\n  ".join(lines)
    )


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
    """Files each ``kedro run`` as one MLflow run: kedro-mlflow's ``MlflowHook``, wrapped.

    kedro-mlflow (configured in ``conf/base/mlflow.yml``: store, experiment, how parameters
    are logged) opens the run, tags it with Kedro's run parameters, logs the parameters each
    node takes and closes the run FINISHED or FAILED. Around it this hook:

    - redacts: kedro-mlflow sees the nodes' parameters and the run parameters (whose
      ``runtime_params`` are the ``--params`` overrides) only through
      :func:`creditflow.redaction.redact`, so a secret-named value is logged as
      ``[REDACTED]``; kedro-mlflow's own auto-registered hook, which would log them as they
      are, is disabled in ``settings.py``;
    - logs live metrics: while a node runs, :func:`creditflow.tracking.active_step_logger` is
      a :class:`~creditflow.tracking.StepLogger` for the run, which ``SupervisedTrainer`` and
      ``GRPOTrainer`` call after every step; keys are prefixed by the node's ``*_metrics``
      output less ``_metrics`` (``tapo_grpo_sum/reward/total``; the node's name without one);
    - logs results: every saved ``*_comparison`` / ``*_evaluation`` table as ``<name>.csv``,
      every ``*_plot`` / ``*_curves`` figure as ``<name>.png``
      (:func:`creditflow.tracking.log_artifact`).

    Off, with nothing opened or written, when ``tracking.enabled`` is false
    (``conf/base/parameters_tracking.yml``, ``--params tracking.enabled=false``) or in a
    process of rank other than 0 (``RANK``, set by torchrun); kedro-mlflow's
    ``tracking.disable_tracking.pipelines`` turns off the pipelines it lists.
    """

    def __init__(self) -> None:
        self._mlflow: MlflowHook | None = None  # kedro-mlflow's, while tracking is on
        self._nodes: dict[str, ExitStack] = {}  # node name -> its step logger, while it runs

    @property
    def run_id(self) -> str | None:
        """The MLflow run id of the run in progress (None when not tracking)."""
        return None if self._mlflow is None else self._mlflow.run_id

    @hook_impl
    def after_context_created(self, context: KedroContext) -> None:
        from kedro.config import MissingConfigException  # noqa: PLC0415

        from creditflow.tracking import is_rank_zero, tracking_enabled  # noqa: PLC0415

        self._mlflow = None
        # The loader's parameters (--params applied), not context.params: that would import
        # and validate every pipeline, not only the run's, before the run has started.
        try:
            parameters = context.config_loader["parameters"]
        except MissingConfigException:
            parameters = {}
        if not tracking_enabled(parameters):
            logger.info("MLflow tracking off: tracking.enabled is false")
            return
        if not is_rank_zero():
            logger.info("MLflow tracking off: rank %s (only rank 0 tracks)", os.environ["RANK"])
            return
        # Imported here, as kedro-mlflow imports MLflow (~1.5 s): settings.py imports this
        # module for every kedro command, and untracked runs need neither.
        from kedro_mlflow.framework.hooks import MlflowHook  # noqa: PLC0415

        _resolve_sqlite_uri(context)
        self._mlflow = MlflowHook()
        self._mlflow.after_context_created(context)

    @hook_impl
    def after_catalog_created(
        self,
        catalog: CatalogProtocol,
        conf_catalog: dict[str, Any],
        conf_creds: dict[str, Any],
        parameters: dict[str, Any],
        save_version: str,
        load_versions: dict[str, str],
    ) -> None:
        if self._mlflow is not None:
            self._mlflow.after_catalog_created(
                catalog, conf_catalog, {}, redact(parameters), save_version, load_versions
            )

    @hook_impl
    def before_pipeline_run(
        self, run_params: dict[str, Any], pipeline: Pipeline, catalog: CatalogProtocol
    ) -> None:
        if self._mlflow is not None:
            self._mlflow.before_pipeline_run(redact(run_params), pipeline, catalog)

    @hook_impl
    def before_node_run(
        self, node: Node, catalog: CatalogProtocol, inputs: dict[str, Any], is_async: bool
    ) -> None:
        if self._mlflow is None:
            return
        # kedro-mlflow logs only the parameter inputs (params:<name>, parameters).
        params = redact({k: v for k, v in inputs.items() if _is_parameter(k)})
        self._mlflow.before_node_run(node, catalog, params, is_async)
        if self._mlflow.run_id is None:  # this pipeline is in disable_tracking.pipelines
            return
        from creditflow import tracking  # noqa: PLC0415

        metrics = sorted(name for name in node.outputs if name.endswith("_metrics"))
        step_logger = tracking.StepLogger(
            tracking_uri=self._tracking_uri(),
            run_id=self._mlflow.run_id,
            prefix=metrics[0].removesuffix("_metrics") if metrics else node.name,
            flush_every_s=tracking.FLUSH_EVERY_S,
        )
        stack = ExitStack()
        stack.enter_context(tracking.logging_steps(step_logger))
        self._nodes[node.name] = stack

    @hook_impl
    def after_node_run(self, node: Node) -> None:
        self._stop_step_logging(node)

    @hook_impl
    def on_node_error(self, node: Node) -> None:
        self._stop_step_logging(node)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data: Any) -> None:
        if self._mlflow is None or self._mlflow.run_id is None:
            return
        from creditflow import tracking  # noqa: PLC0415

        if dataset_name.endswith(tracking.ARTIFACT_SUFFIXES):
            client = tracking.client(self._tracking_uri())
            tracking.log_artifact(client, self._mlflow.run_id, dataset_name, data)

    @hook_impl
    def after_pipeline_run(
        self, run_params: dict[str, Any], pipeline: Pipeline, catalog: CatalogProtocol
    ) -> None:
        if self._mlflow is not None:
            self._mlflow.after_pipeline_run(redact(run_params), pipeline, catalog)

    @hook_impl
    def on_pipeline_error(
        self,
        error: Exception,
        run_params: dict[str, Any],
        pipeline: Pipeline,
        catalog: CatalogProtocol,
    ) -> None:
        if self._mlflow is not None:
            self._mlflow.on_pipeline_error(error, redact(run_params), pipeline, catalog)

    def _tracking_uri(self) -> str:
        return self._mlflow.mlflow_config.server.mlflow_tracking_uri

    def _stop_step_logging(self, node: Node) -> None:
        stack = self._nodes.pop(node.name, None)
        if stack is not None:
            stack.close()


def _resolve_sqlite_uri(context: KedroContext) -> None:
    """Make a relative SQLite tracking URI of ``mlflow.yml`` absolute against the project path,
    in the context's config loader, where kedro-mlflow reads it next (a key set on the loader
    is returned as set)."""
    from kedro.config import MissingConfigException  # noqa: PLC0415

    from creditflow.tracking import project_uri  # noqa: PLC0415

    loader = context.config_loader
    loader.config_patterns.setdefault("mlflow", ["mlflow*", "mlflow*/**", "**/mlflow*"])
    try:
        config = dict(loader["mlflow"])
    except MissingConfigException:
        return  # kedro-mlflow's defaults: mlruns/ of the project
    server = dict(config.get("server") or {})
    uri = server.get("mlflow_tracking_uri")
    if uri:
        server["mlflow_tracking_uri"] = project_uri(uri, context.project_path)
        loader["mlflow"] = {**config, "server": server}
