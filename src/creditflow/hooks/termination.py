"""SigtermHook: a run stopped by SIGTERM ends like a failed one, with its manifest written and its
MLflow run closed."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Generator
from typing import Any

from kedro.framework.hooks import hook_impl

from creditflow.errors import RunInterrupted

logger = logging.getLogger(__name__)


class SigtermHook:
    """Turns SIGTERM during a run into :class:`~creditflow.errors.RunInterrupted`.

    SIGTERM's default action ends the process on the spot: no hook runs, so no run manifest is
    written and the MLflow run stays ``RUNNING`` for ever. While a run's pipeline runs, this
    hook's handler raises ``RunInterrupted`` in the main thread instead (inside the node it is
    running, usually); Kedro then calls ``on_pipeline_error``, ``RunManifestHook`` writes the
    manifest with status ``interrupted``, ``MlflowTrackingHook`` ends the MLflow run ``KILLED``,
    and the exception ends ``kedro run`` with a non-zero exit status. The handler restores
    SIGTERM's default action first, so a second SIGTERM ends the process at once.

    The handler is installed after every other hook's ``before_pipeline_run`` (a run they stop
    never gets it), so MLflow's run is open by then, and the one it replaced is restored after
    every other hook's ``after_pipeline_run`` / ``on_pipeline_error``, even when one of those
    raises. Python runs signal handlers in the main thread only, so a run started from another
    thread leaves SIGTERM alone.
    """

    def __init__(self) -> None:
        self._previous: Any = None
        self._installed = False

    @hook_impl(trylast=True)
    def before_pipeline_run(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, _interrupt)
        self._installed = True

    @hook_impl(wrapper=True)
    def after_pipeline_run(self) -> Generator[None, Any, Any]:
        try:
            return (yield)
        finally:
            self._restore()

    @hook_impl(wrapper=True)
    def on_pipeline_error(self) -> Generator[None, Any, Any]:
        try:
            return (yield)
        finally:
            self._restore()

    def _restore(self) -> None:
        if not self._installed:
            return
        # None: the previous handler was not set from Python; the default is what it did.
        previous = signal.SIG_DFL if self._previous is None else self._previous
        signal.signal(signal.SIGTERM, previous)
        self._installed, self._previous = False, None


def _interrupt(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    logger.error("SIGTERM received: stopping the run")
    raise RunInterrupted("SIGTERM received: the run was stopped before it finished")
