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
- :func:`try_tracking` makes every call to the store during a run: tried a few times
  (:data:`RETRY_DELAYS_S`), then skipped with a warning, so a locked or unreachable store
  never stops a run that trains; :func:`with_retries` is its raising half, for opening the
  store before the run (:class:`TrackingStoreError`).
- :func:`end_stale_runs` closes ``KILLED`` the runs a killed process left ``RUNNING``; the
  runs carry their process's id and host (:func:`process_tags`) for it.

No Kedro here, and MLflow, pandas and matplotlib are imported only when something is logged:
the engines import this module, and a run without tracking should not pay for MLflow.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

from filelock import FileLock

from creditflow.errors import RunInterrupted

if TYPE_CHECKING:
    from mlflow.entities import Metric, Run
    from mlflow.tracking import MlflowClient

logger = logging.getLogger(__name__)
T = TypeVar("T")

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
# After the store refused a write, a step logger tries again no sooner than this (the steps
# meanwhile are kept): a store locked for a minute then costs the training loop one round of
# retries every half minute rather than one per step.
HOLD_OFF_S = 30.0
# A step logger keeps at most this many refused metric values (about 20 MB) for its next
# write, dropping the oldest beyond: an outage of hours must not fill the memory.
MAX_UNSENT_METRICS = 100_000

# A call to the store that raises is tried again after each of these waits, then skipped
# (:func:`try_tracking`): 2.5 s of waiting in all, against a SQLite store's brief locks (a
# backup copying the file, `mlflow gc`, another run's commit). On a SQLite store each try also
# waits up to 20 s for a lock by itself (MLflow sets ``PRAGMA busy_timeout = 20000``), so a
# call gives up after about a minute at most.
RETRY_DELAYS_S = (0.5, 2.0)
# How to run without the store, named by every message about a store that fails.
TRACKING_OFF = "kedro run --params tracking.enabled=false"

# Tags of every tracked run: the process that tracks into it, for end_stale_runs. A PID means
# something only within its host and PID namespace (containers on one host may share its
# hostname, with --network host, and not their PIDs).
PID_TAG = "creditflow.pid"
HOST_TAG = "creditflow.host"
PID_NAMESPACE_TAG = "creditflow.pid_namespace"
# A RUNNING run whose process cannot be checked (another host, or no PID_TAG) is taken for
# dead when it has logged nothing for this long: a live run writes its steps every few seconds.
STALE_AFTER_S = 24 * 3600.0
# A live process holding a stale run's PID is the run's own only if it started before the run
# (by MLflow's clock, within this slack: /proc's boot time has whole seconds and follows clock
# steps); one started later got the PID after the run's process died.
PID_START_SLACK_S = 60.0

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


class TrackingStoreError(RuntimeError):
    """The MLflow tracking store cannot be opened; the message names it (credentials
    redacted) and says how to run without it."""


def safe_uri(uri: str) -> str:
    """``uri`` as it may be logged: the password and the query's values ``[REDACTED]``.

    >>> safe_uri("http://alice:pw-1234@mlflow.lab:5000/x?token=abc")
    'http://alice:[REDACTED]@mlflow.lab:5000/x?token=%5BREDACTED%5D'
    >>> safe_uri("sqlite:////work/p/mlruns/mlflow.db")
    'sqlite:////work/p/mlruns/mlflow.db'
    """
    # Replaced in place: urlunsplit would write sqlite:////x as sqlite://x.
    parts, shown = urlsplit(uri), uri
    if parts.password is not None:
        user = parts.netloc.rpartition("@")[0]
        shown = shown.replace(f"{user}@", f"{user.partition(':')[0]}:[REDACTED]@", 1)
    if parts.query:
        query = urlencode([(key, "[REDACTED]") for key, _ in parse_qsl(parts.query)])
        shown = shown.replace(f"?{parts.query}", f"?{query}", 1)
    return shown


