"""A CSV whose header names a column twice is refused, naming the file and the column: the raw
MovieLens files (ingest.validation.read_csv) and a task source of one's own
(ingest.source_rows.check_csv_header, run by TaskSourceHook before the first node). pandas
would load the repeat as ``answer.1`` and the schema would read the first ``answer`` alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from kedro.io import DataCatalog, MemoryDataset
from kedro.io.core import Version
from kedro.pipeline import Pipeline, node
from kedro_datasets.pandas import CSVDataset

from creditflow.errors import DataValidationError, TaskSourceError
from creditflow.hooks.task_source import TaskSourceHook
from creditflow.ingest.source_rows import check_csv_header, math_text_problems
from creditflow.ingest.validation import read_csv

REPEATED = "id,language,question,question_en,answer,answer\np1,en,Two and two?,Two and two?,4,5\n"
PLAIN = "id,language,question,question_en,answer\np1,en,Two and two?,Two and two?,4\n"
TEXT = {"dtype": str, "keep_default_na": False}


def _csv(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_raw_csv_with_a_repeated_column_names_the_file_and_the_column(tmp_path: Path) -> None:
    path = _csv(tmp_path / "ratings.csv", "userId,movieId,rating,rating,timestamp\n1,2,3,4,5\n")
    with pytest.raises(DataValidationError) as error:
        read_csv(path, ("userId", "movieId", "rating", "timestamp"))
    assert str(error.value).startswith(
        f"{path}, line 1: the header names column(s) ['rating'] more than once. Fix: rename"
    )


def test_pandas_keeps_the_first_of_two_columns_without_a_word(tmp_path: Path) -> None:
    """What the check stands in front of: the loaded frame reads as a valid source."""
    source = CSVDataset(filepath=str(_csv(tmp_path / "mine.csv", REPEATED)), load_args=TEXT)
    frame = source.load()
    assert list(frame.columns)[-2:] == ["answer", "answer.1"]
    assert math_text_problems(frame, "my_problems")["answer"].tolist() == ["4"]


def test_a_csv_source_with_a_repeated_column_is_refused(tmp_path: Path) -> None:
    path = _csv(tmp_path / "mine.csv", REPEATED)
    with pytest.raises(TaskSourceError) as error:
        check_csv_header(CSVDataset(filepath=str(path), load_args=TEXT), "my_problems")
    assert error.value.dataset == "my_problems" and error.value.column == "answer"
    assert str(error.value).startswith(
        f"task source `my_problems`, column `answer`: {path}: the header names column(s) "
        "['answer'] more than once (pandas would load the repeat as `answer.1`"
    )


def test_the_header_is_read_as_the_dataset_reads_its_file(tmp_path: Path) -> None:
    """Its separator and skipped lines, its newest version; a file without a header row, a
    plain header and an absent file pass (the load reports the last)."""
    semicolons = _csv(tmp_path / "semi.csv", "# exported\n" + REPEATED.replace(",", ";"))
    with pytest.raises(TaskSourceError, match=r"\['answer'\] more than once"):
        check_csv_header(
            CSVDataset(filepath=str(semicolons), load_args={"sep": ";", "skiprows": 1}), "semi"
        )
    version = "2026-01-01T00.00.00.000Z"
    _csv(tmp_path / "versioned.csv" / version / "versioned.csv", REPEATED)
    versioned = CSVDataset(filepath=str(tmp_path / "versioned.csv"), version=Version(None, None))
    with pytest.raises(TaskSourceError, match=rf"{version}/versioned.csv: the header names"):
        check_csv_header(versioned, "versioned")
    names = ["id", "language", "question", "question_en", "answer", "answer2"]
    headerless = CSVDataset(filepath=str(tmp_path / "semi.csv"), load_args={"names": names})
    check_csv_header(headerless, "headerless")
    check_csv_header(CSVDataset(filepath=str(_csv(tmp_path / "plain.csv", PLAIN))), "plain")
    check_csv_header(CSVDataset(filepath=str(tmp_path / "absent.csv")), "absent")
    check_csv_header(MemoryDataset(None), "memory")


def test_a_run_reading_such_a_source_fails_before_its_first_node(tmp_path: Path) -> None:
    path = _csv(tmp_path / "mine.csv", REPEATED)
    conf_catalog = {
        "my_problems": {"type": "pandas.CSVDataset", "metadata": {"task_schema": "math_text"}}
    }
    catalog = DataCatalog({"my_problems": CSVDataset(filepath=str(path), load_args=TEXT)})
    hook = TaskSourceHook()
    parameters = {"parameters": {"tapo": {"tasks": {"source": "my_problems"}}}}
    hook.after_catalog_created(catalog, conf_catalog, parameters)
    reading = Pipeline([node(lambda df: df, "tapo_source_problems", "out", name="reads_it")])
    with pytest.raises(TaskSourceError, match=r"task source `my_problems`, column `answer`"):
        hook.before_pipeline_run(reading, catalog)
