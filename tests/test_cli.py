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
    assert result.returncode == 1
    # The message alone, as click shows a usage error: no traceback of Kedro's frames.
    assert "Error: --params: unknown parameter group `tpao` (did you mean `tapo`?)" in output
    assert "Traceback" not in output and "pluggy" not in output
    assert "Add type hints" not in output  # MLflow's warning about a model we never log
    assert "Running node" not in output and not (project / "data").exists()
    assert (project / "pyproject.toml").read_bytes() == before


def test_the_project_sets_the_makefiles_process_defaults_itself_and_an_explicit_value_wins():
    # `kedro run` typed in the activated venv gets what `make run` exports (one thread, no
    # hub lookups), before torch is imported; a variable the user set is kept.
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    env = {k: v for k, v in os.environ.items() if k not in {"OMP_NUM_THREADS", "HF_HUB_OFFLINE"}}
    env["HF_HUB_OFFLINE"] = "0"
    code = (
        "import os, sys, creditflow.settings; "
        "print('ENV', os.environ['OMP_NUM_THREADS'], os.environ['HF_HUB_OFFLINE'], "
        "'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("ENV ")]
    assert line.split() == ["ENV", "1", "0", "False"]


def test_creditflow_help_lists_fetch_data_before_the_run_options(capsys):
    from creditflow.__main__ import main  # noqa: PLC0415 - imports Kedro's CLI

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    assert shown.index("creditflow fetch-data") < shown.index("--pipelines")
