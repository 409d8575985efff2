"""MlflowTrackingHook: kedro-mlflow's run, with secrets redacted before anything is logged, the
live per-step metrics of creditflow.tracking, and a store that fails never failing the run."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
F = TypeVar("F", bound=Callable[..., Any])


def _never_raises(method: F) -> F:
    """A hook method that logs its own error rather than raise it.

    pluggy calls the implementations of a hook one after the other and stops at the first that
    raises: an error of this hook's ``on_pipeline_error`` or ``after_pipeline_run`` would keep
    ``RunManifestHook`` (after it in ``settings.HOOKS``) from writing the run's manifest, and
    one of its node hooks would fail a node that trains. ``RunInterrupted`` (SIGTERM,
    ``hooks.termination``) goes through: it stops the run on purpose.
    """

    @functools.wraps(method)
    def logging_errors(self: MlflowTrackingHook, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except RunInterrupted:
            raise
        except Exception:
            logger.exception(
                "MlflowTrackingHook.%s failed; the run goes on, its MLflow record may be "
                "incomplete",
                method.__name__,
            )
            return None

    return logging_errors  # type: ignore[return-value]


class MlflowTrackingHook:
    """Files each ``kedro run`` as one MLflow run: kedro-mlflow's ``MlflowHook``, wrapped.

    kedro-mlflow (configured in ``conf/base/mlflow.yml``: store, experiment, how parameters
    are logged) opens the run, tags it with Kedro's run parameters, logs the parameters each
    node takes and closes the run FINISHED or FAILED. Around it this hook:

    - creates a new SQLite store under a file lock (:func:`creditflow.tracking.create_sqlite_store`),
      so two first runs in one folder do not both migrate it;
    - fails a run whose store cannot be opened before it starts
      (:class:`~creditflow.tracking.TrackingStoreError`, naming the store and
      ``--params tracking.enabled=false``); once the run has started, a call the store
      refuses is retried, then skipped with a warning (:func:`creditflow.tracking.try_tracking`),
      and no error of this hook reaches Kedro: the run trains, and the hooks after this one
      (the run manifest) run, whatever the store does;
    - tags the run with its process (:func:`creditflow.tracking.process_tags`) and closes
      ``KILLED`` the runs of the experiment that killed processes left ``RUNNING``
      (:func:`creditflow.tracking.end_stale_runs`);
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
        self._outside_run = False  # the run was opened before the session (an orchestrator)
        self._nodes: dict[str, ExitStack] = {}  # node name -> its step logger, while it runs

    @property
    def run_id(self) -> str | None:
        """The MLflow run id of the run in progress (None when not tracking)."""
        return None if self._mlflow is None else self._mlflow.run_id

    @hook_impl
    def after_context_created(self, context: KedroContext) -> None:
        # Raises, unlike the hooks below: a wrong tracking switch, mlflow.yml or store stops
        # the run before it starts, with a message saying what to fix.
        self._mlflow = None
        tracking.take_skipped()  # this session's store failures are warned of afresh
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
        import mlflow  # noqa: PLC0415
        from kedro_mlflow.framework.hooks import MlflowHook  # noqa: PLC0415 - as MLflow

        uri = _resolve_sqlite_uri(context)
        mlflow_hook = MlflowHook()
        self._outside_run = mlflow.active_run() is not None
        try:
            if uri is not None:
                tracking.with_retries(functools.partial(tracking.create_sqlite_store, uri))
            tracking.with_retries(functools.partial(mlflow_hook.after_context_created, context))
        except (ValueError, TypeError):
            raise  # mlflow.yml breaks kedro-mlflow's schema; its message names the key
        except Exception as error:
            # kedro-mlflow's default store, without a tracking URI in mlflow.yml: mlruns/.
            shown = uri or (Path(context.project_path) / "mlruns").as_uri()
            raise tracking.TrackingStoreError(
                f"MLflow tracking store {tracking.safe_uri(shown)} cannot be opened "
                f"({tracking.describe_error(error, shown)}). Fix server.mlflow_tracking_uri in "
                f"conf/base/mlflow.yml (or conf/local/mlflow.yml) or the store it names, or run "
                f"without tracking: {tracking.TRACKING_OFF}"
            ) from None  # MLflow's own error quotes the URI whole, password included
        self._mlflow = mlflow_hook

    @hook_impl
    @_never_raises
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
    @_never_raises
    def before_pipeline_run(
        self, run_params: dict[str, Any], pipeline: Pipeline, catalog: CatalogProtocol
    ) -> None:
        if self._mlflow is None:
            return
        uri = self._tracking_uri()
        start = functools.partial(self._start_run, redact(run_params), pipeline, catalog)
        if not tracking.try_tracking("start the MLflow run", start, uri):
            if self._mlflow.run_id is None:
                # Off for the rest of the run: kedro-mlflow would log the nodes' parameters
                # into a new, nameless run of MLflow's own making.
                logger.warning("MLflow tracking off for this run: its MLflow run did not start")
                self._mlflow = None
                return
        run_id = self._mlflow.run_id
        if run_id is None:  # this pipeline is in disable_tracking.pipelines
            return
        tag = functools.partial(tracking.tag_process, uri, run_id)
        tracking.try_tracking("tag the run with its process id and host", tag, uri)
        end_stale = functools.partial(_end_stale_runs, uri, run_id)
        tracking.try_tracking("close the runs killed processes left RUNNING", end_stale, uri)

    @hook_impl
    @_never_raises
    def before_node_run(
        self, node: Node, catalog: CatalogProtocol, inputs: dict[str, Any], is_async: bool
    ) -> None:
        if self._mlflow is None or self._mlflow.run_id is None:
            return  # not tracking, or this pipeline is in disable_tracking.pipelines
        # kedro-mlflow logs only the parameter inputs (params:<name>, parameters).
        params = redact({k: v for k, v in inputs.items() if is_parameter_dataset(k)})
        log_params = functools.partial(
            self._mlflow.before_node_run, node, catalog, params, is_async
        )
        tracking.try_tracking(
            f"log the parameters of node {node.name}",
            log_params,
            self._tracking_uri(),
            kind="log parameters",
        )

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
    @_never_raises
    def after_node_run(self, node: Node) -> None:
        self._stop_step_logging(node)

    @hook_impl
    @_never_raises
    def on_node_error(self, node: Node) -> None:
        self._stop_step_logging(node)

    @hook_impl
    @_never_raises
    def after_dataset_saved(self, dataset_name: str, data: Any) -> None:
        if self._mlflow is None or self._mlflow.run_id is None:
            return

        if dataset_name.endswith(tracking.ARTIFACT_SUFFIXES):
            client = tracking.client(self._tracking_uri())
            tracking.log_artifact(client, self._mlflow.run_id, dataset_name, data)

    @hook_impl
    @_never_raises
    def after_pipeline_run(
        self, run_params: dict[str, Any], pipeline: Pipeline, catalog: CatalogProtocol
    ) -> None:
        if self._mlflow is not None:
            close = functools.partial(
                self._mlflow.after_pipeline_run, redact(run_params), pipeline, catalog
            )
            self._end_run(close, "FINISHED")

    @hook_impl
    @_never_raises
    def on_pipeline_error(
        self,
        error: Exception,
        run_params: dict[str, Any],
        pipeline: Pipeline,
        catalog: CatalogProtocol,
    ) -> None:
        if self._mlflow is None:
            return
        close = functools.partial(
            self._mlflow.on_pipeline_error, error, redact(run_params), pipeline, catalog
        )
        # kedro-mlflow ends the run FAILED; an interrupted run is MLflow's KILLED.
        self._end_run(close, "KILLED" if isinstance(error, RunInterrupted) else "FAILED")

    def _tracking_uri(self) -> str:
        return self._mlflow.mlflow_config.server.mlflow_tracking_uri

    def _start_run(
        self, run_params: dict[str, Any], pipeline: Pipeline, catalog: CatalogProtocol
    ) -> None:
        """kedro-mlflow's start: the run opened, then tagged with Kedro's run parameters."""
        if self._mlflow.run_id is None:
            self._mlflow.before_pipeline_run(run_params, pipeline, catalog)
        else:
            # An earlier try opened the run and failed on its tags: tried again it would
            # open a second run, so the run goes on without them.
            logger.warning(
                "MLflow run %s started without some of its tags (Kedro's run parameters)",
                self._mlflow.run_id,
            )

    def _end_run(self, close: Callable[[], None], status: str) -> None:
        """End the run ``status`` by kedro-mlflow's ``close`` (which ends it FINISHED after
        a run, FAILED after an error), then say what the store refused during the run."""
        import mlflow  # noqa: PLC0415 - imported by kedro-mlflow already, where tracking is on

        run_id = self._mlflow.run_id
        try:
            close()
            ended = status != "KILLED"  # kedro-mlflow wrote FINISHED or FAILED, not KILLED
        except RunInterrupted:
            raise
        except Exception as error:
            if run_id is None or self._outside_run:
                raise  # no run of ours to end: a plain error, for _never_raises to log
            reason = tracking.describe_error(error, self._tracking_uri())
            logger.info("kedro-mlflow could not end MLflow run %s (%s)", run_id, reason)
            ended = False
            # MLflow takes a run off the thread's stack of active runs before it writes its
            # end, so kedro-mlflow's end is not repeated (it would end nothing): the rest of
            # the stack is emptied as well, or the next session of this process would log
            # into this run, and the status is written by the client below.
            while (active := mlflow.active_run()) is not None:
                with contextlib.suppress(Exception):
                    mlflow.end_run(status)
                if mlflow.active_run() is active:
                    break
        if run_id is not None and not ended and not self._outside_run:
            uri = self._tracking_uri()
            end = functools.partial(_set_terminated, uri, run_id, status)
            tracking.try_tracking(f"end the MLflow run {status}", end, uri)
        skipped = tracking.take_skipped()
        if skipped and run_id is not None:
            logger.warning(
                "MLflow run %s is incomplete: the store refused %s (the run itself went on)",
                run_id,
                ", ".join(f"{count} x {kind}" for kind, count in skipped.items()),
            )

    def _stop_step_logging(self, node: Node) -> None:
        stack = self._nodes.pop(node.name, None)
        if stack is not None:
            stack.close()


def _end_stale_runs(tracking_uri: str, run_id: str) -> None:
    """:func:`creditflow.tracking.end_stale_runs` in the experiment of run ``run_id``."""
    client = tracking.client(tracking_uri)
    experiment_id = client.get_run(run_id).info.experiment_id
    tracking.end_stale_runs(client, experiment_id, run_id)


def _set_terminated(tracking_uri: str, run_id: str, status: str) -> None:
    tracking.client(tracking_uri).set_terminated(run_id, status)


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
