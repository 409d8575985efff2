"""MLflow tracking: kedro-mlflow's run through MlflowTrackingHook in real ``KedroSession`` runs
of a tiny training pipeline (the project's conf and settings, in tmp_path, which is also the
working directory: the store is tmp_path/mlruns/mlflow.db), and creditflow.tracking's helpers.
"""

import json
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import mlflow
import pandas as pd
import pytest
import torch
from kedro.framework.hooks import hook_impl
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from kedro.pipeline import Node, Pipeline
from kedro_mlflow.framework.hooks import MlflowHook
from matplotlib.figure import Figure
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient

from creditflow import tracking
from creditflow.errors import RunInterrupted
from creditflow.hooks import parameter_check
from creditflow.hooks.run_manifest import MANIFEST_DIR
from creditflow.redaction import REDACTED
from creditflow.tracking import StepLogger, active_step_logger, logging_steps
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.supervised import SupervisedConfig, SupervisedTrainer

matplotlib.use("Agg")
pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 4
SECRET = "sk-mlflow-0123456789abcdef"
RUNTIME_PARAMS = {
    # The node's parameters with a secret-named leaf, and a group no node reads: it reaches
    # kedro-mlflow only as run_params["runtime_params"], which kedro-mlflow logs as a tag.
    "tiny": {"learning_rate": 0.1, "service": {"api_key": SECRET, "url": "http://x"}},
    "unused": {"token": SECRET},
}


