"""``tapo.tasks.source`` / ``tor.tasks.source`` (creditflow.hooks.task_source.TaskSourceHook): the
named catalog dataset stands under the task node's fixed input, an unknown name fails before
the first node listing the datasets of that schema, and the example of docs/howto/own_data.md
works as written in a Kedro session."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from kedro.config import OmegaConfigLoader
from kedro.framework.session import KedroSession
from kedro.io import DataCatalog, MemoryDataset
from kedro.io.core import Version
from kedro.pipeline import Pipeline, node
from kedro_datasets.pandas import CSVDataset, ParquetDataset

from creditflow.config.task_sources import SYNTHETIC, TASK_SOURCES, task_datasets
from creditflow.errors import ConfigError, MissingInputsError, TaskSourceError
from creditflow.hooks.task_source import TaskSourceHook
from creditflow.ingest.schemas import MATH_TEXT_SCHEMA, VISUAL_SCHEMA
from creditflow.pipelines.tapo import create_pipeline as tapo_pipeline
from creditflow.pipelines.tor import create_pipeline as tor_pipeline
from creditflow.tasks import splits
from tests.kedro_project import NodeCounter, copy_project

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

CONF_CATALOG = {
    "mgsm_problems": {"type": "pandas.ParquetDataset", "metadata": {"task_schema": "math_text"}},
    "gsm8k_train_problems": {"metadata": {"task_schema": "math_text"}},
    "tabmwp_problems": {"metadata": {"task_schema": "visual"}},
    "movielens_ratings": {"type": "pandas.ParquetDataset"},
    "tapo_{split}_tasks": {"type": "pandas.ParquetDataset"},
}


def _catalog(tmp_path: Path) -> DataCatalog:
    frame = pd.DataFrame({"x": [1]})
    return DataCatalog(
        {name: MemoryDataset(frame) for name in CONF_CATALOG if "{" not in name}
        | {"gsm8k_train_problems": CSVDataset(filepath=str(tmp_path / "g.csv"))}
    )


def _hooked(catalog: DataCatalog, tapo_source=SYNTHETIC, tor_source=SYNTHETIC) -> TaskSourceHook:
    hook = TaskSourceHook()
    parameters = {
        "parameters": {
            "tapo": {"tasks": {"source": tapo_source}},
            "tor": {"tasks": {"source": tor_source}},
        }
    }
    hook.after_catalog_created(catalog, CONF_CATALOG, parameters)
    return hook


def _reading(name: str) -> Pipeline:
    return Pipeline([node(lambda df: df, name, "out", name="reads_it")])


def test_the_constants_match_the_schemas_and_the_pipelines():
    assert SYNTHETIC == splits.SYNTHETIC
    assert TASK_SOURCES["tapo"].schema == MATH_TEXT_SCHEMA.name
    assert TASK_SOURCES["tor"].schema == VISUAL_SCHEMA.name
    assert TASK_SOURCES["tapo"].dataset in tapo_pipeline().only_nodes("build_tapo_tasks").inputs()
    assert TASK_SOURCES["tor"].dataset in tor_pipeline().only_nodes("build_tor_tasks").inputs()


def test_the_shipped_catalog_declares_its_task_sources(project_root):
    conf = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    catalog = conf["catalog"]
    assert task_datasets(catalog, "math_text") == ["gsm8k_train_problems", "mgsm_problems"]
    assert task_datasets(catalog, "visual") == ["mathvision_problems", "tabmwp_problems"]


def test_synthetic_is_none_and_a_catalog_source_is_the_same_dataset_object(tmp_path):
    catalog = _catalog(tmp_path)
    _hooked(catalog, tapo_source="gsm8k_train_problems")
    assert catalog.get("tapo_source_problems") is catalog.get("gsm8k_train_problems")
    assert catalog.load("tor_source_problems") is None


def test_an_unknown_source_fails_only_runs_that_read_it_naming_the_valid_ones(tmp_path):
    catalog = _catalog(tmp_path)
    hook = _hooked(catalog, tapo_source="gsm8k_trian_problems", tor_source="movielens_ratings")
    hook.before_pipeline_run(_reading("other"), catalog)  # a run that reads neither
    with pytest.raises(ConfigError) as error:
        hook.before_pipeline_run(_reading("tapo_source_problems"), catalog)
    assert str(error.value).startswith(
        "tapo.tasks.source: no catalog dataset `gsm8k_trian_problems` (did you mean "
        "`gsm8k_train_problems`?); use `synthetic` or one of the catalog's math_text datasets: "
        "gsm8k_train_problems, mgsm_problems; a dataset of your own becomes a source with "
        "`metadata: {task_schema: math_text}`"
    )
    with pytest.raises(ConfigError, match="`movielens_ratings` is in the catalog but its entry"):
        hook.before_pipeline_run(_reading("tor_source_problems"), catalog)


def test_a_source_of_the_other_schema_is_refused(tmp_path):
    catalog = _catalog(tmp_path)
    hook = _hooked(catalog, tor_source="mgsm_problems")
    with pytest.raises(ConfigError, match="visual datasets: tabmwp_problems"):
        hook.before_pipeline_run(_reading("tor_source_problems"), catalog)


def test_a_versioned_source_never_saved_fails_before_the_first_node(tmp_path):
    catalog = _catalog(tmp_path)
    catalog["gsm8k_train_problems"] = ParquetDataset(
        filepath=str(tmp_path / "g.parquet"), version=Version(None, None)
    )
    hook = _hooked(catalog, tapo_source="gsm8k_train_problems")
    with pytest.raises(MissingInputsError, match="task source `gsm8k_train_problems`.*data_ingest"):
        hook.before_pipeline_run(_reading("tapo_source_problems"), catalog)


# --- the example of docs/howto/own_data.md, in a Kedro session -------------------------------

# conf/local/catalog.yml, as docs/howto/own_data.md writes it.
README_ENTRY = """\
my_problems:
  type: pandas.CSVDataset
  filepath: data/01_raw/my_problems.csv
  load_args: {dtype: str, keep_default_na: false}
  metadata: {task_schema: math_text}
