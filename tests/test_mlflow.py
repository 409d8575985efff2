"""MLflow tracking: the helpers of creditflow.tracking and MlflowTrackingHook on a tiny pipeline
logging to a file store in tmp_path."""

import math
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from kedro.io import DataCatalog
from kedro.pipeline import Node, Pipeline
from matplotlib.figure import Figure
from mlflow.tracking import MlflowClient

from creditflow.hooks import MlflowTrackingHook
from creditflow.tracking import (
    TrackingConfig,
    flatten_params,
    log_metrics,
    log_params,
    log_plots,
    make_client,
    metrics_from_frame,
)
from tests.test_hooks import run_like_session

matplotlib.use("Agg")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TRAIN = {"lr": 0.5, "schedule": {"warmup": 2}, "languages": ["en", "de"], "seed": 3}


def train_tiny(params: dict) -> tuple[pd.DataFrame, Figure, dict[str, float]]:
    """Stands in for a training node: per-step metrics, a curves figure, final eval metrics."""
    steps = list(range(3))
    metrics = pd.DataFrame(
        {
            "step": steps,
            "reward/total": [params["lr"] * step for step in steps],
            # Measured every other step only: NaN cells are not logged.
            "eval/accuracy": [0.25, math.nan, 0.75],
            "actor/kl": [0, 1, 4],
            "phase": ["warmup", "warmup", "main"],  # not numeric: not logged
        }
    )
    figure = Figure()
    figure.add_subplot().plot(steps, metrics["reward/total"])
    return metrics, figure, {"eval/final_accuracy": 0.75}


TINY = Pipeline(
    [
        Node(
            train_tiny,
            "params:train",
            ["tiny_train_metrics", "tiny_reward_curves", "tiny_eval_metrics"],
        )
    ]
)


def _parameters(**tracking) -> dict:
    return {"train": TRAIN, "tracking": {"tracking_uri": "mlruns"} | tracking}


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_tiny_pipeline_is_logged_per_step_with_params_and_plots(tmp_path: Path) -> None:
    hook = MlflowTrackingHook()
    parameters = _parameters(experiment_name="tiny")
    run_like_session([hook], TINY, DataCatalog(), parameters, tmp_path, run_id="kedro-run-1")
    assert hook.run_id is None  # the run was closed

    client = MlflowClient((tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "kedro-run-1" == run.data.tags["kedro.run_id"]
    assert run.data.params == {
        "train.lr": "0.5",
        "train.schedule.warmup": "2",
        "train.languages": "['en', 'de']",
        "train.seed": "3",
    }
    # Keys are prefixed by the dataset name less "_metrics", so that several tables with the
    # same columns in one run (one per strategy) keep separate histories.
    # reward/total = lr * step = 0.5 * [0, 1, 2]
    assert _history(client, run_id, "tiny_train/reward/total") == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert _history(client, run_id, "tiny_train/eval/accuracy") == [(0, 0.25), (2, 0.75)]
    assert _history(client, run_id, "tiny_train/actor/kl") == [(0, 0.0), (1, 1.0), (2, 4.0)]
    assert _history(client, run_id, "tiny_eval/eval/final_accuracy") == [(0, 0.75)]
    assert set(run.data.metrics) == {
        "tiny_train/reward/total",
        "tiny_train/eval/accuracy",
        "tiny_train/actor/kl",
        "tiny_eval/eval/final_accuracy",
    }
    assert [a.path for a in client.list_artifacts(run_id)] == ["tiny_reward_curves.png"]
    png = Path(client.download_artifacts(run_id, "tiny_reward_curves.png", str(tmp_path)))
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_failed_run_is_marked_failed(tmp_path: Path) -> None:
    def diverge(metrics: pd.DataFrame) -> float:
        raise FloatingPointError("loss is nan")

    pipeline = TINY + Pipeline([Node(diverge, "tiny_train_metrics", "never")])
    with pytest.raises(FloatingPointError):
        run_like_session(
            [MlflowTrackingHook()], pipeline, DataCatalog(), _parameters(), tmp_path, "r"
        )
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("creditflow").experiment_id])
    assert run.info.status == "FAILED"
    # What was saved before the failure is kept.
    assert _history(client, run.info.run_id, "tiny_train/actor/kl")[-1] == (2, 4.0)


