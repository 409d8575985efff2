"""kedro-viz static build of the project, served over loopback and rendered in headless Chromium.

The build runs on a copy of the project's conf in tmp_path (``kedro viz build`` writes
``build/`` under the working directory), so the repo's own build/ is left alone.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import pytest

from creditflow.pipelines.data_ingest import create_pipeline

CHROMIUM = next(
    (path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="headless Chromium not installed (Debian: apt-get install -y chromium)",
    ),
]

# Headless, offline and stateless: no GPU, no first-run, update or sync traffic, and a
# throwaway profile. The virtual time budget lets the app fetch api/main and lay out the graph
# before the DOM is dumped.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=15000",
    "--dump-dom",
)


class _GraphNodes(HTMLParser):
    """Full names of the task nodes drawn in the flowchart (``<g class="pipeline-node
    pipeline-node--task" data-node-fullname=...>``)."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if "pipeline-node--task" in (attributes.get("class") or "").split():
            self.tasks.add(attributes["data-node-fullname"])


def _build(project_root: Path, project: Path) -> Path:
    for name in ("conf/base", "pyproject.toml"):
        copy = shutil.copytree if (project_root / name).is_dir() else shutil.copy
        copy(project_root / name, project / name)
    (project / "conf/local").mkdir()
    (project / "src").mkdir()  # kedro checks that the source dir exists; the package is installed
    env = os.environ | {"KEDRO_DISABLE_TELEMETRY": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "kedro", "viz", "build"],
        check=False,
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return project / "build"


@contextmanager
def _serve(directory: Path) -> Iterator[str]:
    """``python -m http.server`` on 127.0.0.1 and a free port the OS picks; yields its URL."""
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # one log line per request; nothing reads them
        text=True,
    )
    try:
        # "Serving HTTP on 127.0.0.1 port 43567 (http://127.0.0.1:43567/) ..."
        banner = server.stdout.readline()
        match = re.search(r"port (\d+)", banner)
        assert match, f"http.server did not start: {banner!r}"
        yield f"http://127.0.0.1:{match.group(1)}/"
    finally:
        server.terminate()
        server.wait(timeout=10)
        server.stdout.close()


def test_static_build_renders_the_pipelines_in_chromium(project_root: Path, tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    build = _build(project_root, project)
    expected = {node.name for node in create_pipeline().nodes}
    assert "ingest_mgsm_problems" in expected

    # The API the page reads: api/main holds the default pipeline (drawn first), and every
    # registered pipeline has its own file, data_ingest's with every data_ingest node.
    api = json.loads((build / "api/main").read_text())
    api_tasks = {node["name"] for node in api["nodes"] if node["type"] == "task"}
    assert api_tasks, "the default pipeline has no task nodes in the API"
    ingest_api = json.loads((build / "api/pipelines/data_ingest").read_text())
    in_data_ingest = {node["name"] for node in ingest_api["nodes"] if node["type"] == "task"}
    assert in_data_ingest == expected
    assert {"__default__", "data_ingest", "tapo", "tor"} <= {
        pipeline["id"] for pipeline in api["pipelines"]
    }

    with _serve(build) as url:
        result = subprocess.run(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", url],
            check=False,
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    graph = _GraphNodes()
    graph.feed(result.stdout)
    # The flowchart of the default pipeline was drawn: every one of its task nodes.
    assert graph.tasks == api_tasks, (
        sorted(api_tasks - graph.tasks),
        result.stdout[:500],
    )
