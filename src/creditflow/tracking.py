"""MLflow logging of what the pipelines save: metrics tables, plots and parameters.

Kedro-free helpers used by :class:`creditflow.hooks.MlflowTrackingHook`; each takes an explicit
``MlflowClient`` and run id, so nothing depends on MLflow's global "active run" state. The
``tracking`` parameter group is documented in ``conf/base/parameters_tracking.yml``.

Conventions the hook relies on (docs/reproducibility.md):
    - a dataset named ``*_metrics`` holds a pandas DataFrame with one row per training step, an
      integer ``step`` column and namespaced numeric columns (``reward/total``, ``actor/kl``),
      or a flat mapping of metric name -> number (logged once, at step 0);
    - a dataset named ``*_plot`` or ``*_curves`` holds a matplotlib Figure, a list or dict of
      Figures, a PIL image or PNG bytes.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from PIL import Image

from creditflow.redaction import redact

METRICS_SUFFIX = "_metrics"
PLOT_SUFFIXES = ("_plot", "_curves")

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# "scheme:" with a scheme of 2+ letters, so "C:/runs" stays a path and "sqlite:///x" a URI.
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


@dataclass(frozen=True)
class TrackingConfig:
    """Parsed ``params:tracking``.

    Attributes:
        enabled: log runs to MLflow at all.
        tracking_uri: a folder (MLflow's file store; relative to the project root) or any
            MLflow tracking URI with a scheme (``sqlite:///mlruns/mlflow.db``, ``http://...``).
        experiment_name: MLflow experiment the runs go to; created when missing.
    """

    enabled: bool
    tracking_uri: str = "mlruns"
    experiment_name: str = "creditflow"

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> TrackingConfig:
        """Build from the parameter dict, raising ValueError on unknown or bad knobs."""
        valid = ("enabled", "tracking_uri", "experiment_name")
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise ValueError(f"tracking: unknown parameter(s) {unknown}; valid ones: {valid}")
        enabled = params.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ValueError(f"tracking.enabled must be true or false; got {enabled!r}")
        config = cls(enabled, **{key: params[key] for key in valid[1:] if key in params})
        for key in valid[1:]:
            value = getattr(config, key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"tracking.{key} must be a non-empty string; got {value!r}")
        return config

    def resolved_uri(self, project_path: str | Path) -> str:
        """The tracking URI, with a folder made absolute against ``project_path``.

        Opting in to MLflow's file store (``MLFLOW_ALLOW_FILE_STORE``) is a process-wide
        setting: MLflow 3 refuses folder stores unless it is set, and a folder keeps tests and
        local runs free of a database (docs/reproducibility.md says how to use SQLite instead).
        """
        if _URI_SCHEME.match(self.tracking_uri):
            return self.tracking_uri
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        return (Path(project_path) / self.tracking_uri).resolve().as_uri()


def make_client(tracking_uri: str) -> MlflowClient:
    """An MLflow client bound to ``tracking_uri`` (see :meth:`TrackingConfig.resolved_uri`)."""
    return MlflowClient(tracking_uri)


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested parameters as MLflow params: dotted keys, string values.

    Mappings are walked; lists and scalars are leaves, written with ``str``.

    >>> flatten_params({"a": {"b": 1, "c": [1, 2]}, "d": None})
    {'a.b': '1', 'a.c': '[1, 2]', 'd': 'None'}
    """
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= flatten_params(value, f"{name}.")
        else:
            flat[name] = str(value)
    return flat


def log_params(client: MlflowClient, run_id: str, params: Mapping[str, Any]) -> None:
    """Log ``params`` flattened (see :func:`flatten_params`); MLflow batches them in 100s.

    Secret-named values (:func:`creditflow.redaction.redact`) are logged as ``[REDACTED]``.
    """
    flat = flatten_params(redact(params))
    client.log_batch(run_id, params=[Param(key, value) for key, value in sorted(flat.items())])


def metrics_from_frame(frame: pd.DataFrame, timestamp_ms: int) -> list[Metric]:
    """One MLflow Metric per (row, numeric column) of a per-step metrics table.

    Args:
        frame: one row per step; an integer ``step`` column and any number of other columns.
            Numeric (and boolean) columns become metrics named as the column; NaN cells are
            skipped (a metric not measured at that step); other columns are ignored.
        timestamp_ms: wall-clock time stamped on every metric.
    """
    if "step" not in frame.columns:
        raise ValueError(
            f"a metrics table needs a 'step' column (one row per step); got columns "
            f"{list(frame.columns)}"
        )
    if not pd.api.types.is_integer_dtype(frame["step"]):
        raise ValueError(f"the 'step' column must hold integers; got {frame['step'].dtype}")
    numeric = [
        column
        for column in frame.columns
        if column != "step" and pd.api.types.is_numeric_dtype(frame[column])
    ]
    metrics = []
    for column in numeric:
        values = frame[column].astype(float)
        for step, value in zip(frame["step"], values, strict=True):
            if pd.notna(value):
                metrics.append(Metric(str(column), value, timestamp_ms, int(step)))
    return metrics


def log_metrics(client: MlflowClient, run_id: str, name: str, data: Any) -> int:
    """Log the metrics saved as dataset ``name``; returns how many values were logged.

    ``data`` is a per-step DataFrame (see :func:`metrics_from_frame`) or a flat mapping of
    metric name -> number, logged at step 0.
    """
    timestamp_ms = int(time.time() * 1000)
    if isinstance(data, pd.DataFrame):
        metrics = metrics_from_frame(data, timestamp_ms)
    elif isinstance(data, Mapping):
        bad = sorted(str(key) for key, value in data.items() if not isinstance(value, Real))
        if bad:
            raise ValueError(f"{name}: metric(s) {bad} are not numbers")
        metrics = [Metric(str(key), float(value), timestamp_ms, 0) for key, value in data.items()]
    else:
        raise ValueError(
            f"{name}: a *{METRICS_SUFFIX} dataset must hold a pandas DataFrame with a 'step' "
            f"column or a mapping of metric name -> number; got {type(data).__name__}"
        )
    # One Kedro run may save several metrics tables with the same columns (one per GRPO
    # strategy), so each key is prefixed by its dataset: tapo_grpo_sum_metrics -> tapo_grpo_sum/...
    stem = name.removesuffix(METRICS_SUFFIX)
    metrics = [Metric(f"{stem}/{m.key}", m.value, m.timestamp, m.step) for m in metrics]
    client.log_batch(run_id, metrics=metrics)
    return len(metrics)


def log_plots(client: MlflowClient, run_id: str, name: str, data: Any) -> list[str]:
    """Log the plot(s) saved as dataset ``name`` as PNG artifacts; returns their paths.

    A single plot becomes ``<name>.png``; a list or dict of Figures (as kedro-datasets'
    MatplotlibDataset saves them) becomes ``<name>/<index or key>.png``.
    """
    if isinstance(data, Mapping):
        items = [(f"{name}/{key}.png", value) for key, value in data.items()]
    elif isinstance(data, list | tuple):
        items = [(f"{name}/{index}.png", value) for index, value in enumerate(data)]
    else:
        items = [(f"{name}.png", data)]
    for artifact_file, plot in items:
        _log_plot(client, run_id, artifact_file, plot)
    return [artifact_file for artifact_file, _ in items]


def _log_plot(client: MlflowClient, run_id: str, artifact_file: str, plot: Any) -> None:
    if isinstance(plot, Figure):
        client.log_figure(run_id, plot, artifact_file)
    elif isinstance(plot, Image.Image):
        client.log_image(run_id, plot, artifact_file=artifact_file)
    elif isinstance(plot, bytes) and plot.startswith(_PNG_MAGIC):
        artifact_path, _, file_name = artifact_file.rpartition("/")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / file_name
            path.write_bytes(plot)
            client.log_artifact(run_id, str(path), artifact_path or None)
    else:
        raise ValueError(
            f"{artifact_file}: a *_plot/*_curves dataset must hold a matplotlib Figure, a PIL "
            f"image or PNG bytes (or a list/dict of them); got {type(plot).__name__}"
        )
