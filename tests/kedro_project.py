"""Helpers for tests that run the project through a ``KedroSession`` in a temporary folder."""

from __future__ import annotations

import shutil
from pathlib import Path

from kedro.framework.hooks import hook_impl
from kedro.framework.startup import bootstrap_project


def copy_project(project_root: Path, tmp_path: Path, monkeypatch) -> Path:
    """The project's ``conf/base`` and ``pyproject.toml`` in ``tmp_path``, bootstrapped with
    ``tmp_path`` as the working directory: relative catalog paths, manifests and ``mlruns/``
    resolve there and the repo stays untouched. Returns ``tmp_path``."""
    for name in ("conf/base", "pyproject.toml"):
        copy = shutil.copytree if (project_root / name).is_dir() else shutil.copy
        copy(project_root / name, tmp_path / name)
    (tmp_path / "conf/local").mkdir()
    (tmp_path / "src").mkdir()  # bootstrap_project checks it; the package is installed
    monkeypatch.chdir(tmp_path)  # kedro-viz's run hooks write .viz/ under the cwd's project
    bootstrap_project(tmp_path)
    return tmp_path


class NodeCounter:
    """A hook recording the names of the nodes a run started
    (``session._hook_manager.register(NodeCounter())``)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    @hook_impl
    def before_node_run(self, node) -> None:
        self.started.append(node.name)