"""
ROWS = [
    (
        "q1",
        "de",
        "Anna hat 3 Äpfel und kauft 2. Wie viele?",
        "Anna has 3 apples and buys 2. How many?",
        "5",
    ),
    (
        "q1",
        "en",
        "Anna has 3 apples and buys 2. How many?",
        "Anna has 3 apples and buys 2. How many?",
        "5",
    ),
    (
        "q2",
        "de",
        "Tom hat 10 Stifte und verliert 4. Wie viele?",
        "Tom has 10 pens and loses 4. How many?",
        "6",
    ),
    (
        "q2",
        "en",
        "Tom has 10 pens and loses 4. How many?",
        "Tom has 10 pens and loses 4. How many?",
        "6",
    ),
]


@pytest.fixture
def project(project_root: Path, tmp_path: Path, monkeypatch) -> Path:
    copy_project(project_root, tmp_path, monkeypatch)
    (tmp_path / "conf/local/catalog.yml").write_text(README_ENTRY, encoding="utf-8")
    (tmp_path / "data/01_raw").mkdir(parents=True)
    return tmp_path


def _write_problems(project: Path, rows) -> None:
    frame = pd.DataFrame(rows, columns=MATH_TEXT_SCHEMA.names)
    frame.to_csv(project / "data/01_raw/my_problems.csv", index=False)


def _run_tasks_node(project: Path, source: str) -> tuple[str, NodeCounter]:
    params = {
        "tapo": {"tasks": {"source": source, "heldout_fraction": 0.5}},
        "tracking": {"enabled": False},
    }
    counter = NodeCounter()
    with KedroSession.create(project_path=project, runtime_params=params) as session:
        session._hook_manager.register(counter)
        session.run(pipeline_names=["tapo"], node_names=["build_tapo_tasks"])
        return session.session_id, counter


def test_the_readme_example_makes_a_csv_a_tapo_source(project):
    _write_problems(project, ROWS)
    run_id, counter = _run_tasks_node(project, "my_problems")
    assert counter.started == ["build_tapo_tasks"]
    folder = project / "data/05_model_input"
    train = pd.read_parquet(folder / f"tapo_train_tasks.parquet/{run_id}/tapo_train_tasks.parquet")
    held_out = pd.read_parquet(folder / f"tapo_eval_tasks.parquet/{run_id}/tapo_eval_tasks.parquet")
    assert len(train) == len(held_out) == 2  # one problem each side, in both its languages
    assert train["id"].nunique() == held_out["id"].nunique() == 1
    assert set(train["id"]) != set(held_out["id"])
    assert set(train["language"]) == {"de", "en"}


def test_a_bad_row_of_the_users_file_is_named_with_its_column(project):
    rows = [
        *ROWS[:2],
        ("q2", "de", "Tom hat 10 Stifte. Wie viele?", "Tom has 10 pens.", ""),
        ROWS[3],
    ]
    _write_problems(project, rows)
    with pytest.raises(TaskSourceError) as error:
        _run_tasks_node(project, "my_problems")
    assert str(error.value) == (
        "task source `my_problems`, row 2, column `answer`: empty text. "
        "Fix: fill in the answer or drop the row."
    )


def test_an_unknown_source_fails_the_session_before_the_first_node(project):
    counter = NodeCounter()
    params = {"tapo": {"tasks": {"source": "my_problem"}}, "tracking": {"enabled": False}}
    with KedroSession.create(project_path=project, runtime_params=params) as session:
        session._hook_manager.register(counter)
        with pytest.raises(ConfigError, match="did you mean `my_problems`"):
            session.run(pipeline_names=["tapo"], node_names=["build_tapo_tasks"])
    assert counter.started == []
