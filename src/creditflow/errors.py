"""creditflow's exceptions, in one place that imports nothing of the project and no torch,
so that any layer (parameter checks, hooks, rollout backends, data loaders) can raise or catch
them without importing the engine."""

from __future__ import annotations

from pathlib import Path


class ConfigError(ValueError):
    """A training configuration that cannot work; the message says which key to fix."""


class MissingInputsError(RuntimeError):
    """A run reads datasets that were never saved."""


class RawDataMissingError(MissingInputsError):
    """Raw data sets a run or a test reads are not in the project's raw data folder; the message
    names them and says how to fetch them (``creditflow fetch-data``)."""


class DownloadError(RuntimeError):
    """A raw data set could not be downloaded from its public source; the message names the
    address and says how to fetch from a local copy instead."""


class DataValidationError(ValueError):
    """A raw source file breaks its documented format; the message names file and line."""

    def __init__(self, path: Path, line: int | None, problem: str, fix: str) -> None:
        self.path = path
        self.line = line
        where = f"{path}, line {line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {problem}. Fix: {fix}.")


class TaskSourceError(ValueError):
    """A task source breaks its schema; the message names the dataset, row and column."""

    def __init__(
        self, dataset: str, problem: str, fix: str, row: int | None = None, column: str = ""
    ) -> None:
        self.dataset, self.row, self.column = dataset, row, column
        where = f"task source `{dataset}`"
        where += f", row {row}" if row is not None else ""
        where += f", column `{column}`" if column else ""
        super().__init__(f"{where}: {problem}. Fix: {fix}.")


class AnnotationParseError(ValueError):
    """Annotator output that holds no valid annotation; the message says what was wrong."""


class AnnotatorLimitError(RuntimeError):
    """A served annotator's request ran past its deadline, or its reply past a size limit; the
    message names the limit (the annotator's option) that was reached."""


class CheckpointsInUse(RuntimeError):
    """Another run holds the lock on a checkpoint folder."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a lost mount); the message names the
    folder, the cause, the free space and the earlier checkpoint that is still intact."""


class DataParallelError(RuntimeError):
    """A worker process raised; the message holds the rank and traceback of the first failure."""


class StaleWeightsError(RuntimeError):
    """A backend sampled with older weights than the request asked for."""


class RunInterrupted(Exception):
    """The run was asked to stop (SIGTERM) while its pipeline ran.

    An ``Exception``, not a ``BaseException`` like ``KeyboardInterrupt``, so that Kedro's
    ``on_pipeline_error`` hooks see it and close the run's manifest and MLflow run.
    """


class WorkerError(RuntimeError):
    """The call raised in the child, or the child died (a crash, a kill, a C stack overflow)."""


class NonFiniteTrainingError(FloatingPointError):
    """A loss, gradient norm or weight turned NaN or infinite while training; the message
    names the step, the run (its strategies), what went non-finite and the newest checkpoint,
    which was written before it and stays the newest (a non-finite policy is never saved)."""
