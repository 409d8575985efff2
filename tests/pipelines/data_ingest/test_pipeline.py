"""Kedro slice tests of data_ingest and checks of its catalog entries and parameters."""

from pathlib import Path

import pandas as pd
import pytest
from kedro.config import OmegaConfigLoader
from kedro.framework.project import configure_project
from kedro.framework.session import KedroSession
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from creditflow.errors import RawDataMissingError
from creditflow.hooks.raw_data import RawDataHook
from creditflow.ingest import check_frame, load_mathvision
from creditflow.ingest.schemas import (
    MATH_TEXT_SCHEMA,
    MOVIELENS_ITEMS_SCHEMA,
    MOVIELENS_RATINGS_SCHEMA,
    MOVIELENS_TAGS_SCHEMA,
    VISUAL_SCHEMA,
)
from creditflow.ingest.sources import RAW_SOURCES
from creditflow.pipeline_registry import register_pipelines
from creditflow.pipelines.data_ingest import create_pipeline
from creditflow.pipelines.data_ingest.pipeline import NODE_SOURCES, check_pipeline_raw_data
from tests.kedro_project import NodeCounter, copy_project

# Dataset -> (schema, rows on the real data sets, as creditflow fetch-data puts them).
EXPECTED = {
    "mgsm_problems": (MATH_TEXT_SCHEMA, 2000),  # 250 problems x 8 languages
    "gsm8k_train_problems": (MATH_TEXT_SCHEMA, 7473),
    "gsm8k_test_problems": (MATH_TEXT_SCHEMA, 923),
    "mathvision_problems": (VISUAL_SCHEMA, 208),
    "tabmwp_problems": (VISUAL_SCHEMA, 210),
    "movielens_ratings": (MOVIELENS_RATINGS_SCHEMA, 71282),
    "movielens_items": (MOVIELENS_ITEMS_SCHEMA, 9742),
    "movielens_tags": (MOVIELENS_TAGS_SCHEMA, 2137),  # the shared users' tags (SOURCE.md)
}

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")


def _conf(project_root: Path, key: str) -> dict:
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    return loader[key]


class _Kept(MemoryDataset):
    """Not released by the runner: ``movielens_items`` is also read by the tags node."""

    def _release(self) -> None:
        pass


def _run(pipeline, params: dict) -> dict[str, object]:
    """Run ``pipeline`` on MemoryDatasets and return every dataset it makes."""
    catalog = DataCatalog(
        {"params:data_ingest": MemoryDataset(params)}
        | {name: _Kept() for name in pipeline.all_outputs()}
    )
    SequentialRunner().run(pipeline, catalog)
    return {name: catalog.load(name) for name in pipeline.all_outputs()}