def train_tiny(params: dict) -> tuple[pd.DataFrame, pd.DataFrame, Figure]:
    """Stands in for a training node: a linear model trained for STEPS supervised steps that,
    before each step, counts the points of its loss curve already in MLflow."""
    run_id = mlflow.active_run().info.run_id  # kedro-mlflow's run, active in the node's thread
    client = MlflowClient(mlflow.get_tracking_uri())
    x = torch.arange(8.0).view(4, 2)  # (4, 2)
    y = x.sum(dim=1, keepdim=True)  # (4, 1)
    model = torch.nn.Linear(2, 1)
    seen: list[int] = []

    def loss_fn(rows: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        seen.append(len(client.get_metric_history(run_id, "tiny_train/train/loss")))
        loss = ((model(x[rows]) - y[rows]) ** 2).mean()
        return loss, {"train/loss": loss.item()}

    config = SupervisedConfig(steps=STEPS, batch_size=2, learning_rate=params["learning_rate"])
    trainer = SupervisedTrainer(model, 4, lambda rows: rows, loss_fn, config, progress=False)
    metrics = pd.DataFrame(trainer.train()).assign(seen_in_mlflow=seen)
    comparison = pd.DataFrame({"policy": ["sft", "grpo"], "accuracy": [0.25, 0.5]})
    figure = Figure()
    figure.add_subplot().plot(metrics["step"], metrics["train/loss"])
    return metrics, comparison, figure


def diverge(metrics: pd.DataFrame) -> None:
    raise FloatingPointError("loss is nan")


def stop_with_sigterm(metrics: pd.DataFrame) -> None:
    """Stands in for whoever stops a run (a scheduler, ``docker stop``): SIGTERM to this
    process while the node runs."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)  # the handler raises during the sleep


def probe_step_logger() -> str:
    """What a training loop built in this node would log to."""
    return repr(active_step_logger())


TRAIN = Node(
    train_tiny,
    "params:tiny",
    ["tiny_train_metrics", "tiny_comparison", "tiny_reward_curves"],
    name="train_tiny",
)
PIPELINES = {
    "tiny": Pipeline([TRAIN]),
    "failing": Pipeline([TRAIN, Node(diverge, "tiny_train_metrics", None, name="diverge")]),
    "stopped": Pipeline([TRAIN, Node(stop_with_sigterm, "tiny_train_metrics", None, name="stop")]),
    "probe": Pipeline([Node(probe_step_logger, None, "step_logger", name="probe")]),
}


@pytest.fixture
def project(project_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The project's conf/base and settings in tmp_path, with the tiny pipelines registered
    and the working directory in tmp_path/elsewhere."""
    shutil.copytree(project_root / "conf/base", tmp_path / "conf/base")
    shutil.copy(project_root / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "conf/local").mkdir()
    (tmp_path / "src").mkdir()  # bootstrap_project checks it; the package is installed
    # Another working directory: mlflow.yml's relative SQLite URI is the project's, not the cwd's.
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.delenv(tracking.STEP_LOGGER_ENV, raising=False)
    bootstrap_project(tmp_path)
    monkeypatch.setattr("creditflow.pipeline_registry.register_pipelines", lambda: PIPELINES)
    # The tiny groups have no schema in creditflow.pipelines.parameters and come only from
    # --params (no conf file defines them); not under test here.
    for check in ("after_context_created", "before_pipeline_run"):
        monkeypatch.setattr(parameter_check.ParameterCheckHook, check, lambda *a, **k: None)
    return tmp_path


def run_session(project: Path, pipeline: str, runtime_params: dict) -> tuple[str, dict]:
    """Run ``pipeline`` in a KedroSession; its id and its free outputs' data."""
    with KedroSession.create(project_path=project, runtime_params=runtime_params) as session:
        outputs = session.run(pipeline_names=[pipeline])
        return session.session_id, {name: dataset.load() for name, dataset in outputs.items()}


def store(project: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")


def runs(project: Path) -> list:
    client = store(project)
    return client.search_runs([client.get_experiment_by_name("creditflow").experiment_id])


def test_session_run_logs_live_steps_redacted_params_and_artifacts(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every step written as it ends (the tiny steps take milliseconds, under FLUSH_EVERY_S).
    monkeypatch.setattr(tracking, "FLUSH_EVERY_S", 0.0)
    session_id, outputs = run_session(project, "tiny", RUNTIME_PARAMS)

    # One run: kedro-mlflow's own hook is disabled in settings.py, only the wrapped one runs.
    (run,) = runs(project)
    client, run_id = store(project), run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "tiny" and run.data.tags["run_id"] == session_id

    # Live: before step k + 1 the node found k points in MLflow, i.e. each step was logged as
    # it ended, not when the node returned.
    assert outputs["tiny_train_metrics"]["seen_in_mlflow"].tolist() == list(range(STEPS))
    history = client.get_metric_history(run_id, "tiny_train/train/loss")
    table = outputs["tiny_train_metrics"]
    assert sorted((m.step, m.value) for m in history) == list(
        zip(table["step"], table["train/loss"], strict=True)
    )
    lr_steps = sorted(m.step for m in client.get_metric_history(run_id, "tiny_train/lr"))
    assert lr_steps == list(range(1, STEPS + 1))
    assert set(run.data.metrics) == {"tiny_train/train/loss", "tiny_train/lr"}

    # Params flattened with dots, the secret-named one redacted; the secret is in no param or tag.
    assert run.data.params["tiny.learning_rate"] == "0.1"
    assert run.data.params["tiny.service.url"] == "http://x"
    assert run.data.params["tiny.service.api_key"] == REDACTED
    assert REDACTED in run.data.tags["runtime_params"]
    assert SECRET not in json.dumps([run.data.params, run.data.tags])

    # The result table as CSV and the plot as PNG, stored under the project's mlruns/.
    paths = {a.path for a in client.list_artifacts(run_id)}
    assert paths == {"tiny_comparison.csv", "tiny_reward_curves.png"}
    csv = Path(client.download_artifacts(run_id, "tiny_comparison.csv", str(project)))
    assert pd.read_csv(csv).equals(outputs["tiny_comparison"])
    png = Path(client.download_artifacts(run_id, "tiny_reward_curves.png", str(project)))
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert run.info.artifact_uri == f"{(project / 'mlruns').as_uri()}/{run_id}/artifacts"
    assert list((project / "elsewhere").iterdir()) == []
    # Nothing is left behind for the process's next session.
    assert mlflow.active_run() is None
    assert tracking.STEP_LOGGER_ENV not in os.environ


def test_failed_run_is_marked_failed_and_keeps_its_steps(project: Path) -> None:
    # At the default FLUSH_EVERY_S the tiny steps are written when their node ends.
    with pytest.raises(FloatingPointError):
        run_session(project, "failing", RUNTIME_PARAMS)
    (run,) = runs(project)
    assert run.info.status == "FAILED"
    assert len(store(project).get_metric_history(run.info.run_id, "tiny_train/train/loss")) == 4
    assert mlflow.active_run() is None and active_step_logger() is None


def test_a_sigterm_ends_the_run_killed_with_an_interrupted_manifest(project: Path) -> None:
    """Before: SIGTERM's default action ended the process at once, with no manifest and the
    MLflow run RUNNING. Now hooks.termination.SigtermHook raises RunInterrupted in the node,
    the run is closed KILLED, the manifest says interrupted, and the handler that was there
    before the run (here a stand-in that would record a SIGTERM the hook missed) is back."""
    missed = []
    previous = signal.signal(signal.SIGTERM, lambda *args: missed.append(args))
    try:
        with KedroSession.create(project_path=project, runtime_params=RUNTIME_PARAMS) as session:
            with pytest.raises(RunInterrupted, match="SIGTERM received"):
                session.run(pipeline_names=["stopped"])
            session_id = session.session_id
        handler_after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert missed == [] and handler_after is not None and handler_after.__name__ == "<lambda>"
    (run,) = runs(project)
    assert run.info.status == "KILLED" and run.info.end_time is not None
    assert len(store(project).get_metric_history(run.info.run_id, "tiny_train/train/loss")) == 4
    manifest = json.loads((project / MANIFEST_DIR / f"{session_id}.json").read_text())
    assert manifest["status"] == "interrupted"
    assert manifest["error"].startswith("RunInterrupted: SIGTERM received")
    assert mlflow.active_run() is None


# Two of these start at once: each imports MLflow, says it is ready, waits for the other, then
# creates the store (before the lock, one of the two failed in MLflow's migrations with
# "duplicate column name: step" or "table ... already exists", 3 times out of 3 here).
CREATE_STORE = """
import sys, time
from pathlib import Path
import mlflow.tracking
from creditflow import tracking
folder, me = Path(sys.argv[1]), sys.argv[2]
(folder / f"ready-{me}").touch()
while len(list(folder.glob("ready-*"))) < 2:
    time.sleep(0.001)
tracking.create_sqlite_store(f"sqlite:///{folder}/mlruns/mlflow.db")
print("created")
"""


@pytest.mark.slow  # two processes import MLflow; one migrates the store, the other waits
def test_two_processes_creating_a_new_store_at_once_both_succeed(tmp_path: Path) -> None:
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CREATE_STORE, str(tmp_path), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert all(output.strip().endswith("created") for output in outputs), outputs
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    assert [e.name for e in client.search_experiments()] == ["Default"]


def test_tracking_off_opens_no_store(project: Path) -> None:
    _, outputs = run_session(project, "probe", {"tracking": {"enabled": False}})
    assert outputs["step_logger"] == "None"
    assert not (project / "mlruns").exists()


def test_kedro_mlflow_disable_tracking_pipelines(project: Path) -> None:
    # conf/local/mlflow.yml replaces conf/base's top-level `tracking` section as a whole.
    (project / "conf/local/mlflow.yml").write_text(
        "tracking:\n  experiment: {name: creditflow}\n  disable_tracking: {pipelines: [probe]}\n"
    )
    _, outputs = run_session(project, "probe", {})
    assert outputs["step_logger"] == "None"
    assert runs(project) == []


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"tracking": {"enabled": "no"}}, "tracking.enabled must be true or false"),
        ({"tracking": {"tracking_uri": "mlruns"}}, "live in conf/base/mlflow.yml"),
    ],
)
def test_tracking_switch_is_checked(parameters: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tracking.tracking_enabled(parameters)


# ------------------------------------------------------------------ the step logger alone
@pytest.fixture
def mlflow_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[MlflowClient, str, str]:
    """(client, run id, tracking URI) of a run in a SQLite store in tmp_path, also the working
    directory, where the store's default artifact root resolves."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(tracking.STEP_LOGGER_ENV, raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    return client, client.create_run(client.create_experiment("unit")).info.run_id, uri


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_step_logger_logs_each_call_at_once(mlflow_run) -> None:
    client, run_id, uri = mlflow_run
    step_logger = StepLogger(uri, run_id, prefix="tiny_sft", flush_every_s=0)
    step_logger(1, {"step": 1, "sft/loss": 2.0, "ok": True, "eval/acc": float("nan")})
    assert _history(client, run_id, "tiny_sft/sft/loss") == [(1, 2.0)]
    step_logger(2, {"step": 2, "sft/loss": 1.5, "eval/acc": 0.75})
    assert _history(client, run_id, "tiny_sft/sft/loss") == [(1, 2.0), (2, 1.5)]
    # NaN is "not measured at this step", booleans count 0 / 1, "step" is the x axis.
    assert _history(client, run_id, "tiny_sft/eval/acc") == [(2, 0.75)]
    assert _history(client, run_id, "tiny_sft/ok") == [(1, 1.0)]
    assert set(client.get_run(run_id).data.metrics) == {
        "tiny_sft/sft/loss",
        "tiny_sft/ok",
        "tiny_sft/eval/acc",
    }


def test_step_logger_writes_at_most_every_flush_every_s(mlflow_run, monkeypatch) -> None:
    client, run_id, uri = mlflow_run
    now = [100.0]
    monkeypatch.setattr(tracking.time, "monotonic", lambda: now[0])
    step_logger = StepLogger(uri, run_id, flush_every_s=1.0)
    step_logger(1, {"loss": 3.0})  # the first step at once
    step_logger(2, {"loss": 2.0})
    now[0] += 0.5
    step_logger(3, {"loss": 1.0})
    assert _history(client, run_id, "loss") == [(1, 3.0)]
    now[0] += 0.5  # a second after the last write: steps 2 to 4 in one batch
    step_logger(4, {"loss": 0.5})
    assert [step for step, _ in _history(client, run_id, "loss")] == [1, 2, 3, 4]
    step_logger(5, {"loss": 0.25})
    with logging_steps(step_logger):
        pass  # the end of a node's block writes what is left
    assert [step for step, _ in _history(client, run_id, "loss")] == [1, 2, 3, 4, 5]


def test_step_logger_is_silent_off_rank_zero(mlflow_run, monkeypatch) -> None:
    client, run_id, uri = mlflow_run
    monkeypatch.setenv("RANK", "1")
    StepLogger(uri, run_id)(1, {"loss": 1.0})
    assert client.get_run(run_id).data.metrics == {}


def test_logging_steps_reaches_loops_and_spawned_processes(mlflow_run) -> None:
    _, run_id, uri = mlflow_run
    step_logger = StepLogger(uri, run_id, "x")
    assert active_step_logger() is None
    with logging_steps(step_logger):
        assert active_step_logger() is step_logger
        # A spawned data-parallel worker has none of this process's context, only its
        # environment.
        exported = json.loads(os.environ[tracking.STEP_LOGGER_ENV])
        assert StepLogger(**exported) == step_logger
    assert active_step_logger() is None
    assert tracking.STEP_LOGGER_ENV not in os.environ


def test_supervised_trainer_replays_a_resumed_run_into_a_new_mlflow_run(
    mlflow_run, tmp_path: Path
) -> None:
    client, first, uri = mlflow_run
    second = client.create_run(client.get_run(first).info.experiment_id).info.run_id
    x = torch.ones(4, 2)  # (4, 2)
    model = torch.nn.Linear(2, 1)
    calls = []

    def loss_fn(rows: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        calls.append(rows)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the first run is stopped during its third step
        loss = model(x[rows]).pow(2).mean()
        return loss, {"sft/loss": loss.item()}

    def train(run_id: str) -> None:
        config = SupervisedConfig(steps=3, batch_size=2, learning_rate=0.1, checkpoint_every=1)
        checkpoints = CheckpointStore(tmp_path / "checkpoints")
        with logging_steps(StepLogger(uri, run_id, "sft")):  # as the hook does for a node
            trainer = SupervisedTrainer(
                model, 4, lambda rows: rows, loss_fn, config, checkpoints, progress=False
            )
            trainer.train()

    with pytest.raises(KeyboardInterrupt):
        train(first)
    assert [step for step, _ in _history(client, first, "sft/sft/loss")] == [1, 2]
    # Resumed from step 2 by a later kedro run: its MLflow run has the whole curve too.
    train(second)
    assert _history(client, second, "sft/sft/loss")[:2] == _history(client, first, "sft/sft/loss")
    assert [step for step, _ in _history(client, second, "sft/sft/loss")] == [1, 2, 3]


# ------------------------------------------------------------------ artifacts
def test_log_artifact_tables_plots_and_bad_types(mlflow_run, tmp_path: Path) -> None:
    client, run_id, _ = mlflow_run
    table = pd.DataFrame({"ranker": ["logged"], "true_ndcg": [0.5]})
    written = tracking.log_artifact(client, run_id, "reranker_evaluation", table)
    assert written == ["reranker_evaluation.csv"]
    figures = {"reward": Figure(), "kl": Figure()}
    assert tracking.log_artifact(client, run_id, "grpo_curves", figures) == [
        "grpo_curves/reward.png",
        "grpo_curves/kl.png",
    ]
    written = tracking.log_artifact(client, run_id, "raw_plot", [PNG_MAGIC + b"rest"])
    assert written == ["raw_plot/0.png"]
    saved = Path(client.download_artifacts(run_id, "raw_plot/0.png", str(tmp_path)))
    assert saved.read_bytes() == PNG_MAGIC + b"rest"
    csv = Path(client.download_artifacts(run_id, "reranker_evaluation.csv", str(tmp_path)))
    assert csv.read_text() == "ranker,true_ndcg\nlogged,0.5\n"
    page = "<html><body>credit</body></html>"
    assert tracking.log_artifact(client, run_id, "tapo_token_credit_html", page) == [
        "tapo_token_credit_html.html"
    ]
    html = client.download_artifacts(run_id, "tapo_token_credit_html.html", str(tmp_path))
    assert Path(html).read_text() == page
    with pytest.raises(ValueError, match="a plot a matplotlib Figure, a PIL image or PNG"):
        tracking.log_artifact(client, run_id, "bad_plot", "not a figure")


# ------------------------------------------------------------------ a store that fails
# What MLflow raises when another connection holds the SQLite store's exclusive lock past its
# busy timeout (mlflow.store.db.utils wraps SQLAlchemy's OperationalError so).
LOCKED = "(sqlite3.OperationalError) database is locked"
STORE_WRITES = ("log_batch", "log_metric", "log_param", "set_tag", "update_run_info")


class StoreLock:
    """While held, every write to a SQLite store fails as under another process's exclusive
    lock (``BEGIN EXCLUSIVE``); reads go through. ``attempts`` counts the writes refused."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
        self.held, self.attempts, self.error = False, 0, error
        for name in STORE_WRITES:
            monkeypatch.setattr(SqlAlchemyStore, name, self._locked(getattr(SqlAlchemyStore, name)))

    def _locked(self, write):
        def locked_write(store, *args, **kwargs):
            if self.held:
                self.attempts += 1
                raise self.error
            return write(store, *args, **kwargs)

        return locked_write


class LockBeforeNode:
    """A hook that takes the store's lock as node ``name`` starts (it runs before the
    project's hooks, registered after them)."""

    def __init__(self, lock: StoreLock, name: str) -> None:
        self.lock, self.name = lock, name

    @hook_impl
    def before_node_run(self, node) -> None:
        if node.name == self.name:
            self.lock.held = True


@pytest.fixture
def no_retry_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking, "RETRY_DELAYS_S", (0.0, 0.0))
    tracking.take_skipped()


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


