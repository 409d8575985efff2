"""MlflowTrackingHook: kedro-mlflow's run, with secrets redacted before anything is logged, and the
live per-step metrics of creditflow.tracking."""

from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from kedro.config import MissingConfigException
from kedro.framework.hooks import hook_impl
from kedro.io import CatalogProtocol
from kedro.pipeline import Pipeline

from creditflow import tracking
from creditflow.errors import RunInterrupted
from creditflow.hooks.run_manifest import is_parameter_dataset
from creditflow.redaction import redact
from creditflow.tracking import is_rank_zero, project_uri, tracking_enabled

if TYPE_CHECKING:
    from kedro.framework.context import KedroContext
    from kedro.pipeline.node import Node
    from kedro_mlflow.framework.hooks import MlflowHook

logger = logging.getLogger(__name__)


class MlflowTrackingHook:
    """Files each ``kedro run`` as one MLflow run: kedro-mlflow's ``MlflowHook``, wrapped.

    kedro-mlflow (configured in ``conf/base/mlflow.yml``: store, experiment, how parameters
    are logged) opens the run, tags it with Kedro's run parameters, logs the parameters each
    node takes and closes the run FINISHED or FAILED. Around it this hook:

    - creates a new SQLite store under a file lock (:func:`creditflow.tracking.create_sqlite_store`),
      so two first runs in one folder do not both migrate it;
    - closes a run stopped by SIGTERM (:class:`~creditflow.errors.RunInterrupted`, raised by
      ``hooks.termination.SigtermHook``) ``KILLED``, MLflow's status for a run ended from
      outside, rather than FAILED;

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

        uri = _resolve_sqlite_uri(context)
        if uri is not None:
            tracking.create_sqlite_store(uri)
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
        params = redact({k: v for k, v in inputs.items() if is_parameter_dataset(k)})
        self._mlflow.before_node_run(node, catalog, params, is_async)
        if self._mlflow.run_id is None:  # this pipeline is in disable_tracking.pipelines
            return

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
        if self._mlflow is None:
            return
        run_id = self._mlflow.run_id
        self._mlflow.on_pipeline_error(error, redact(run_params), pipeline, catalog)
        if run_id is not None and isinstance(error, RunInterrupted):
            # kedro-mlflow has ended it FAILED; an interrupted run is MLflow's KILLED.
            tracking.client(self._tracking_uri()).set_terminated(run_id, status="KILLED")

    def _tracking_uri(self) -> str:
        return self._mlflow.mlflow_config.server.mlflow_tracking_uri

    def _stop_step_logging(self, node: Node) -> None:
        stack = self._nodes.pop(node.name, None)
        if stack is not None:
            stack.close()


def _resolve_sqlite_uri(context: KedroContext) -> str | None:
    """Make a relative SQLite tracking URI of ``mlflow.yml`` absolute against the project path,
    in the context's config loader, where kedro-mlflow reads it next (a key set on the loader
    is returned as set); returns the tracking URI, None without one."""

    loader = context.config_loader
    loader.config_patterns.setdefault("mlflow", ["mlflow*", "mlflow*/**", "**/mlflow*"])
    try:
        config = dict(loader["mlflow"])
    except MissingConfigException:
        return None  # kedro-mlflow's defaults: mlruns/ of the project
    server = dict(config.get("server") or {})
    uri = server.get("mlflow_tracking_uri")
    if not uri:
        return None
    server["mlflow_tracking_uri"] = project_uri(uri, context.project_path)
    loader["mlflow"] = {**config, "server": server}
    return server["mlflow_tracking_uri"]
