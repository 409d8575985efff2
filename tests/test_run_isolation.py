"""Two runs in one project folder: a run reads the dataset versions it saved itself (or the
newest at its start), never ones a concurrent run writes meanwhile (hooks.pinned_versions.PinnedVersionsHook);
checkpoint folders are locked per run (tests/training/test_checkpoint.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from kedro.framework.hooks import hook_impl
from kedro.framework.hooks.manager import _create_hook_manager
from kedro.framework.session import KedroSession
from kedro.io import DataCatalog, MemoryDataset
from kedro.io.core import Version
from kedro.pipeline import Pipeline, node
from kedro.runner import SequentialRunner
from kedro_datasets.pandas import CSVDataset

from creditflow.errors import MissingInputsError
from creditflow.hooks.pinned_versions import PinnedVersionsHook
from tests.kedro_project import NodeCounter, copy_project

RUN = "2026-12-01T10.00.00.000Z"  # this run's save version
LATER = "2026-12-01T10.00.05.000Z"  # a version another run saves while this one runs


def _write_version(root: Path, name: str, version: str, value: int) -> None:
    path = root / f"{name}.csv" / version / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"value": [value]}).to_csv(path, index=False)


class _ConcurrentWriter:
    """Plays the other run: right after this run's node ``first`` saved ``middle``, it saves a
    newer ``middle`` and a newer ``source``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @hook_impl
    def after_node_run(self, node) -> None:
        if node.name == "first":
            _write_version(self.root, "middle", LATER, -1)
            _write_version(self.root, "source", LATER, -2)


def _run(root: Path, pin: bool, load_versions: dict | None = None) -> pd.DataFrame:
    def dataset(name: str) -> CSVDataset:
        version = Version((load_versions or {}).get(name), RUN)
        return CSVDataset(filepath=str(root / f"{name}.csv"), version=version)

    catalog = DataCatalog(
        {
            "source": dataset("source"),
            "middle": dataset("middle"),
            "result": MemoryDataset(),
        }
    )
    pipeline = Pipeline(
        [
            node(lambda df: df.assign(value=df["value"] * 10), "source", "middle", name="first"),
            # Reads `middle` (saved by `first`) and `source` again, after the other run wrote.
            node(
                lambda m, s: pd.concat([m, s], keys=["middle", "source"]).reset_index(0),
                ["middle", "source"],
                "result",
                name="second",
            ),
        ]
    )
    if pin:
        PinnedVersionsHook().before_pipeline_run(pipeline, catalog)
    hooks = _create_hook_manager()
    hooks.register(_ConcurrentWriter(root))
    SequentialRunner().run(pipeline, catalog, hooks)
    return catalog.load("result")


def _values(result: pd.DataFrame) -> dict[str, int]:
    return dict(zip(result["level_0"], result["value"], strict=True))


def test_a_run_reads_its_own_outputs_and_its_inputs_as_they_were_at_its_start(tmp_path: Path):
    _write_version(tmp_path, "source", "2026-12-01T09.00.00.000Z", 3)
    assert _values(_run(tmp_path, pin=True)) == {"middle": 30, "source": 3}


def test_without_pinning_kedro_reads_the_other_runs_newer_versions(tmp_path: Path):
    # What the hook prevents: the test above would fail without it.
    _write_version(tmp_path, "source", "2026-12-01T09.00.00.000Z", 3)
    with pytest.warns(UserWarning, match="Save version .* did not match load version"):
        result = _run(tmp_path, pin=False)
    # `source` stays at the version its first load cached (the runner keeps it for `second`);
    # `middle` was re-resolved after its save and is the other run's.
    assert _values(result) == {"middle": -1, "source": 3}


def test_load_versions_given_by_the_user_stand(tmp_path: Path):
    _write_version(tmp_path, "source", "2026-12-01T08.00.00.000Z", 1)
    _write_version(tmp_path, "source", "2026-12-01T09.00.00.000Z", 3)
    result = _run(tmp_path, pin=True, load_versions={"source": "2026-12-01T08.00.00.000Z"})
    assert _values(result) == {"middle": 10, "source": 1}


class _OtherRunSavesItems:
    """After this run saved its catalogue (3 items), another run saves a newer one of 5."""

    def __init__(self, project: Path) -> None:
        self.project = project

    @hook_impl
    def after_node_run(self, node) -> None:
        if node.name == "generate_items":
            folder = (
                self.project / "data/03_primary/catalogue_items.parquet/9999-01-01T00.00.00.000Z"
            )
            folder.mkdir(parents=True)
            items = pd.DataFrame({"item_id": range(5)})
            items.to_parquet(folder / "catalogue_items.parquet")


@pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")
def test_a_session_run_is_not_fooled_by_another_runs_newer_catalogue(
    project_root: Path, tmp_path: Path, monkeypatch
):
    copy_project(project_root, tmp_path, monkeypatch)
    overrides = {"annotation": {"items": {"n_items": 3, "image_size": 32}}}
    with KedroSession.create(project_path=tmp_path, runtime_params=overrides) as session:
        session._hook_manager.register(_OtherRunSavesItems(tmp_path))
        run_id = session.session_id
        session.run(pipeline_names=["annotation"], node_names=["generate_items", "annotate_items"])
    saved = tmp_path / "data/04_feature/item_annotations.parquet" / run_id
    annotations = pd.read_parquet(saved / "item_annotations.parquet")
    assert len(annotations) == 3


@pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")
def _project_catalog(project_root: Path, tmp_path: Path, monkeypatch):
    copy_project(project_root, tmp_path, monkeypatch)
    session = KedroSession.create(project_path=tmp_path)
    return session, session.load_context().catalog


def test_a_fresh_clone_evaluates_tor_without_the_real_sets_and_says_how_to_add_them(
    project_root: Path, tmp_path: Path, monkeypatch, caplog
):
    from creditflow.ingest.schemas import VISUAL_SCHEMA  # noqa: PLC0415
    from creditflow.pipelines import tor  # noqa: PLC0415

    session, catalog = _project_catalog(project_root, tmp_path, monkeypatch)
    with session, caplog.at_level("WARNING"):
        PinnedVersionsHook().before_pipeline_run(tor.create_pipeline(), catalog)
    for name in ("mathvision_problems", "tabmwp_problems"):
        table = catalog.load(name)
        assert table.empty and list(table.columns) == VISUAL_SCHEMA.names
        assert f"{name} has no saved version: the evaluation skips its rows" in caplog.text
    assert "kedro run --pipelines data_ingest" in caplog.text


def test_a_real_set_read_to_train_on_is_required_and_says_how_to_make_it(
    project_root: Path, tmp_path: Path, monkeypatch
):
    session, catalog = _project_catalog(project_root, tmp_path, monkeypatch)
    counter = NodeCounter()
    pipeline = Pipeline(
        [
            node(len, "tabmwp_problems", "n_rows", name="build_tor_tasks"),
            node(len, "mathvision_problems", "n_eval", name="evaluate_tor_policy"),
        ]
    )
    with session, pytest.raises(MissingInputsError) as error:
        PinnedVersionsHook().before_pipeline_run(pipeline, catalog)
    assert str(error.value).splitlines()[1:] == [
        "  tabmwp_problems: run `kedro run --pipelines data_ingest` first"
    ]
    assert counter.started == []