@pytest.mark.parametrize(
    "error",
    [
        MlflowException(LOCKED, error_code=TEMPORARILY_UNAVAILABLE),
        sqlite3.OperationalError("database is locked"),
    ],
    ids=["mlflow", "sqlite3"],
)
def test_a_locked_store_neither_stops_the_step_logger_nor_loses_its_steps(
    mlflow_run, monkeypatch, caplog, no_retry_waits, error
) -> None:
    client, run_id, uri = mlflow_run
    lock = StoreLock(monkeypatch, error)
    now = [100.0]
    monkeypatch.setattr(tracking.time, "monotonic", lambda: now[0])
    step_logger = StepLogger(uri, run_id, flush_every_s=0)
    caplog.set_level(logging.DEBUG, logger="creditflow.tracking")

    lock.held = True
    for step in range(1, 5):
        step_logger(step, {"loss": 1.0 / step})  # raises nothing
    # Step 1 was tried 3 times (RETRY_DELAYS_S has 2 waits) and kept; steps 2 to 4 were held
    # off (HOLD_OFF_S), not tried once each.
    assert lock.attempts == 3
    (warning,) = _warnings(caplog, "could not log step metrics")
    assert uri.removeprefix("sqlite:///") in warning and "database is locked" in warning
    assert "--params tracking.enabled=false" in warning
    assert _history(client, run_id, "loss") == []

    lock.held = False
    now[0] += tracking.HOLD_OFF_S
    step_logger(5, {"loss": 0.2})  # the lock has passed: everything kept is written
    assert [step for step, _ in _history(client, run_id, "loss")] == [1, 2, 3, 4, 5]

    # Locked again to the end of the node: warned of once only, then the loss is reported.
    lock.held = True
    now[0] += 1
    with logging_steps(step_logger):
        step_logger(6, {"loss": 0.1})
    assert len(_warnings(caplog, "could not log step metrics")) == 1
    assert _warnings(caplog, f"MLflow run {run_id} misses 1 metric values")
    assert tracking.take_skipped() == {"log step metrics": 3}


