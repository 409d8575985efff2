"""Helpers for tests that run the project through a ``KedroSession`` in a temporary folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
from kedro.framework.hooks import hook_impl
from kedro.framework.startup import bootstrap_project

from creditflow.models import build_tiny_qwen2, train_bpe_tokenizer


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


def checkout_copy(project_root: Path, directory: Path) -> Path:
    """What a checkout holds that a ``kedro`` command reads, copied to ``directory``: conf/base
    (and an empty conf/local), pyproject.toml and the telemetry consent file ``.telemetry``
    (the package itself comes from PYTHONPATH / the install). Returns ``directory``."""
    shutil.copytree(project_root / "conf/base", directory / "conf/base")
    (directory / "conf/local").mkdir()
    (directory / "src").mkdir()  # kedro checks the project's source folder exists
    for name in ("pyproject.toml", ".telemetry"):
        shutil.copy(project_root / name, directory / name)
    return directory


KEDRO = Path(sys.executable).with_name("kedro")


def kedro_cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    """``kedro <args>`` in ``project`` as a user types it, without the variables that switch
    telemetry off (``KEDRO_DISABLE_TELEMETRY``, ``DO_NOT_TRACK``); stdout and stderr kept."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("KEDRO_DISABLE_TELEMETRY", "DO_NOT_TRACK")
    }
    # Should telemetry be on after all, it must neither reach a server from a test (a closed
    # local port as the proxy) nor write the user's own telemetry id (platformdirs' user
    # config dir, under XDG_CONFIG_HOME).
    env |= {
        "XDG_CONFIG_HOME": str(project.parent / "home/.config"),
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "COLUMNS": "200",  # rich wraps the log and tracebacks at this width
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


class NodeCounter:
    """A hook recording the names of the nodes a run started
    (``session._hook_manager.register(NodeCounter())``)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    @hook_impl
    def before_node_run(self, node) -> None:
        self.started.append(node.name)


class NodeIO:
    """A hook recording each node's inputs and outputs by node name
    (``session._hook_manager.register(NodeIO())``)."""

    def __init__(self) -> None:
        self.inputs: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, dict[str, Any]] = {}

    @hook_impl
    def before_node_run(self, node, inputs) -> None:
        self.inputs[node.name] = inputs

    @hook_impl
    def after_node_run(self, node, outputs) -> None:
        self.outputs[node.name] = outputs


# Text in a few scripts, so the tiny checkpoint's BPE has merges for what the tapo tasks hold.
_CORPUS = [
    "Tom has 3 apples and buys 4 more. How many apples does Tom have?",
    "<translation>Tom has 3 apples.</translation> 3 + 4 = 7. The answer is \\boxed{7}.",
    "Tom hat 3 Äpfel und kauft 4 dazu. Wie viele Äpfel hat Tom?",
    "У Тома 3 яблока, он покупает ещё 4. Сколько яблок у Тома?",
    "汤姆有 3 个苹果，又买了 4 个。汤姆有多少个苹果？",
    "Tom tiene 3 manzanas y compra 4 más. ¿Cuántas manzanas tiene Tom?",
    "Tom a 3 pommes et en achète 4. Combien de pommes Tom a-t-il ?",
    "Tom ana tufaha 3 na ananunua 4 zaidi. Tom ana tufaha ngapi?",
]


def save_tiny_checkpoint(directory: Path) -> Path:
    """A tiny Qwen2 and its byte-level BPE tokenizer (with the chat template) written with
    ``save_pretrained`` to ``directory``: a local checkpoint for ``policy: {source:
    pretrained, name_or_path: <directory>}``. Returns ``directory``."""
    tokenizer = train_bpe_tokenizer(
        _CORPUS * 20, vocab_size=300, special_tokens=("<translation>", "</translation>")
    )
    model = build_tiny_qwen2(
        tokenizer,
        hidden_size=32,
        num_hidden_layers=1,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        seed=5,
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# One saved version of the ingested MGSM table (math_text schema), for runs of the tapo
# pipeline, whose evaluation reads it (hooks.pinned_versions: an input never saved fails).
MGSM_VERSION = "2026-01-01T00.00.00.000Z"


def save_mgsm_problems(project: Path) -> None:
    """Two MGSM-like problems (en, de) as the one saved version of ``mgsm_problems``."""
    rows = pd.DataFrame(
        {
            "id": ["mgsm-0000", "mgsm-0000"],
            "language": ["en", "de"],
            "question": [
                "Tom has 3 apples and buys 4 more. How many?",
                "Tom hat 3 Äpfel und 4 dazu.",
            ],
            "question_en": ["Tom has 3 apples and buys 4 more. How many?"] * 2,
            "answer": ["7", "7"],
        }
    )
    folder = project / "data/03_primary/mgsm_problems.parquet" / MGSM_VERSION
    folder.mkdir(parents=True)
    rows.to_parquet(folder / "mgsm_problems.parquet")
