"""Catalog datasets as task sources (``tapo.tasks.source``, ``tor.tasks.source``), checked
against their task schema when they load.

A source is any table the catalog loads: the ingested ones, or a user's Parquet / CSV / JSONL
file or Hugging Face dataset saved to disk (``huggingface.ArrowDataset``; README "Your own
data"). :func:`math_text_problems` and :func:`visual_problems` check it against
:data:`~creditflow.ingest.schemas.MATH_TEXT_SCHEMA` / :data:`~creditflow.ingest.schemas.VISUAL_SCHEMA`
plus the optional gold reasoning column (``reasoning_en`` / ``reasoning``), and return it in
that schema's columns. Every error names the dataset and, where there is one, the row (0-based,
in the order the dataset loads; a CSV's line is the row + 2) and the column, says what is
wrong and how to fix it.

Accepted cell values: text columns take non-empty strings, and integers (a CSV's ``id`` or
``answer`` column read as numbers), which become their decimal string; a float is refused
(``12.0`` is no answer, and a column with a blank cell loads as floats). ``choices`` takes a
list of strings, or a JSON list in a string (CSV); blank or null is free-form (no options).
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from creditflow.errors import TaskSourceError
from creditflow.ingest.schemas import MATH_TEXT_SCHEMA, VISUAL_SCHEMA, TableSchema

# The optional gold reasoning column of each schema: the SFT target's reasoning before the
# answer; without it SFT trains on the answer format alone.
REASONING_COLUMNS = {MATH_TEXT_SCHEMA.name: "reasoning_en", VISUAL_SCHEMA.name: "reasoning"}
_TEXT_AS_LOADED = (
    "load the column as text (a CSV: `load_args: {dtype: str, keep_default_na: false}`)"
)


def math_text_problems(data: Any, dataset: str) -> pd.DataFrame:
    """``data`` (a frame or Hugging Face ``Dataset``) as math-text problems: the columns of
    ``MATH_TEXT_SCHEMA`` then ``reasoning_en`` ("" where the source has none), all str.

    Raises:
        TaskSourceError: a column is missing, a cell is not text (see the module docstring),
            ``question_en`` holds translation tags, or ``(id, language)`` repeats.
    """
    frame = checked_frame(data, dataset, MATH_TEXT_SCHEMA, REASONING_COLUMNS[MATH_TEXT_SCHEMA.name])
    out = pd.DataFrame(
        {name: _text_column(frame, name, dataset) for name in MATH_TEXT_SCHEMA.names}
    )
    out["reasoning_en"] = _optional_text_column(frame, "reasoning_en", dataset)
    for row, text in enumerate(out["question_en"]):
        if "<translation>" in text or "</translation>" in text:
            raise TaskSourceError(
                dataset,
                "the English reference holds a translation tag",
                "remove <translation> / </translation> (the policy writes them)",
                row,
                "question_en",
            )
    _require_unique(out, MATH_TEXT_SCHEMA, dataset)
    return out.astype("str")


def visual_problems(data: Any, dataset: str) -> pd.DataFrame:
    """``data`` (a frame or Hugging Face ``Dataset``) as visual problems: the columns of
    ``VISUAL_SCHEMA`` (``choices`` as lists of str) then ``reasoning`` ("" where absent).
    Every ``image_path`` must be a file Pillow can read (relative paths are taken from the
    working directory, the project root under ``kedro run``).

    Raises:
        TaskSourceError: a column is missing, a cell is not text, ``choices`` is not a list
            of strings, an image is missing or unreadable, or an ``id`` repeats.
    """
    frame = checked_frame(data, dataset, VISUAL_SCHEMA, REASONING_COLUMNS[VISUAL_SCHEMA.name])
    text = [name for name in VISUAL_SCHEMA.names if name != "choices"]
    out = pd.DataFrame({name: _text_column(frame, name, dataset) for name in text}).astype("str")
    out["choices"] = [
        _choices(value, dataset, row) for row, value in enumerate(frame["choices"].tolist())
    ]
    out["reasoning"] = pd.Series(_optional_text_column(frame, "reasoning", dataset), dtype="str")
    for row, path in enumerate(out["image_path"]):
        _check_image(Path(path), dataset, row)
    _require_unique(out, VISUAL_SCHEMA, dataset)
    return out[[*VISUAL_SCHEMA.names, "reasoning"]]


def as_frame(data: Any, dataset: str) -> pd.DataFrame:
    """A pandas frame, a Hugging Face ``Dataset`` (``to_pandas``) as a frame."""
    if isinstance(data, pd.DataFrame):
        return data
    if hasattr(data, "to_pandas"):
        return data.to_pandas()
    if hasattr(data, "keys") and all(hasattr(part, "to_pandas") for part in data.values()):
        raise TaskSourceError(
            dataset,
            f"a Hugging Face DatasetDict with splits {sorted(data.keys())}, not one table",
            "point the catalog entry's `path` at one split's folder (e.g. <path>/train)",
        )
    raise TaskSourceError(
        dataset,
        f"loads as a {type(data).__name__}, not a table",
        "use a dataset type that loads a pandas DataFrame or a Hugging Face Dataset",
    )


def checked_frame(data: Any, dataset: str, schema: TableSchema, optional: Any) -> pd.DataFrame:
    """``data`` as a non-empty frame holding every column of ``schema`` (``optional``: the
    schema's optional columns, as the error names them), else a ``TaskSourceError``."""
    frame = as_frame(data, dataset)
    missing = [name for name in schema.names if name not in frame.columns]
    if missing:
        raise TaskSourceError(
            dataset,
            f"missing column(s) {missing}; it has {[str(c) for c in frame.columns]}",
            f"the {schema.name} schema needs {schema.names} (optional: "
            f"{optional}); rename or add the columns",
        )
    if frame.empty:
        raise TaskSourceError(dataset, "has no rows", "point the entry at a non-empty table")
    return frame.reset_index(drop=True)


def _text_column(frame: pd.DataFrame, column: str, dataset: str) -> list[str]:
    values = frame[column].tolist()
    # A blank CSV cell turns its whole column into floats: name the blank, not the first float.
    for row, value in enumerate(values):
        if _is_missing(value):
            raise TaskSourceError(
                dataset, "missing value", f"fill in the {column} or drop the row", row, column
            )
    return [_text(value, dataset, row, column) for row, value in enumerate(values)]


def _optional_text_column(frame: pd.DataFrame, column: str, dataset: str) -> list[str]:
    if column not in frame.columns:
        return [""] * len(frame)
    return [
        "" if _is_missing(value) else _text(value, dataset, row, column, allow_empty=True)
        for row, value in enumerate(frame[column].tolist())
    ]


def _text(value: Any, dataset: str, row: int, column: str, allow_empty: bool = False) -> str:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_):
        return str(int(value))
    if isinstance(value, str):
        if not value.strip() and not allow_empty:
            raise TaskSourceError(
                dataset, "empty text", f"fill in the {column} or drop the row", row, column
            )
        return value
    raise TaskSourceError(
        dataset, f"{value!r} is a {type(value).__name__}, not text", _TEXT_AS_LOADED, row, column
    )