def test_a_step_logger_keeps_at_most_max_unsent_metrics(mlflow_run, monkeypatch, no_retry_waits):
    client, run_id, uri = mlflow_run
    lock = StoreLock(monkeypatch, MlflowException(LOCKED))
    monkeypatch.setattr(tracking, "MAX_UNSENT_METRICS", 3)
    step_logger = StepLogger(uri, run_id)
    lock.held = True
    for step in range(1, 6):
        step_logger(step, {"loss": float(step)})
        step_logger.flush()
    lock.held = False
    step_logger.flush()
    # The newest three kept; the two oldest dropped.
    assert [step for step, _ in _history(client, run_id, "loss")] == [3, 4, 5]


def test_a_store_locked_from_training_on_fails_no_node_and_keeps_the_manifest(
    project: Path, monkeypatch, caplog, no_retry_waits
) -> None:
    """The probe: the store locked while a node trains, and still when the run ends. The node
    trains, the run fails of its own error only, its manifest is written; the MLflow run stays
    RUNNING (its end could not be written) until the next run closes it KILLED."""
    monkeypatch.setattr(tracking, "FLUSH_EVERY_S", 0.0)
    lock = StoreLock(monkeypatch, MlflowException(LOCKED, error_code=TEMPORARILY_UNAVAILABLE))
    caplog.set_level(logging.INFO)
    with KedroSession.create(project_path=project, runtime_params=RUNTIME_PARAMS) as session:
        session._hook_manager.register(LockBeforeNode(lock, "train_tiny"))
        with pytest.raises(FloatingPointError, match="loss is nan"):
            session.run(pipeline_names=["failing"])
        first_id = session.session_id
    assert mlflow.active_run() is None and active_step_logger() is None
    manifest = json.loads((project / MANIFEST_DIR / f"{first_id}.json").read_text())
    assert manifest["status"] == "failed"
    assert manifest["error"] == "FloatingPointError: loss is nan"
    assert manifest["datasets"]["saved"].keys() >= {"tiny_train_metrics", "tiny_comparison"}
    # One warning per kind of failure, each naming the store and the switch, not one per step.
    store_path = str(project / "mlruns/mlflow.db")
    warned = [w for w in _warnings(caplog, "MLflow tracking store") if store_path in w]
    assert len(_warnings(caplog, "could not log step metrics")) == 1
    assert _warnings(caplog, "could not end the MLflow run FAILED")
    # Parameters, steps and the end of the run.
    assert len(warned) == 3 and all("tracking.enabled=false" in w for w in warned)
    assert _warnings(caplog, "is incomplete: the store refused")
    (run,) = runs(project)
    assert run.info.status == "RUNNING"
    assert run.data.tags[tracking.PID_TAG] == str(os.getpid())

    # The lock has passed. The next run of this process closes the run its process left
    # RUNNING, and files its own as ever.
    lock.held = False
    session_id, _ = run_session(project, "tiny", RUNTIME_PARAMS)
    statuses = {r.data.tags["run_id"]: r.info.status for r in runs(project)}
    assert statuses == {first_id: "KILLED", session_id: "FINISHED"}