def describe_error(error: BaseException, tracking_uri: str) -> str:
    """``error`` in one line for a message about ``tracking_uri``'s store: its first line
    (SQLAlchemy appends the SQL and a link), cut at 600 characters, the URI's password out
    (MLflow's HTTP errors quote the URI whole)."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else ""
    password = urlsplit(tracking_uri).password
    if password:
        text = text.replace(password, "[REDACTED]")
    if len(text) > 600:  # MLflow's HTTP errors end with the cause: "Connection refused"
        text = text[:600] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def with_retries(call: Callable[[], T]) -> T:
    """``call()``, tried again after each wait of :data:`RETRY_DELAYS_S` while it raises; its
    last error is raised. A ``ValueError`` / ``TypeError`` is raised at once: a call that is
    wrong, not a store that hiccupped, fails the same way every time."""
    for delay in RETRY_DELAYS_S:
        try:
            return call()
        except (RunInterrupted, ValueError, TypeError):
            raise
        except Exception:
            time.sleep(delay)
    return call()


# Calls try_tracking skipped in this process, by kind, and the (kind, error type) warned of.
_SKIPPED: Counter[str] = Counter()
_WARNED: set[tuple[str, str]] = set()
_SKIPPED_LOCK = threading.Lock()


def try_tracking(what: str, call: Callable[[], object], tracking_uri: str, kind: str = "") -> bool:
    """Make the call ``call`` to the store at ``tracking_uri`` (:func:`with_retries`); whether
    it succeeded.

    A call that still fails is skipped, as the run does not need it: training never stops
    because its tracker did. The first failure of a ``kind`` (default: ``what``) with a given
    error type is logged as a warning that names the store and :data:`TRACKING_OFF`, the
    repeats at DEBUG; :func:`take_skipped` counts them. ``what`` completes "could not ...".
    """
    try:
        with_retries(call)
        return True
    except RunInterrupted:
        raise
    except Exception as error:
        kind = kind or what
        with _SKIPPED_LOCK:
            _SKIPPED[kind] += 1
            first = (kind, type(error).__name__) not in _WARNED
            _WARNED.add((kind, type(error).__name__))
        tries = len(RETRY_DELAYS_S) + 1
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "MLflow tracking store %s: could not %s (%s, %d tries); skipped, the run is not "
            "stopped for it%s. "
            "To run without tracking: %s",
            safe_uri(tracking_uri),
            what,
            describe_error(error, tracking_uri),
            tries,
            " (further failures of this kind are logged at DEBUG)" if first else "",
            TRACKING_OFF,
        )
        return False


def take_skipped() -> dict[str, int]:
    """The calls :func:`try_tracking` skipped since the last call, by kind; after it, the
    next failure of every kind is warned of again (a new run's)."""
    with _SKIPPED_LOCK:
        skipped = dict(_SKIPPED)
        _SKIPPED.clear()
        _WARNED.clear()
    return skipped


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
            due = time.monotonic() >= pending.next_write_at
        if due:
            self.flush()

    def flush(self) -> None:
        """Write the steps not written yet, never raising. What the store still refuses after
        :func:`try_tracking`'s retries is kept (up to :data:`MAX_UNSENT_METRICS` values) for
        the next write, which a step makes no sooner than :data:`HOLD_OFF_S` later."""
        pending = _pending(self)
        started = time.monotonic()
        with pending.lock:
            rows, pending.rows = pending.rows, []
            unsent, pending.unsent = pending.unsent, []
            pending.next_write_at = started + self.flush_every_s
        if not rows and not unsent:
            return
        from mlflow.entities import Metric  # noqa: PLC0415 - only tracked runs import MLflow

        metrics = unsent + [
            Metric(self.key(name), value, timestamp_ms, step)
            for step, timestamp_ms, values in rows
            for name, value in values.items()
        ]
        for start in range(0, len(metrics), _MAX_METRICS_PER_BATCH):
            batch = metrics[start : start + _MAX_METRICS_PER_BATCH]
            log = functools.partial(_log_batch, self.tracking_uri, self.run_id, batch)
            if not try_tracking("log step metrics", log, self.tracking_uri):
                self._keep(pending, metrics[start:])
                return

    def _keep(self, pending: _Pending, refused: list[Metric]) -> None:
        with pending.lock:
            kept = refused + pending.unsent
            pending.dropped += max(0, len(kept) - MAX_UNSENT_METRICS)
            pending.unsent = kept[-MAX_UNSENT_METRICS:]
            pending.next_write_at = time.monotonic() + max(self.flush_every_s, HOLD_OFF_S)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name


@dataclass
class _Pending:
    """A step logger's steps not yet written: (step, timestamp ms, values) each."""

    rows: list[tuple[int, int, dict[str, float]]] = field(default_factory=list)
    unsent: list[Metric] = field(default_factory=list)  # refused by the store, oldest first
    dropped: int = 0  # refused values dropped beyond MAX_UNSENT_METRICS
    next_write_at: float = -math.inf  # time.monotonic() from which a step writes
    lock: threading.Lock = field(default_factory=threading.Lock)


def _log_batch(tracking_uri: str, run_id: str, metrics: list[Metric]) -> None:
    client(tracking_uri).log_batch(run_id, metrics=metrics)


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
            pending = _PENDING.get(step_logger)
        if pending is not None:
            step_logger.flush()
            with _PENDING_LOCK:
                del _PENDING[step_logger]
            lost = len(pending.unsent) + pending.dropped
            if lost:
                logger.warning(
                    "MLflow run %s misses %d metric values of %s: the store %s kept refusing them",
                    step_logger.run_id,
                    lost,
                    step_logger.prefix or "its steps",
                    safe_uri(step_logger.tracking_uri),
                )


def log_artifact(mlflow_client: MlflowClient, run_id: str, name: str, data: Any) -> list[str]:
    """Log the data saved as dataset ``name``; returns the artifact paths written.

    A pandas DataFrame (a ``TABLE_SUFFIXES`` table, e.g. ``*_comparison``) becomes
    ``<name>.csv``; a page (``*_html``: HTML text) ``<name>.html``; a plot (``*_plot`` /
    ``*_curves``: a matplotlib Figure, a PIL image or PNG bytes) becomes ``<name>.png``, and a
    list or dict of them (as kedro-datasets' MatplotlibDataset saves)
    ``<name>/<index or key>.png``. A file the store refuses is skipped (:func:`try_tracking`)
    and left out of the paths returned.

    Raises:
        ValueError: anything else, naming what is expected; nothing is logged then.
    """
    written = []
    for artifact_file, log in _artifact_calls(mlflow_client, run_id, name, data):
        what = f"log artifact {artifact_file}"
        if try_tracking(what, log, mlflow_client.tracking_uri, kind="log artifacts"):
            written.append(artifact_file)
    return written


def _artifact_calls(
    mlflow_client: MlflowClient, run_id: str, name: str, data: Any
) -> list[tuple[str, Callable[[], object]]]:
    """(artifact file, the client call that logs it) for each file of ``data``; the types are
    all checked before anything is logged."""
    import pandas as pd  # noqa: PLC0415 - pandas only when a table is logged

    if isinstance(data, pd.DataFrame):
        file, text = f"{name}.csv", data.to_csv(index=False)
        return [(file, functools.partial(mlflow_client.log_text, run_id, text, file))]
    if isinstance(data, str) and name.endswith(PAGE_SUFFIXES):
        file = f"{name}.html"
        return [(file, functools.partial(mlflow_client.log_text, run_id, data, file))]
    if isinstance(data, Mapping):
        items = [(f"{name}/{key}.png", value) for key, value in data.items()]
    elif isinstance(data, list | tuple):
        items = [(f"{name}/{index}.png", value) for index, value in enumerate(data)]
    else:
        items = [(f"{name}.png", data)]
    return [(file, _plot_call(mlflow_client, run_id, file, plot)) for file, plot in items]


def _plot_call(
    mlflow_client: MlflowClient, run_id: str, artifact_file: str, plot: Any
) -> Callable[[], object]:
    from matplotlib.figure import Figure  # noqa: PLC0415 - matplotlib only when a plot is logged
    from PIL import Image  # noqa: PLC0415 - PIL only when an image is logged

    if isinstance(plot, Figure):
        return functools.partial(mlflow_client.log_figure, run_id, plot, artifact_file)
    if isinstance(plot, Image.Image):
        return functools.partial(mlflow_client.log_image, run_id, plot, artifact_file=artifact_file)
    if isinstance(plot, bytes) and plot.startswith(_PNG_MAGIC):
        return functools.partial(_log_png, mlflow_client, run_id, artifact_file, plot)
    raise ValueError(
        f"{artifact_file}: a table to log must be a pandas DataFrame and a plot a matplotlib "
        f"Figure, a PIL image or PNG bytes (or a list / dict of them); got "
        f"{type(plot).__name__}"
    )


def _log_png(mlflow_client: MlflowClient, run_id: str, artifact_file: str, png: bytes) -> None:
    artifact_path, _, file_name = artifact_file.rpartition("/")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / file_name
        path.write_bytes(png)
        mlflow_client.log_artifact(run_id, str(path), artifact_path or None)


# ------------------------------------------------------------------ runs a killed process left
def process_tags() -> dict[str, str]:
    """The tags that name the process tracking into a run: :data:`PID_TAG`, :data:`HOST_TAG`
    and, where Linux has one, :data:`PID_NAMESPACE_TAG`."""
    return {PID_TAG: str(os.getpid()), **_machine_tags()}


def _machine_tags() -> dict[str, str]:
    """Where this process's PIDs mean something: the host and its PID namespace."""
    try:
        namespace = {PID_NAMESPACE_TAG: os.readlink("/proc/self/ns/pid")}  # "pid:[4026531836]"
    except OSError:
        namespace = {}
    return {HOST_TAG: socket.gethostname(), **namespace}


def tag_process(tracking_uri: str, run_id: str) -> None:
    """Tag run ``run_id`` of the store at ``tracking_uri`` with :func:`process_tags`."""
    from mlflow.entities import RunTag  # noqa: PLC0415 - only tracked runs import MLflow

    tags = [RunTag(key, value) for key, value in process_tags().items()]
    client(tracking_uri).log_batch(run_id, tags=tags)


def is_stale(
    run: Run, current_run_id: str, now_ms: int, machine: Mapping[str, str] | None = None
) -> bool:
    """Whether ``run`` is ``RUNNING`` although the process that tracked into it is gone.

    SIGKILL (the OOM killer, ``kill -9``, a lost node) ends a process before any hook runs,
    so its run stays RUNNING. The same project may be running elsewhere at the same time,
    though, and its run is RUNNING too; so a run counts as stale only when its process is
    known to be gone:

    - its :data:`HOST_TAG` and :data:`PID_NAMESPACE_TAG` are this ``machine``'s (default:
      this process's, as :func:`process_tags` writes them): its :data:`PID_TAG` names no live
      process, or one that started after the run (the PID was reused), or this very process,
      which tracks one run at a time, ``current_run_id``;
    - another host or namespace, or no tags, where the process cannot be checked: it neither
      started nor logged a metric for :data:`STALE_AFTER_S`.
    """
    if run.info.status != "RUNNING" or run.info.run_id == current_run_id:
        return False
    tags, machine = run.data.tags, machine or _machine_tags()
    pid = tags.get(PID_TAG, "")
    here = all(tags.get(key) == machine.get(key) for key in (HOST_TAG, PID_NAMESPACE_TAG))
    if here and pid.isdigit():
        return not _owns_run(int(pid), run.info.start_time)
    return now_ms - last_activity_ms(run) > STALE_AFTER_S * 1000


def last_activity_ms(run: Run) -> int:
    """When ``run`` last logged, in ms since the epoch: its newest metric or its start."""
    # RunData keeps each metric's newest timestamp only in its proto (metrics maps keys to values).
    stamps = [metric.timestamp for metric in run.data.to_proto().metrics]
    return max([run.info.start_time or 0, *stamps])


def _owns_run(pid: int, run_started_ms: int | None) -> bool:
    """Whether process ``pid`` of this host may be the one that started a run at
    ``run_started_ms``."""
    if pid == os.getpid():
        return False
    if os.name != "posix":
        return True  # os.kill(pid, 0) would not probe it there: taken for alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    started = _process_started_at(pid)
    if started is None or run_started_ms is None:
        return True
    return started <= run_started_ms / 1000 + PID_START_SLACK_S


def _process_started_at(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch (Linux's /proc); None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/stat").read_text()
    except OSError:
        return None
    boot_s = next(
        (int(line.split()[1]) for line in boot.splitlines() if line.startswith("btime")), None
    )
    # The command name (field 2) is in parentheses and may hold spaces: fields from the last ")".
    fields = stat.rpartition(")")[2].split()
    if boot_s is None or len(fields) < 20:
        return None
    return boot_s + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime


def end_stale_runs(
    mlflow_client: MlflowClient, experiment_id: str, current_run_id: str
) -> list[str]:
    """Close ``KILLED`` every stale run (:func:`is_stale`) of the experiment, at the time it
    last logged; returns their ids."""
    runs = mlflow_client.search_runs(
        [experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000
    )
    now_ms, machine = int(time.time() * 1000), _machine_tags()
    stale = [run for run in runs if is_stale(run, current_run_id, now_ms, machine)]
    for run in stale:
        mlflow_client.set_terminated(run.info.run_id, "KILLED", end_time=last_activity_ms(run))
        logger.warning(
            "MLflow run %s (process %s on host %s) is RUNNING with no live process behind it: "
            "marked KILLED, ended when it last logged",
            run.info.run_id,
            run.data.tags.get(PID_TAG, "unknown"),
            run.data.tags.get(HOST_TAG, "unknown"),
        )
    return [run.info.run_id for run in stale]