@pytest.mark.parametrize(
    "parameters",
    [_parameters(enabled=False), {"train": TRAIN}],
    ids=["tracking.enabled=false", "no tracking group"],
)
def test_tracking_off_logs_nothing(tmp_path: Path, parameters: dict) -> None:
    hook = MlflowTrackingHook()
    run_like_session([hook], TINY, DataCatalog(), parameters, tmp_path)
    assert not (tmp_path / "mlruns").exists()
    assert hook.run_id is None


def test_tracking_config_parsing_and_uri(tmp_path: Path) -> None:
    config = TrackingConfig.from_params({"enabled": True, "tracking_uri": "runs/ml"})
    assert config == TrackingConfig(True, "runs/ml", "creditflow")
    assert config.resolved_uri(tmp_path) == (tmp_path / "runs/ml").as_uri()
    sqlite = TrackingConfig.from_params({"tracking_uri": "sqlite:///mlruns/mlflow.db"})
    assert sqlite.enabled and sqlite.resolved_uri(tmp_path) == "sqlite:///mlruns/mlflow.db"
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['uri'\]; valid ones"):
        TrackingConfig.from_params({"uri": "mlruns"})
    with pytest.raises(ValueError, match="tracking.enabled must be true or false"):
        TrackingConfig.from_params({"enabled": "yes"})
    with pytest.raises(ValueError, match="tracking.experiment_name must be a non-empty"):
        TrackingConfig.from_params({"experiment_name": ""})


def test_flatten_params_hand_case() -> None:
    params = {"a": {"b": {"c": 1}, "d": [1, {"e": 2}]}, "f": None, "g": "x"}
    # Lists are leaves, even when they hold mappings.
    assert flatten_params(params) == {
        "a.b.c": "1",
        "a.d": "[1, {'e': 2}]",
        "f": "None",
        "g": "x",
    }


def test_secret_parameters_are_logged_redacted(tmp_path: Path) -> None:
    client = make_client(TrackingConfig(True).resolved_uri(tmp_path))
    run_id = client.create_run(client.create_experiment("secrets")).info.run_id
    params = {"annotator": {"options": {"api_key": "sk-mlflow-0123456789", "max_tokens": 512}}}
    log_params(client, run_id, params)
    assert client.get_run(run_id).data.params == {
        "annotator.options.api_key": "[REDACTED]",
        "annotator.options.max_tokens": "512",
    }


def test_metrics_from_frame_hand_case() -> None:
    frame = pd.DataFrame(
        {
            "step": [10, 20],
            "loss": [0.5, math.nan],
            "ok": [True, False],
            "note": ["a", "b"],
        }
    )
    metrics = metrics_from_frame(frame, timestamp_ms=123)
    assert [(m.key, m.value, m.step, m.timestamp) for m in metrics] == [
        ("loss", 0.5, 10, 123),
        ("ok", 1.0, 10, 123),
        ("ok", 0.0, 20, 123),
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (pd.DataFrame({"loss": [1.0]}), "needs a 'step' column"),
        (pd.DataFrame({"step": [0.5], "loss": [1.0]}), "'step' column must hold integers"),
        ({"loss": "low"}, r"metric\(s\) \['loss'\] are not numbers"),
        ([1.0, 2.0], "must hold a pandas DataFrame with a 'step' column or a mapping"),
    ],
)
def test_malformed_metrics_are_rejected(tmp_path: Path, data, message: str) -> None:
    client = make_client(TrackingConfig(True).resolved_uri(tmp_path))
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    with pytest.raises(ValueError, match=message):
        log_metrics(client, run_id, "bad_metrics", data)


def test_log_plots_of_collections_and_bad_types(tmp_path: Path) -> None:
    client = make_client(TrackingConfig(True).resolved_uri(tmp_path))
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    figures = {"reward": Figure(), "kl": Figure()}
    assert log_plots(client, run_id, "grpo_curves", figures) == [
        "grpo_curves/reward.png",
        "grpo_curves/kl.png",
    ]
    assert log_plots(client, run_id, "raw_plot", [PNG_MAGIC + b"rest"]) == ["raw_plot/0.png"]
    paths = {a.path for a in client.list_artifacts(run_id, "grpo_curves")}
    assert paths == {"grpo_curves/reward.png", "grpo_curves/kl.png"}
    saved = Path(client.download_artifacts(run_id, "raw_plot/0.png", str(tmp_path)))
    assert saved.read_bytes() == PNG_MAGIC + b"rest"
    with pytest.raises(ValueError, match="must hold a matplotlib Figure, a PIL image or PNG"):
        log_plots(client, run_id, "bad_plot", "not a figure")