@pytest.fixture
def params(project_root: Path, raw_data: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The project's own data_ingest parameters, run from the project root like kedro run."""
    monkeypatch.chdir(project_root)
    return _conf(project_root, "parameters")["data_ingest"]


@pytest.mark.slow  # a whole pipeline, though only ~2 s
def test_pipeline_ingests_every_source_with_its_schema(params: dict) -> None:
    outputs = _run(create_pipeline(), params)
    assert set(outputs) == set(EXPECTED)
    for name, (schema, rows) in EXPECTED.items():
        check_frame(outputs[name], schema)
        assert len(outputs[name]) == rows, name
    tabmwp = outputs["tabmwp_problems"]
    assert tabmwp["image_path"].str.startswith("data/01_raw/tabmwp_numeric300/tables/").all()
    assert outputs["movielens_ratings"].dtypes.astype(str).to_dict() == {
        "user_id": "int64",
        "item_id": "int64",
        "rating": "float64",
        "timestamp": "int64",
    }
    assert str(outputs["movielens_items"]["year"].dtype) == "Int64"
    mgsm = outputs["mgsm_problems"]
    assert not mgsm.duplicated(["id", "language"]).any()


def test_capped_slice_of_the_visual_nodes(params: dict) -> None:
    pipeline = create_pipeline().only_nodes_with_tags("visual")
    assert pipeline.outputs() == {"mathvision_problems", "tabmwp_problems"}
    outputs = _run(pipeline, params | {"max_rows_per_source": 3})
    assert outputs["mathvision_problems"]["id"].tolist() == [f"mathvision-{i}" for i in (4, 5, 6)]
    # problems_shared.json lines 2, 40 and 73 open pids 385, 462 and 604.
    assert outputs["tabmwp_problems"]["id"].tolist() == ["tabmwp-385", "tabmwp-462", "tabmwp-604"]
    for name in pipeline.outputs():
        check_frame(outputs[name], VISUAL_SCHEMA)


def test_node_rejects_bad_parameters(params: dict) -> None:
    pipeline = create_pipeline().only_nodes("ingest_tabmwp_problems")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['max_row'\]"):
        _run(pipeline, params | {"max_row": 3})


def test_catalog_declares_every_output_as_a_versioned_primary_parquet(project_root: Path) -> None:
    catalog = _conf(project_root, "catalog")
    assert create_pipeline().all_outputs() == set(EXPECTED)
    # The tables tapo / tor can train on declare their task schema (creditflow.config.task_sources);
    # gsm8k_test_problems does not: its lines 0-249 are MGSM's English source.
    task_schemas = {
        "mgsm_problems": "math_text",
        "gsm8k_train_problems": "math_text",
        "mathvision_problems": "visual",
        "tabmwp_problems": "visual",
    }
    for name in EXPECTED:
        entry = dict(catalog[name])
        metadata = entry.pop("metadata", None)
        assert entry == {
            "type": "pandas.ParquetDataset",
            "filepath": f"data/03_primary/{name}.parquet",
            "versioned": True,
        }
        # The evaluation-only sets are optional: a fresh clone's tapo / tor skip their rows.
        optional = {"mgsm_problems", "mathvision_problems", "tabmwp_problems"}
        expected = {"task_schema": task_schemas[name]} if name in task_schemas else None
        if name in optional:
            expected = {**expected, "optional": True}
        assert metadata == expected


def test_versioned_catalog_entry_saves_and_loads(
    project_root: Path, raw_data: Path, tmp_path: Path
) -> None:
    entry = _conf(project_root, "catalog")["mathvision_problems"]
    entry = entry | {"filepath": str(tmp_path / entry["filepath"])}
    catalog = DataCatalog.from_config({"mathvision_problems": entry})
    frame = load_mathvision(raw_data / "mathvision_testmini", max_rows=20)
    catalog.save("mathvision_problems", frame)
    loaded = catalog.load("mathvision_problems")
    check_frame(loaded, VISUAL_SCHEMA)
    # list[str] cells come back as numpy arrays (see schemas.py).
    pd.testing.assert_frame_equal(loaded.assign(choices=loaded["choices"].map(list)), frame)
    folder = tmp_path / "data/03_primary/mathvision_problems.parquet"
    versions = [p for p in folder.iterdir() if p.is_dir()]  # a version's digests sit beside it
    assert len(versions) == 1 and (versions[0] / "mathvision_problems.parquet").is_file()


# --- a clone without the raw data sets ------------------------------------------------------


def test_every_ingest_node_names_the_raw_data_set_it_reads() -> None:
    assert set(NODE_SOURCES) == {node.name for node in create_pipeline().nodes}
    assert set(NODE_SOURCES.values()) == set(RAW_SOURCES)


def test_a_clone_without_raw_data_fails_before_the_first_node_saying_how_to_fetch(
    project_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The project's conf in a fresh folder with an empty data/01_raw, run as `kedro run
    --pipelines data_ingest` runs it: every hook of settings.py, no node started."""
    project = copy_project(project_root, tmp_path, monkeypatch)
    (project / "data" / "01_raw").mkdir(parents=True)
    counter = NodeCounter()
    with KedroSession.create(project_path=project) as session:
        session._hook_manager.register(counter)
        with pytest.raises(RawDataMissingError) as error:
            session.run(pipeline_names=["data_ingest"])
    assert counter.started == []
    assert str(error.value).startswith(
        "raw data set(s) gsm8k, mathvision, mgsm, movielens, tabmwp not in data/01_raw: "
        "gsm8k (no folder gsm8k/); mathvision (no folder mathvision_testmini/); "
    )
    assert "Fetch them with `creditflow fetch-data --from <folder holding a copy" in str(
        error.value
    )
    assert "or with internet `creditflow fetch-data` to download them" in str(error.value)


def test_the_raw_data_check_names_only_the_sets_the_run_reads(tmp_path: Path) -> None:
    params = {"raw_data_dir": str(tmp_path), "mgsm_languages": ["en"]}
    visual = create_pipeline().only_nodes_with_tags("visual")
    with pytest.raises(RawDataMissingError, match=r"raw data set\(s\) mathvision, tabmwp not in"):
        check_pipeline_raw_data(visual, params)
    (tmp_path / "tabmwp_numeric300" / "tables").mkdir(parents=True)
    (tmp_path / "tabmwp_numeric300" / "problems_shared.json").write_text("{}")
    with pytest.raises(RawDataMissingError, match=r"tabmwp \(missing tables/ \(absent or empty"):
        check_pipeline_raw_data(create_pipeline().only_nodes("ingest_tabmwp_problems"), params)


def test_the_raw_data_check_asks_only_for_the_configured_mgsm_languages(tmp_path: Path) -> None:
    """`mgsm_languages: [en, bn, sw, te]` with only those files: the check passes and the node
    ingests them; without one of them the check names that file, not the default languages."""
    folder = tmp_path / "mgsm"
    folder.mkdir()
    for code in ("en", "bn", "sw", "te"):
        (folder / f"mgsm_{code}.tsv").write_text(f"{code} one\t1\n{code} two\t2\n", "utf-8")
    params = {"raw_data_dir": str(tmp_path), "mgsm_languages": ["en", "bn", "sw", "te"]}
    mgsm = create_pipeline().only_nodes("ingest_mgsm_problems")
    catalog = DataCatalog({"params:data_ingest": MemoryDataset(params)})
    RawDataHook().before_pipeline_run(mgsm, catalog)
    problems = _run(mgsm, params)["mgsm_problems"]
    assert problems["language"].tolist() == ["en", "en", "bn", "bn", "sw", "sw", "te", "te"]
    (folder / "mgsm_te.tsv").unlink()
    with pytest.raises(RawDataMissingError, match=r"mgsm \(missing mgsm_te.tsv\)\. Fetch"):
        RawDataHook().before_pipeline_run(mgsm, catalog)


def test_the_default_run_needs_no_raw_data_set() -> None:
    """`kedro run` / `make run` (the experience chain on its synthetic world) reads neither the
    raw data sets nor the tables ingested from them, so a fresh clone runs it as it is."""
    configure_project("creditflow")  # find_pipelines needs the package configured
    default = register_pipelines()["__default__"]
    assert "params:data_ingest" not in default.inputs()
    assert not default.inputs() & create_pipeline().all_outputs()
