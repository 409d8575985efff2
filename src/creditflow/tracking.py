"""MLflow logging from inside a run: live per-step metrics, result tables and plots.

kedro-mlflow opens one MLflow run per ``kedro run`` (``conf/base/mlflow.yml``) and logs the
parameters; :class:`creditflow.hooks.mlflow_tracking.MlflowTrackingHook` wraps it and uses this module for the
rest (docs/reproducibility.md):

- :class:`StepLogger` is a training loop's step callback: ``callback(step, metrics)`` after
  every optimizer step sends that step's numbers to the run (at most once a second, see
  :data:`FLUSH_EVERY_S`), so ``mlflow ui`` draws the curves while the node trains. The hook
  makes one per node and :func:`active_step_logger` hands it to ``SupervisedTrainer`` /
  ``GRPOTrainer``; the engines know nothing of Kedro.
- :func:`log_artifact` logs a saved result table as CSV and a plot as PNG.
- :func:`create_sqlite_store` creates a new SQLite store under a file lock, so that two runs
  starting at once in a folder without one do not both run MLflow's schema migrations.

No Kedro here, and MLflow, pandas and matplotlib are imported only when something is logged:
the engines import this module, and a run without tracking should not pay for MLflow.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# (step, metrics) -> None, called by a training loop after every step with the step's row
# (keys such as "reward/total"; a "step" key, text and NaN cells are not logged).
StepCallback = Callable[[int, Mapping[str, Any]], None]

# Saved datasets whose names end so are logged as artifacts: tables as CSV, plots as PNG
# (``_ab`` / ``_sweep``: the simulated online A/B of the reranker chain and its sweep).
TABLE_SUFFIXES = ("_comparison", "_evaluation", "_ab", "_sweep")
PLOT_SUFFIXES = ("_plot", "_curves")
PAGE_SUFFIXES = ("_html",)  # an HTML page as text (the credit inspector's rendering)
ARTIFACT_SUFFIXES = TABLE_SUFFIXES + PLOT_SUFFIXES + PAGE_SUFFIXES

# The step logger of the node running in this thread (set by the Kedro hook) ...
_ACTIVE: ContextVar[StepLogger | None] = ContextVar("creditflow_step_logger", default=None)
# ... and, for the data-parallel workers a node spawns (new processes inherit the environment,
# not the context), the same as JSON in the environment.
STEP_LOGGER_ENV = "CREDITFLOW_MLFLOW_STEP_LOGGER"

# A step logger writes what it has at most this often (and when its node ends): one SQLite
# write costs ~5 ms, against 10-40 ms for a step of `make run`'s tiny models. Steps longer than
# this, as on real models, are written as each ends.
FLUSH_EVERY_S = 1.0
# MLflow's limit (mlflow.utils.validation.MAX_METRICS_PER_BATCH).
_MAX_METRICS_PER_BATCH = 1000

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_rank_zero() -> bool:
    """Whether this process is rank 0 (or alone): ``RANK`` as torchrun, ``accelerate launch``
    and ``training.launch`` set it. Only rank 0 logs, so N processes give one history."""
    return int(os.environ.get("RANK") or 0) == 0


def tracking_enabled(parameters: Mapping[str, Any]) -> bool:
    """The project's switch, ``tracking.enabled`` (``conf/base/parameters_tracking.yml``);
    true when there is no ``tracking`` group.

    >>> tracking_enabled({}), tracking_enabled({"tracking": {"enabled": False}})
    (True, False)

    Raises:
        ValueError: a key other than ``enabled`` (where runs go and what is logged is
            ``conf/base/mlflow.yml``'s business), or an ``enabled`` that is not a boolean.
    """
    group = parameters.get("tracking") or {}
    if not isinstance(group, Mapping) or set(group) - {"enabled"}:
        raise ValueError(
            f"tracking: only `enabled` (true / false) is a parameter; got {group!r}. The "
            "tracking URI, experiment and logging options live in conf/base/mlflow.yml"
        )
    enabled = group.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"tracking.enabled must be true or false; got {enabled!r}")
    return enabled


def project_uri(uri: str, project_path: str | Path) -> str:
    """``uri`` with a relative SQLite path made absolute against ``project_path``, as
    kedro-mlflow does for a folder (MLflow would open it from the working directory, and
    caches its store by URI: two projects in one process would share the first one's file).

    >>> project_uri("sqlite:///mlruns/mlflow.db", "/work/project")
    'sqlite:////work/project/mlruns/mlflow.db'
    >>> project_uri("sqlite:////runs/mlflow.db", "/p"), project_uri("http://127.0.0.1:5000", "/p")
    ('sqlite:////runs/mlflow.db', 'http://127.0.0.1:5000')
    """
    prefix = "sqlite:///"
    path = uri.removeprefix(prefix)
    if uri.startswith(prefix) and not Path(path).is_absolute():
        return prefix + (Path(project_path) / path).as_posix()
    return uri


@functools.cache
def client(tracking_uri: str) -> MlflowClient:
    """One ``MlflowClient`` per tracking URI and process (a client opens its store once)."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415 - only tracked runs import MLflow

    return MlflowClient(tracking_uri)


def create_sqlite_store(tracking_uri: str) -> None:
    """Create the SQLite store at ``tracking_uri`` (an absolute ``sqlite:///`` URI) if it is
    new, holding the file lock ``<database>.lock`` meanwhile; any other URI is left alone.

    MLflow creates a SQLite store by running its schema migrations on the file. Two processes
    doing so at once (two first runs in a folder without ``mlruns/``) both migrate it and one
    fails (``duplicate column name: step``, ``table ... already exists``); with the lock the
    second waits, then opens the store the first made. The lock is an OS file lock, released
    when its holder exits, however it exits.
    """
    prefix = "sqlite:///"
    database = tracking_uri.removeprefix(prefix)
    if not tracking_uri.startswith(prefix) or database in ("", ":memory:"):
        return
    Path(database).parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{database}.lock"):
        client(tracking_uri).search_experiments(max_results=1)  # opening it migrates it


def step_values(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one step's row that become MLflow metrics: every numeric or boolean
    value but ``step``, as floats; NaN (not measured at this step) and text are left out.

    >>> step_values({"step": 3, "loss": 0.5, "ok": True, "eval/acc": float("nan"), "phase": "a"})
    {'loss': 0.5, 'ok': 1.0}
    """
    values = {}
    for key, value in metrics.items():
        if key != "step" and isinstance(value, Real) and not math.isnan(value):
            values[str(key)] = float(value)
    return values


@dataclass(frozen=True)
class StepLogger:
    """A step callback that logs each step's metrics to one MLflow run while the loop runs.

    Attributes:
        tracking_uri: the run's store (an absolute URI: workers may run elsewhere).
        run_id: the MLflow run.
        prefix: put before every key as ``<prefix>/<key>``; the hook uses the node's
            ``*_metrics`` output less ``_metrics`` (``tapo_grpo_sum/reward/total``), so the
            several loops of one run keep separate histories. Empty: keys as they are.
        flush_every_s: steps are written in one batch once this long has passed since the last
            write (the first step at once), and by :meth:`flush`; 0 writes every step.

    Plain data, so it pickles and travels as JSON (:data:`STEP_LOGGER_ENV`); the steps not yet
    written are kept per process, and written at its exit too. In a process of rank other than
    0 a call does nothing.
    """

    tracking_uri: str
    run_id: str
    prefix: str = ""
    flush_every_s: float = FLUSH_EVERY_S

    def __call__(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not is_rank_zero():
            return
        values = step_values(metrics)
        if not values:
            return
        pending = _pending(self)
        with pending.lock:
            pending.rows.append((int(step), int(time.time() * 1000), values))
            due = time.monotonic() - pending.written_at >= self.flush_every_s
        if due:
            self.flush()

    def flush(self) -> None:
        """Write the steps not written yet."""
        pending = _pending(self)
        with pending.lock:
            rows, pending.rows = pending.rows, []
            pending.written_at = time.monotonic()
        if not rows:
            return
        from mlflow.entities import Metric  # noqa: PLC0415 - only tracked runs import MLflow

        metrics = [
            Metric(self.key(name), value, timestamp_ms, step)
            for step, timestamp_ms, values in rows
            for name, value in values.items()
        ]
        for start in range(0, len(metrics), _MAX_METRICS_PER_BATCH):
            batch = metrics[start : start + _MAX_METRICS_PER_BATCH]
            client(self.tracking_uri).log_batch(self.run_id, metrics=batch)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name


@dataclass
class _Pending:
    """A step logger's steps not yet written: (step, timestamp ms, values) each."""

    rows: list[tuple[int, int, dict[str, float]]] = field(default_factory=list)
    written_at: float = -math.inf  # time.monotonic() of the last write
    lock: threading.Lock = field(default_factory=threading.Lock)


_PENDING: dict[StepLogger, _Pending] = {}
_PENDING_LOCK = threading.Lock()


def _pending(step_logger: StepLogger) -> _Pending:
    with _PENDING_LOCK:
        return _PENDING.setdefault(step_logger, _Pending())


@atexit.register
def _flush_all() -> None:
    """At exit: a spawned data-parallel worker ends without its node's flush."""
    for step_logger in list(_PENDING):
        step_logger.flush()


def active_step_logger() -> StepLogger | None:
    """The step logger of the node running here (:func:`logging_steps`), or None when nothing
    is tracked; a loop calls it once, when it is built."""
    active = _ACTIVE.get()
    if active is not None:
        return active
    exported = os.environ.get(STEP_LOGGER_ENV)
    return StepLogger(**json.loads(exported)) if exported else None


@contextmanager
def logging_steps(step_logger: StepLogger) -> Iterator[StepLogger]:
    """Make ``step_logger`` the :func:`active_step_logger` of this thread, and of the processes
    started inside the block (through the environment), until the block ends; then write the
    steps it still holds."""
    token = _ACTIVE.set(step_logger)
    previous = os.environ.get(STEP_LOGGER_ENV)
    os.environ[STEP_LOGGER_ENV] = json.dumps(asdict(step_logger))
    try:
        yield step_logger
    finally:
        _ACTIVE.reset(token)
        if previous is None:
            os.environ.pop(STEP_LOGGER_ENV, None)
        else:
            os.environ[STEP_LOGGER_ENV] = previous
        with _PENDING_LOCK:
            pending = step_logger in _PENDING
        if pending:
            step_logger.flush()
            with _PENDING_LOCK:
                del _PENDING[step_logger]


def log_artifact(mlflow_client: MlflowClient, run_id: str, name: str, data: Any) -> list[str]:
    """Log the data saved as dataset ``name``; returns the artifact paths written.

    A pandas DataFrame (a ``TABLE_SUFFIXES`` table, e.g. ``*_comparison``) becomes
    ``<name>.csv``; a page (``*_html``: HTML text) ``<name>.html``; a plot (``*_plot`` /
    ``*_curves``: a matplotlib Figure, a PIL image or PNG bytes) becomes ``<name>.png``, and a
    list or dict of them (as kedro-datasets' MatplotlibDataset saves)
    ``<name>/<index or key>.png``.

    Raises:
        ValueError: anything else, naming what is expected.
    """
    import pandas as pd  # noqa: PLC0415 - pandas only when a table is logged

    if isinstance(data, pd.DataFrame):
        mlflow_client.log_text(run_id, data.to_csv(index=False), f"{name}.csv")
        return [f"{name}.csv"]
    if isinstance(data, str) and name.endswith(PAGE_SUFFIXES):
        mlflow_client.log_text(run_id, data, f"{name}.html")
        return [f"{name}.html"]
    if isinstance(data, Mapping):
        items = [(f"{name}/{key}.png", value) for key, value in data.items()]
    elif isinstance(data, list | tuple):
        items = [(f"{name}/{index}.png", value) for index, value in enumerate(data)]
    else:
        items = [(f"{name}.png", data)]
    for artifact_file, plot in items:
        _log_plot(mlflow_client, run_id, artifact_file, plot)
    return [artifact_file for artifact_file, _ in items]


def _log_plot(mlflow_client: MlflowClient, run_id: str, artifact_file: str, plot: Any) -> None:
    from matplotlib.figure import Figure  # noqa: PLC0415 - matplotlib only when a plot is logged
    from PIL import Image  # noqa: PLC0415 - PIL only when an image is logged

    if isinstance(plot, Figure):
        mlflow_client.log_figure(run_id, plot, artifact_file)
    elif isinstance(plot, Image.Image):
        mlflow_client.log_image(run_id, plot, artifact_file=artifact_file)
    elif isinstance(plot, bytes) and plot.startswith(_PNG_MAGIC):
        artifact_path, _, file_name = artifact_file.rpartition("/")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / file_name
            path.write_bytes(plot)
            mlflow_client.log_artifact(run_id, str(path), artifact_path or None)
    else:
        raise ValueError(
            f"{artifact_file}: a table to log must be a pandas DataFrame and a plot a matplotlib "
            f"Figure, a PIL image or PNG bytes (or a list / dict of them); got "
            f"{type(plot).__name__}"
        )
