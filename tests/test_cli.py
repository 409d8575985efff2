"""The ``kedro`` command line, as a user types it, in a temporary copy of the project: telemetry
stays off without ``KEDRO_DISABLE_TELEMETRY`` (the committed ``.telemetry``), and a misspelt
group under ``--params`` fails before any node."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

KEDRO = Path(sys.executable).with_name("kedro")


@pytest.fixture
def project(project_root: Path, tmp_path: Path) -> Path:
    """What a checkout holds that a kedro command reads: conf/base, pyproject.toml and the
    telemetry consent file (the package itself comes from PYTHONPATH / the install)."""
    project = tmp_path / "project"
    shutil.copytree(project_root / "conf/base", project / "conf/base")
    (project / "conf/local").mkdir()
    (project / "src").mkdir()  # kedro checks the project's source folder exists
    for name in ("pyproject.toml", ".telemetry"):
        shutil.copy(project_root / name, project / name)
    return project


def kedro(project: Path, *args: str) -> subprocess.CompletedProcess:
    """``kedro <args>`` in ``project``, without the variables that switch telemetry off."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("KEDRO_DISABLE_TELEMETRY", "DO_NOT_TRACK")
    }
    home = project.parent / "home"
    # Should telemetry be on after all, it must neither reach a server from a test (a closed
    # local port as the proxy) nor write the user's own telemetry file.
    env |= {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "COLUMNS": "200",
    }
    return subprocess.run(
        [str(KEDRO), *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,  # the tests read the exit status
    )


def test_a_bare_kedro_command_sends_nothing_and_leaves_pyproject_alone(project):
    # kedro-telemetry, with consent implicit, writes [tool.kedro_telemetry] project_id into
    # pyproject.toml before it sends its first event; `consent: false` in .telemetry stops it.
    before = (project / "pyproject.toml").read_bytes()
    result = kedro(project, "--help")
    assert result.returncode == 0, result.stderr
    assert (project / "pyproject.toml").read_bytes() == before
    assert not (project.parent / "home/.config/kedro").exists()  # no user id written either


def test_a_misspelt_group_under_params_fails_on_the_command_line(project):
    before = (project / "pyproject.toml").read_bytes()
    result = kedro(project, "run", "--pipelines", "tapo", "--params", "tpao.grpo.steps=2")
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert "ConfigError: --params: unknown parameter group `tpao` (did you mean `tapo`?)" in output
    assert "Running node" not in output and not (project / "data").exists()
    assert (project / "pyproject.toml").read_bytes() == before
