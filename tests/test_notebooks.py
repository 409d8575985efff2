"""notebooks/results.ipynb, executed headless (nbclient) in a temporary copy of the project:
with no results saved, and with the experience chain's (what a clone has after `make run`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from kedro.config import OmegaConfigLoader
from kedro.io import DataCatalog
from nbclient import NotebookClient

import creditflow
from tests.pipelines._experience_chain import chain_catalog

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = Path("notebooks") / "results.ipynb"
TIMEOUT_S = 300  # per cell: the first one imports torch and transformers in a fresh kernel


def project_copy(tmp_path: Path) -> Path:
    """The project's conf/base, pyproject.toml and the notebook under ``tmp_path``; the code
    is the installed package (the kernel imports this checkout's, ``kernel_env``)."""
    for name in ("conf/base", "pyproject.toml", str(NOTEBOOK)):
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (PROJECT_ROOT / name).is_dir() else shutil.copy)(
            PROJECT_ROOT / name, target
        )
    (tmp_path / "conf" / "local").mkdir()
    (tmp_path / "src").mkdir()  # bootstrap_project checks that it exists
    return tmp_path


def kernel_env() -> dict[str, str]:
    """This process's environment, with the creditflow the tests import first on the path."""
    source = str(Path(creditflow.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([source, *([path] if path else [])])}


def run_notebook(project: Path) -> str:
    """Execute the project's copy of the notebook (any error fails the test); returns the text
    of its outputs. Nothing is written back to a notebook file."""
    notebook = nbformat.read(project / NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(project / NOTEBOOK.parent)}},
    )
    client.execute(env=kernel_env())
    texts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", ""))
            texts.append(output.get("data", {}).get("text/plain", ""))
            texts.append("image/png" if "image/png" in output.get("data", {}) else "")
    return "\n".join(texts)


def save_to_catalog(project: Path, name: str, data) -> None:
    """``data`` saved under ``name`` as the project's catalog entry saves it (a new version)."""
    loader = OmegaConfigLoader(str(project / "conf"), base_env="base", default_run_env="local")
    entry = dict(loader["catalog"][name])
    entry["filepath"] = str(project / entry["filepath"])
    DataCatalog.from_config({name: entry}).save(name, data)


def git_state() -> tuple[str, bytes]:
    status = subprocess.run(
        ["git", "status", "--porcelain"],
        check=True,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
    ).stdout
    return status, (PROJECT_ROOT / NOTEBOOK).read_bytes()


def test_the_committed_notebook_has_no_outputs():
    notebook = nbformat.read(PROJECT_ROOT / NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert all(not cell.outputs and cell.execution_count is None for cell in code)


@pytest.mark.slow
def test_the_notebook_names_the_tables_that_were_never_saved(tmp_path):
    before = git_state()
    text = run_notebook(project_copy(tmp_path))
    for name in ("tapo_comparison", "tor_comparison", "reranker_ab"):
        assert f"{name}: never saved" in text, name
    assert "image/png" not in text
    assert git_state() == before


@pytest.mark.slow
def test_the_notebook_plots_the_chains_ab_table_after_make_run(tmp_path):
    """The chain's A/B table as the chain (at its smallest sizes) saved it; the comparisons
    were never run."""
    before = git_state()
    project = project_copy(tmp_path)
    ab = chain_catalog().load("reranker_ab")
    save_to_catalog(project, "reranker_ab", ab)
    text = run_notebook(project)
    assert "tapo_comparison: never saved" in text
    assert "tor_comparison: never saved" in text
    assert "reranker_ab: never saved" not in text
    assert "ctr_change_vs_logged" in text  # the table, displayed
    assert text.count("image/png") == 1  # its plot
    assert git_state() == before