def test_a_failing_tracker_hook_keeps_the_manifest_and_still_ends_the_run(
    project: Path, monkeypatch, caplog
) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("kedro-mlflow broke")

    monkeypatch.setattr(MlflowHook, "on_pipeline_error", broken)
    with KedroSession.create(project_path=project, runtime_params=RUNTIME_PARAMS) as session:
        with pytest.raises(FloatingPointError):
            session.run(pipeline_names=["failing"])
        session_id = session.session_id
    manifest = json.loads((project / MANIFEST_DIR / f"{session_id}.json").read_text())
    assert manifest["status"] == "failed"
    (run,) = runs(project)
    assert run.info.status == "FAILED" and mlflow.active_run() is None


def test_a_store_that_cannot_be_opened_names_itself_and_the_switch(
    project: Path, no_retry_waits
) -> None:
    (project / "mlruns").mkdir()
    (project / "mlruns/mlflow.db").write_text("not a database, but a note someone saved here")
    message = rf"MLflow tracking store sqlite:///{project}/mlruns/mlflow.db cannot be opened"
    with pytest.raises(tracking.TrackingStoreError, match=message) as raised:
        run_session(project, "probe", {})
    assert "file is not a database" in str(raised.value)
    assert "kedro run --params tracking.enabled=false" in str(raised.value)
    # The switch the message names runs the pipeline.
    _, outputs = run_session(project, "probe", {"tracking": {"enabled": False}})
    assert outputs["step_logger"] == "None"