def _is_missing(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float) and np.isnan(value)


def _choices(value: Any, dataset: str, row: int) -> list[str]:
    if _is_missing(value) or (isinstance(value, str) and not value.strip()):
        return []
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
    if isinstance(parsed, np.ndarray | Sequence) and not isinstance(parsed, str):
        items = list(parsed)
        if all(isinstance(item, str) for item in items):
            return items
    raise TaskSourceError(
        dataset,
        f"{value!r} is not a list of strings",
        'write the options as a list (in a CSV cell, a JSON list such as ["3", "4"]); '
        "leave it blank for a free-form answer",
        row,
        "choices",
    )


def _check_image(path: Path, dataset: str, row: int) -> None:
    """The file exists and Pillow can parse it (``verify``: no pixels decoded), so a broken
    image fails on load, naming its row, and not at evaluation after training."""
    fix = "correct the path (relative paths are taken from the project root) or drop the row"
    if not path.is_file():
        problem = f"no image file at {path} (resolved to {path.resolve()})"
        raise TaskSourceError(dataset, problem, fix, row, "image_path")
    try:
        with Image.open(path) as image:
            image.verify()
    except (OSError, SyntaxError, ValueError) as error:  # PIL's errors for a bad file
        problem = f"{path} is not a readable image ({type(error).__name__}: {error})"
        raise TaskSourceError(dataset, problem, fix, row, "image_path") from error


def _require_unique(frame: pd.DataFrame, schema: TableSchema, dataset: str) -> None:
    key = list(schema.key)
    repeated = frame.duplicated(key, keep=False)
    if repeated.any():
        rows = [int(i) for i in np.flatnonzero(repeated.to_numpy())]
        first = frame.loc[rows[0], key].to_dict()
        raise TaskSourceError(
            dataset,
            f"rows {rows[:5]} share the key {first} ({' + '.join(key)} must be unique)",
            "give each problem its own id (one row per language, for multilingual sources)",
            rows[1],
            "id",
        )
