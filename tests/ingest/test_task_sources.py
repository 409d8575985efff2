"""A user's table as a task source (creditflow.ingest.source_rows): each file type the README
names loads through its Kedro dataset and passes the schema check, and each kind of bad
table fails naming the dataset, the row and the column."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kedro_datasets.huggingface import ArrowDataset
from kedro_datasets.pandas import CSVDataset, JSONDataset, ParquetDataset
from PIL import Image

from creditflow.errors import TaskSourceError
from creditflow.ingest.schemas import MATH_TEXT_SCHEMA, VISUAL_SCHEMA
from creditflow.ingest.source_rows import (
    REASONING_COLUMNS,
    math_text_problems,
    visual_problems,
)
from datasets import Dataset, DatasetDict

# The README's example CSV ("Your own data"), as a user writes it: a header, numbers unquoted.
MATH_CSV = """\
id,language,question,question_en,answer,reasoning_en
q1,de,Anna hat 3 Äpfel und kauft 2 dazu. Wie viele hat sie?,Anna has 3 apples and buys 2 more. How many does she have?,5,3 + 2 = 5.
q1,en,Anna has 3 apples and buys 2 more. How many does she have?,Anna has 3 apples and buys 2 more. How many does she have?,5,3 + 2 = 5.
q2,de,Tom hat 10 Stifte und verliert 4. Wie viele bleiben?,Tom has 10 pens and loses 4. How many are left?,6,
"""
# README: a CSV's entry loads every column as text, so ids and answers stay as written.
CSV_LOAD_ARGS = {"dtype": str, "keep_default_na": False}


def _math_csv(path: Path, text: str = MATH_CSV) -> CSVDataset:
    path.write_text(text, encoding="utf-8")
    return CSVDataset(filepath=str(path), load_args=CSV_LOAD_ARGS)


def _error(match: str):
    return pytest.raises(TaskSourceError, match=re.escape(match))


def test_the_readme_csv_is_a_math_text_source(tmp_path):
    problems = math_text_problems(_math_csv(tmp_path / "mine.csv").load(), "my_problems")
    assert problems.columns.tolist() == [*MATH_TEXT_SCHEMA.names, "reasoning_en"]
    assert problems["answer"].tolist() == ["5", "5", "6"]
    assert problems["reasoning_en"].tolist() == ["3 + 2 = 5.", "3 + 2 = 5.", ""]
    assert all(pd.api.types.is_string_dtype(problems[c]) for c in problems.columns)


def test_numbers_read_as_numbers_become_text_and_reasoning_is_optional(tmp_path):
    # Without load_args pandas reads the answer column as int64: integers are taken as text.
    path = tmp_path / "plain.csv"
    path.write_text("id,language,question,question_en,answer\n7,en,Q?,Q?,12\n", encoding="utf-8")
    problems = math_text_problems(CSVDataset(filepath=str(path)).load(), "plain")
    assert problems[["id", "answer", "reasoning_en"]].iloc[0].tolist() == ["7", "12", ""]


def test_jsonl_and_a_hugging_face_dataset_saved_to_disk_are_sources(tmp_path):
    rows = _math_csv(tmp_path / "mine.csv").load().to_dict("records")
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    from_jsonl = JSONDataset(filepath=str(jsonl), load_args={"lines": True, "dtype": False})
    pd.testing.assert_frame_equal(
        math_text_problems(from_jsonl.load(), "jsonl"),
        math_text_problems(pd.DataFrame(rows), "frame"),
    )
    saved = ArrowDataset(path=str(tmp_path / "hf"))
    saved.save(Dataset.from_list(rows))
    assert math_text_problems(saved.load(), "hf")["id"].tolist() == ["q1", "q1", "q2"]


def test_a_dataset_dict_says_to_pick_a_split(tmp_path):
    rows = _math_csv(tmp_path / "mine.csv").load().to_dict("records")
    saved = ArrowDataset(path=str(tmp_path / "hf"))
    saved.save(DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows)}))
    with _error("task source `hf`: a Hugging Face DatasetDict with splits ['test', 'train']"):
        math_text_problems(saved.load(), "hf")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # A blank answer on data row 2 (CSV line 4): named, not the float column it caused.
        (lambda t: t.replace(",6,\n", ",,\n"), "task source `my_problems`, row 2, column `answer`"),
        (lambda t: t.replace("q2,de", "q1,de"), "row 2, column `id`: rows [0, 2] share the key"),
        (
            lambda t: t.replace("Tom has 10", "<translation>Tom has 10"),
            "row 2, column `question_en`: the English reference holds a translation tag",
        ),
        (lambda t: t.replace("question_en,answer", "english,answer"), "missing column(s)"),
    ],
)
def test_a_bad_math_text_source_names_the_row_and_column(tmp_path, edit, message):
    for load_args in (CSV_LOAD_ARGS, {}):  # as the README says, and pandas' defaults
        path = tmp_path / "bad.csv"
        path.write_text(edit(MATH_CSV), encoding="utf-8")
        with _error(message):
            math_text_problems(
                CSVDataset(filepath=str(path), load_args=load_args).load(), "my_problems"
            )


def test_a_missing_column_lists_the_schema_and_the_columns_found(tmp_path):
    frame = pd.DataFrame({"id": ["a"], "question": ["Q?"], "answer": ["1"]})
    with pytest.raises(TaskSourceError) as error:
        math_text_problems(frame, "mine")
    assert str(error.value) == (
        "task source `mine`: missing column(s) ['language', 'question_en']; it has "
        "['id', 'question', 'answer']. Fix: the math_text schema needs "
        f"{MATH_TEXT_SCHEMA.names} (optional: reasoning_en); rename or add the columns."
    )


def test_a_float_answer_is_refused_with_how_to_load_text():
    frame = pd.DataFrame({c: ["x"] for c in MATH_TEXT_SCHEMA.names}).assign(answer=[2.5])
    with _error("row 0, column `answer`: 2.5 is a float, not text. Fix: load the column as text"):
        math_text_problems(frame, "mine")


# --- visual -----------------------------------------------------------------------------------


@pytest.fixture
def images(tmp_path) -> list[str]:
    paths = []
    for i in range(3):
        path = tmp_path / f"img{i}.png"
        Image.new("RGB", (20, 20), (i * 80, 0, 0)).save(path)
        paths.append(str(path))
    return paths


def _visual_csv(tmp_path: Path, images: list[str], choices: str = '"[""3"", ""4""]"') -> Path:
    path = tmp_path / "visual.csv"
    path.write_text(
        "id,image_path,question,answer,choices\n"
        f"v1,{images[0]},How many?,3,\n"
        f"v2,{images[1]},Which one?,A,{choices}\n",
        encoding="utf-8",
    )
    return path


def test_a_visual_csv_with_json_choices_and_a_parquet_table_are_sources(tmp_path, images):
    csv = CSVDataset(filepath=str(_visual_csv(tmp_path, images)), load_args=CSV_LOAD_ARGS)
    problems = visual_problems(csv.load(), "my_pictures")
    assert problems.columns.tolist() == [*VISUAL_SCHEMA.names, REASONING_COLUMNS["visual"]]
    assert problems["choices"].tolist() == [[], ["3", "4"]]
    # Parquet hands list cells back as numpy arrays (the ingested tables are stored so).
    parquet = ParquetDataset(filepath=str(tmp_path / "visual.parquet"))
    parquet.save(problems)
    again = visual_problems(parquet.load(), "parquet")
    assert again["choices"].tolist() == [[], ["3", "4"]]
    assert isinstance(parquet.load()["choices"].iloc[1], np.ndarray)


def test_a_missing_image_names_its_row(tmp_path, images):
    path = _visual_csv(tmp_path, [images[0], str(tmp_path / "nowhere.png")])
    with _error("task source `my_pictures`, row 1, column `image_path`: no image file at"):
        visual_problems(
            CSVDataset(filepath=str(path), load_args=CSV_LOAD_ARGS).load(), "my_pictures"
        )


def test_a_file_that_is_not_an_image_names_its_row(tmp_path, images):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a picture")
    path = _visual_csv(tmp_path, [str(broken), images[1]])
    with _error("row 0, column `image_path`:"):
        visual_problems(CSVDataset(filepath=str(path), load_args=CSV_LOAD_ARGS).load(), "mine")


def test_choices_that_are_not_a_list_name_the_row(tmp_path, images):
    path = _visual_csv(tmp_path, images, choices="3 or 4")
    with _error("task source `mine`, row 1, column `choices`: '3 or 4' is not a list of strings"):
        visual_problems(CSVDataset(filepath=str(path), load_args=CSV_LOAD_ARGS).load(), "mine")


def test_an_empty_table_is_an_error():
    with _error("task source `empty`: has no rows"):
        visual_problems(pd.DataFrame(columns=VISUAL_SCHEMA.names), "empty")
