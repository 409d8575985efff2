"""A full disk during a run's report write: the report's previous version stays the newest,
the manifest is whole or absent (never an empty file), and the error the run raises is the
report's, not the manifest's (RunManifestHook logs its own)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
from kedro.io import DataCatalog, DatasetError
from kedro.pipeline import Node, Pipeline

from creditflow.hooks.run_manifest import MANIFEST_DIR, RunManifestHook
from tests.full_disk import fill_disk_halfway
from tests.hooks.test_hooks import PARAMETERS, project, run_like_session  # noqa: F401 - fixture

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

FIRST, SECOND = "2026-01-01T00.00.00.000Z", "2026-02-01T00.00.00.000Z"


def render_report(params: dict) -> str:
    return "<html>" + "<p>token credit</p>" * 500 * params["scale"] + "</html>"


REPORT = Pipeline([Node(render_report, "params:tiny", "token_credit_html")])


def _catalog(data: Path, save_version: str) -> DataCatalog:
    entry = {
        "type": "creditflow.datasets.AtomicTextDataset",
        "filepath": str(data / "token_credit.html"),
        "versioned": True,
    }
    return DataCatalog.from_config({"token_credit_html": entry}, save_version=save_version)


def test_a_full_disk_keeps_the_last_report_and_raises_the_reports_error(
    project: Path,  # noqa: F811 - the git work tree fixture of test_hooks
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = tmp_path / "data"
    hook = RunManifestHook()
    run_like_session([hook], REPORT, _catalog(data, FIRST), PARAMETERS, project, run_id=FIRST)
    report = data / "token_credit.html" / FIRST / "token_credit.html"
    first_report = report.read_text()
    manifests = project / MANIFEST_DIR
    first_manifest = (manifests / f"{FIRST}.json").read_text(encoding="utf-8")

    fill_disk_halfway(monkeypatch)  # the report and then the manifest hit the full disk
    with caplog.at_level(logging.ERROR, logger="creditflow.hooks.run_manifest"):
        with pytest.raises(DatasetError) as error:
            run_like_session(
                [hook], REPORT, _catalog(data, SECOND), PARAMETERS, project, run_id=SECOND
            )
    monkeypatch.undo()

    # The report's own error, as Kedro wraps it (dataset, then catalog): not the manifest's,
    # raised later.
    assert str(error.value).startswith("token_credit_html: Failed while saving data")
    cause = error.value
    while cause.__cause__ is not None:
        cause = cause.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    assert "The run manifest (failed) could not be written" in caplog.text
    # The first run's report is still the newest version, whole; no half report anywhere.
    # (beside it, the first version's digests: creditflow.integrity)
    assert sorted(os.listdir(data / "token_credit.html")) == [FIRST, f"{FIRST}.sha256"]
    assert os.listdir(report.parent) == ["token_credit.html"]
    assert report.read_text() == first_report
    assert _catalog(data, SECOND).load("token_credit_html") == first_report
    # No empty or half manifest for the failed run, and the first one is untouched.
    assert os.listdir(manifests) == [f"{FIRST}.json"]
    assert (manifests / f"{FIRST}.json").read_text(encoding="utf-8") == first_manifest


def test_a_manifest_that_cannot_be_written_after_a_completed_run_raises(
    project: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no pipeline error to show, the manifest's own error is the run's."""
    hook = RunManifestHook()
    catalog = DataCatalog()
    pipeline = Pipeline([Node(lambda params: params["scale"], "params:tiny", "scale")])
    fill_disk_halfway(monkeypatch)
    with pytest.raises(OSError) as error:
        run_like_session([hook], pipeline, catalog, PARAMETERS, project, run_id=FIRST)
    assert error.value.errno == errno.ENOSPC
    assert os.listdir(project / MANIFEST_DIR) == []
