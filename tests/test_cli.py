"""The ``kedro`` command line, as a user types it, in a temporary copy of the project: telemetry
stays off without ``KEDRO_DISABLE_TELEMETRY`` (the committed ``.telemetry``), and a misspelt
group under ``--params`` fails before any node."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kedro_project import checkout_copy, kedro_cli


@pytest.fixture
def project(project_root: Path, tmp_path: Path) -> Path:
    return checkout_copy(project_root, tmp_path / "project")


def test_a_bare_kedro_command_sends_nothing_and_leaves_pyproject_alone(project):
    # kedro-telemetry, with consent implicit, writes [tool.kedro_telemetry] project_id into
    # pyproject.toml before it sends its first event; `consent: false` in .telemetry stops it.
    before = (project / "pyproject.toml").read_bytes()
    result = kedro_cli(project, "--help")
    assert result.returncode == 0, result.stderr
    assert (project / "pyproject.toml").read_bytes() == before
    assert not (project.parent / "home/.config/kedro").exists()  # no user id written either


def test_a_misspelt_group_under_params_fails_on_the_command_line(project):
    before = (project / "pyproject.toml").read_bytes()
    result = kedro_cli(project, "run", "--pipelines", "tapo", "--params", "tpao.grpo.steps=2")
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert "ConfigError: --params: unknown parameter group `tpao` (did you mean `tapo`?)" in output
    assert "Running node" not in output and not (project / "data").exists()
    assert (project / "pyproject.toml").read_bytes() == before
