"""SigtermHook: SIGTERM during a run becomes RunInterrupted, the handler lives only as long as
the run, and a real ``kedro run`` stopped by SIGTERM leaves an ``interrupted`` manifest, a
KILLED MLflow run and a non-zero exit status."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kedro.framework.hooks import hook_impl
from kedro.framework.hooks.manager import _create_hook_manager
from mlflow.tracking import MlflowClient

from creditflow.errors import RunInterrupted
from creditflow.hooks.run_manifest import MANIFEST_DIR
from creditflow.hooks.termination import SigtermHook

RUN_ARGS = {"run_params": {}, "pipeline": None, "catalog": None}


class FailingCloser:
    """Another hook whose on_pipeline_error raises (a store that is gone, say)."""

    @hook_impl
    def on_pipeline_error(self) -> None:
        raise OSError("store unreachable")


@pytest.fixture
def previous_handler():
    """A stand-in SIGTERM handler for the test's duration (restored after)."""
    calls = []

    def record(*args):
        calls.append(args)

    old = signal.signal(signal.SIGTERM, record)
    yield record, calls
    signal.signal(signal.SIGTERM, old)


def test_the_handler_lives_as_long_as_the_run(previous_handler):
    record, calls = previous_handler
    manager = _create_hook_manager()
    manager.register(SigtermHook())
    manager.hook.before_pipeline_run(**RUN_ARGS)
    installed = signal.getsignal(signal.SIGTERM)
    assert installed is not record
    with pytest.raises(RunInterrupted, match="SIGTERM received"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises during the sleep
    # A second SIGTERM now would end the process: the default action is back.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    manager.hook.after_pipeline_run(run_result={}, **RUN_ARGS)
    assert signal.getsignal(signal.SIGTERM) is record and calls == []


def test_the_handler_is_restored_when_another_hook_fails(previous_handler):
    record, _ = previous_handler
    manager = _create_hook_manager()
    manager.register(SigtermHook())
    manager.register(FailingCloser())
    manager.hook.before_pipeline_run(**RUN_ARGS)
    assert signal.getsignal(signal.SIGTERM) is not record
    with pytest.raises(OSError, match="store unreachable"):
        manager.hook.on_pipeline_error(error=RuntimeError("boom"), **RUN_ARGS)
    assert signal.getsignal(signal.SIGTERM) is record


def test_a_run_in_another_thread_leaves_sigterm_alone(previous_handler):
    record, _ = previous_handler
    hook = SigtermHook()
    thread = threading.Thread(target=hook.before_pipeline_run)
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is record


class SilentHandler(BaseHTTPRequestHandler):
    """Reads a request and never answers (until the test ends)."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.arrived.set()
        self.server.stop.wait(60)


@pytest.mark.slow
def test_a_kedro_run_stopped_by_sigterm_is_recorded_and_exits_non_zero(
    project_root: Path, tmp_path: Path
):
    """`kedro run` of the annotation pipeline's first two nodes (two items) whose annotator
    waits on a server that never answers; once the request has arrived, SIGTERM. Before: the
    process died at once, with no manifest and its MLflow run RUNNING for ever."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SilentHandler)
    server.daemon_threads = True
    server.arrived, server.stop = threading.Event(), threading.Event()
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    for name in ("conf/base", "pyproject.toml"):
        copy = shutil.copytree if (project_root / name).is_dir() else shutil.copy
        copy(project_root / name, tmp_path / name)
    (tmp_path / "conf/local").mkdir()
    (tmp_path / "src").mkdir()
    options = {
        "base_url": f"http://127.0.0.1:{server.server_address[1]}",
        "model": "m",
        "request_deadline_s": 3,  # how long the exit then waits for the request in flight
        "cache_dir": "null",
    }
    params = ["annotation.items.n_items=2", "annotation.items.image_size=32"]
    params += ["annotation.annotator.name=openai"]
    params += [f"annotation.annotator.options.{key}={value}" for key, value in options.items()]
    kedro = Path(sys.executable).with_name("kedro")
    command = [str(kedro), "run", "--pipelines", "annotation", "--params", ",".join(params)]
    command += ["--nodes", "generate_items,annotate_items"]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}  # PYTHONPATH kept
    log = tmp_path / "run.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=out)
    try:
        # Kedro, torch and MLflow's first store take a while to start on a busy machine.
        assert server.arrived.wait(240), log.read_text()[-3000:]
        process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        returncode = process.wait(120)
        took = time.monotonic() - stopped
    finally:
        process.kill()
        server.stop.set()
        server.shutdown()
        server.server_close()
    assert returncode != 0 and took < 60, log.read_text()[-3000:]
    (manifest_path,) = (tmp_path / MANIFEST_DIR).glob("*.json")
    manifest = json.loads(manifest_path.read_text())
    assert manifest["status"] == "interrupted"
    assert manifest["error"].startswith("RunInterrupted: SIGTERM received")
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("creditflow").experiment_id])
    assert run.info.status == "KILLED" and run.info.end_time is not None
    assert run.data.tags["run_id"] == manifest["run_id"]