def test_a_remote_store_is_named_without_its_password(project: Path, monkeypatch, no_retry_waits):
    password = "pw-s3cret-123"
    (project / "conf/local/mlflow.yml").write_text(
        f"server:\n  mlflow_tracking_uri: http://alice:{password}@127.0.0.1:9\n"
    )
    # Port 9 refuses at once; MLflow would retry for minutes by default.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with pytest.raises(tracking.TrackingStoreError) as raised:
        run_session(project, "probe", {})
    message = str(raised.value)
    assert "MLflow tracking store http://alice:[REDACTED]@127.0.0.1:9 cannot be opened" in message
    assert "Connection refused" in message and "tracking.enabled=false" in message
    assert password not in message


def test_safe_uri_redacts_passwords_and_query_values() -> None:
    assert tracking.safe_uri("postgresql://u:p4ss@db:5432/mlflow?sslpassword=x") == (
        "postgresql://u:[REDACTED]@db:5432/mlflow?sslpassword=%5BREDACTED%5D"
    )
    assert tracking.safe_uri("http://mlflow.lab:5000") == "http://mlflow.lab:5000"


# ------------------------------------------------------------------ runs a killed process left
def test_end_stale_runs_closes_only_runs_whose_process_is_gone(mlflow_run) -> None:
    """Each case of creditflow.tracking.is_stale, on runs in a real store."""
    client, current, _ = mlflow_run
    experiment_id = client.get_run(current).info.experiment_id
    now_ms, day_ms = int(time.time() * 1000), 24 * 3600 * 1000
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "120"])
    try:
        time.sleep(0.2)  # the sleep has started before the runs below

        def run(tags: dict, started_ms: int = now_ms, metric_ms: int | None = None) -> str:
            run_id = client.create_run(experiment_id, start_time=started_ms, tags=tags).info.run_id
            if metric_ms is not None:
                client.log_batch(run_id, metrics=[Metric("loss", 1.0, metric_ms, 1)])
            return run_id

        here = {k: v for k, v in tracking.process_tags().items() if k != tracking.PID_TAG}
        elsewhere = {tracking.HOST_TAG: "another-host", tracking.PID_TAG: "1"}
        cases = {
            run({**here, tracking.PID_TAG: str(dead.pid)}): "KILLED",  # gone
            run({**here, tracking.PID_TAG: str(alive.pid)}): "RUNNING",  # a concurrent run
            # This hostname, another container's PIDs: its process cannot be checked.
            run({**here, tracking.PID_NAMESPACE_TAG: "pid:[1]", tracking.PID_TAG: "1"}): "RUNNING",
            # The PID now belongs to a process started an hour after the run: reused.
            run({**here, tracking.PID_TAG: str(alive.pid)}, now_ms - 3600_000): "KILLED",
            run({**here, tracking.PID_TAG: str(os.getpid())}): "KILLED",  # this process's last
            run(elsewhere, now_ms - 2 * day_ms): "KILLED",  # silent for two days
            run(elsewhere, now_ms - 2 * day_ms, now_ms - 3600_000): "RUNNING",  # logs still
            run(elsewhere): "RUNNING",
            run({}, now_ms - 2 * day_ms): "KILLED",  # untagged: as another host's
            run({}): "RUNNING",
        }
        finished = run({**here, tracking.PID_TAG: str(dead.pid)})
        client.set_terminated(finished, "FINISHED")
        for key, value in tracking.process_tags().items():
            client.set_tag(current, key, value)

        ended = tracking.end_stale_runs(client, experiment_id, current)
    finally:
        alive.kill()
        alive.wait()
    statuses = {run_id: client.get_run(run_id).info.status for run_id in cases}
    assert statuses == cases
    assert sorted(ended) == sorted(r for r, status in cases.items() if status == "KILLED")
    assert client.get_run(current).info.status == "RUNNING"
    assert client.get_run(finished).info.status == "FINISHED"
    # A stale run ends when it last logged, not when it was found.
    old = next(r for r in ended if client.get_run(r).info.start_time == now_ms - 2 * day_ms)
    assert client.get_run(old).info.end_time == now_ms - 2 * day_ms


def test_a_run_is_tagged_with_its_process(project: Path) -> None:
    run_session(project, "probe", {})
    (run,) = runs(project)
    tags = tracking.process_tags()  # this process's id, host and PID namespace
    assert tags[tracking.PID_TAG] == str(os.getpid())
    assert tags[tracking.HOST_TAG] == socket.gethostname()
    assert {key: run.data.tags[key] for key in tags} == tags
