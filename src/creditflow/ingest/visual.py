"""Loaders for the image-based problems (MATH-Vision, TabMWP) into :data:`VISUAL_SCHEMA` frames."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd

from creditflow.ingest.schemas import VISUAL_SCHEMA, conform_frame
from creditflow.ingest.validation import (
    SourceLine,
    image_problem,
    number_field,
    read_json_object,
    read_jsonl,
    require_fields,
    require_unique,
    text_field,
)

logger = logging.getLogger(__name__)

MATHVISION_FILE = "testmini_shared.jsonl"
TABMWP_FILE = "problems_shared.json"


def load_mathvision(source_dir: Path, *, max_rows: int | None = None) -> pd.DataFrame:
    """Load MATH-Vision testmini; ``choices`` are its ``options`` (empty when free-form).

    The answer is an option letter or a number/expression, so it is only checked non-empty.

    Args:
        source_dir: the ``mathvision_testmini`` folder.
        max_rows: keep the first N problems (all when None).

    Returns:
        A :data:`VISUAL_SCHEMA` frame with ids ``mathvision-<id>`` and image paths
        ``<source_dir>/images/<id>.jpg`` (as the record's ``image`` field gives them).

    Raises:
        DataValidationError: a record is malformed, its id repeats or its image is missing.
    """
    rows, ids = [], []
    for at, record in read_jsonl(source_dir / MATHVISION_FILE):
        require_fields(record, ("id", "question", "options", "answer", "image"), at)
        id_ = f"mathvision-{text_field(record['id'], 'id', at)}"
        rows.append(
            (
                id_,
                _image_path(source_dir / text_field(record["image"], "image", at), at),
                text_field(record["question"], "question", at),
                text_field(record["answer"], "answer", at),
                _choices(record["options"], "options", at),
            )
        )
        ids.append((id_, at))
    require_unique(ids)
    logger.info("MATH-Vision: %d problems from %s", len(rows), source_dir)
    return conform_frame(pd.DataFrame(rows[:max_rows], columns=VISUAL_SCHEMA.names), VISUAL_SCHEMA)


def load_tabmwp(source_dir: Path, *, max_rows: int | None = None) -> pd.DataFrame:
    """Load the TabMWP numeric subset as an image-only task (table given by tables/<pid>.png).

    The text forms of the table (``table``, ``table_title``, ``table_for_pd``, ...) are not
    read, so the model must read the table from the image (tabmwp_numeric300/SOURCE.md).

    Args:
        source_dir: the ``tabmwp_numeric300`` folder.
        max_rows: keep the first N problems in file order (all when None).

    Returns:
        A :data:`VISUAL_SCHEMA` frame with ids ``tabmwp-<pid>`` and canonical numeric answers.

    Raises:
        DataValidationError: a record is malformed, its pid repeats, its answer is not a
            number or its image is missing.
    """
    rows = []
    for at, pid, record in read_json_object(source_dir / TABMWP_FILE):
        if not isinstance(record, dict):
            raise at.error(f"record {pid!r} is not a JSON object", "write {pid: {...}}")
        require_fields(record, ("question", "answer", "choices"), at)
        rows.append(
            (
                f"tabmwp-{pid}",
                _image_path(source_dir / "tables" / f"{pid}.png", at),
                text_field(record["question"], "question", at),
                number_field(record["answer"], "answer", at),
                _choices(record["choices"], "choices", at),
            )
        )
    logger.info("TabMWP: %d problems from %s", len(rows), source_dir)
    return conform_frame(pd.DataFrame(rows[:max_rows], columns=VISUAL_SCHEMA.names), VISUAL_SCHEMA)


def _image_path(path: Path, at: SourceLine) -> str:
    """``path`` as a POSIX string, after checking the file exists and is an image Pillow can
    decode (``image_problem``: pixels decoded, pixel count bounded), so a broken image fails
    here, naming its record, and not at evaluation after training."""
    if not path.is_file():
        raise at.error(
            f"image {path} not found", "restore the image file from the origin or drop the record"
        )
    if problem := image_problem(path):
        raise at.error(
            f"image {path} is not a readable image ({problem})",
            "restore the image file from the origin (an image over Pillow's pixel bound: "
            "scale it down) or drop the record",
        )
    return path.as_posix()


def _choices(value: Any, field: str, at: SourceLine) -> list[str]:
    """Answer options as a list of strings; null means free-form (no options)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise at.error(f"field {field!r} is not null or a list of strings", "fix the options")
    return value
