"""Loaders for the math text problems (MGSM, GSM8K) into :data:`MATH_TEXT_SCHEMA` frames."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from creditflow.ingest.schemas import MATH_TEXT_SCHEMA, conform_frame
from creditflow.ingest.validation import (
    SourceLine,
    number_field,
    read_jsonl,
    read_tsv,
    require_fields,
    require_unique,
    text_field,
)

logger = logging.getLogger(__name__)

GSM8K_FILES = {"train": "train.jsonl", "test": "test_shared.jsonl"}
GSM8K_TEST_LINE_INDEX = "test_shared_line_index.txt"


def load_mgsm(
    source_dir: Path, languages: Sequence[str], *, max_rows: int | None = None
) -> pd.DataFrame:
    """Load ``mgsm_<lang>.tsv`` for each language, paired line by line with ``mgsm_en.tsv``.

    Args:
        source_dir: the ``mgsm`` folder.
        languages: ISO 639-1 codes; one row per problem and language, in this order.
        max_rows: keep the first N problems of each language (all when None).

    Returns:
        A :data:`MATH_TEXT_SCHEMA` frame; ``mgsm-0042`` is line 43 in every language, so
        ``(id, language)`` is unique.

    Raises:
        DataValidationError: a file is missing, malformed or not line-aligned with English.
    """
    english = _read_mgsm_file(source_dir / "mgsm_en.tsv")
    rows = []
    for language in languages:
        path = source_dir / f"mgsm_{language}.tsv"
        if not path.is_file():
            available = sorted(p.stem.removeprefix("mgsm_") for p in source_dir.glob("mgsm_*.tsv"))
            raise SourceLine(path).error(
                f"no MGSM file for language {language!r}",
                f"set data_ingest.mgsm_languages to codes among {available}",
            )
        problems = english if language == "en" else _read_mgsm_file(path)
        if len(problems) != len(english):
            raise SourceLine(path).error(
                f"{len(problems)} problems, but mgsm_en.tsv has {len(english)}",
                "each file must be a line-by-line translation of mgsm_en.tsv",
            )
        for index, ((at, question, answer), (_, question_en, answer_en)) in enumerate(
            zip(problems, english, strict=True)
        ):
            # Answers are identical across languages (mgsm/SOURCE.md); a mismatch means the
            # lines are shifted, and question_en would then pair the wrong problem.
            if answer != answer_en:
                raise at.error(
                    f"answer {answer} differs from {answer_en} on the same line of mgsm_en.tsv",
                    "keep the files line-aligned with mgsm_en.tsv (no added or dropped lines)",
                )
            if max_rows is None or index < max_rows:
                rows.append((f"mgsm-{index:04d}", language, question, question_en, answer))
    logger.info(
        "MGSM: %d problems x %d languages from %s", len(english), len(languages), source_dir
    )
    return conform_frame(pd.DataFrame(rows, columns=MATH_TEXT_SCHEMA.names), MATH_TEXT_SCHEMA)


def load_gsm8k(source_dir: Path, split: str, *, max_rows: int | None = None) -> pd.DataFrame:
    """Load one GSM8K split; the answer is the number after the solution's ``#### ``.

    Args:
        source_dir: the ``gsm8k`` folder.
        split: ``train`` (train.jsonl) or ``test`` (test_shared.jsonl, whose original line
            numbers are in test_shared_line_index.txt).
        max_rows: keep the first N problems (all when None).

    Returns:
        A :data:`MATH_TEXT_SCHEMA` frame with language ``en``, question_en = question and ids
        ``gsm8k-<split>-<0-based line in the original jsonl, 4 digits>``.

    Raises:
        ValueError: unknown split.
        DataValidationError: a record is malformed or the line index does not fit.
    """
    if split not in GSM8K_FILES:
        raise ValueError(f"unknown GSM8K split {split!r}; valid ones: {sorted(GSM8K_FILES)}")
    records = read_jsonl(source_dir / GSM8K_FILES[split])
    if split == "test":
        line_indexes = _read_line_index(source_dir / GSM8K_TEST_LINE_INDEX, len(records))
    else:
        line_indexes = list(range(len(records)))
    rows = []
    for (at, record), line_index in zip(records, line_indexes, strict=True):
        require_fields(record, ("question", "answer"), at)
        question = text_field(record["question"], "question", at)
        _, marker, final = text_field(record["answer"], "answer", at).rpartition("#### ")
        if not marker:
            raise at.error(
                "field 'answer' has no '#### ' marker before the final answer",
                "end the solution with a line '#### <number>'",
            )
        answer = number_field(final, "answer (after '#### ')", at)
        rows.append((f"gsm8k-{split}-{line_index:04d}", "en", question, question, answer))
    logger.info("GSM8K %s: %d problems from %s", split, len(rows), source_dir)
    frame = pd.DataFrame(rows[:max_rows], columns=MATH_TEXT_SCHEMA.names)
    return conform_frame(frame, MATH_TEXT_SCHEMA)


def _read_mgsm_file(path: Path) -> list[tuple[SourceLine, str, str]]:
    """(line, question, canonical answer) for each row of a two-column MGSM TSV file."""
    problems = []
    for at, row in read_tsv(path):
        if len(row) != 2:
            raise at.error(
                f"{len(row)} tab-separated columns, expected 2 (question, answer)",
                "put exactly one tab between question and answer and no tab inside them",
            )
        problems.append(
            (at, text_field(row[0], "question", at), number_field(row[1], "answer", at))
        )
    return problems


def _read_line_index(path: Path, expected: int) -> list[int]:
    """The 0-based original line number of each test_shared.jsonl line, one per line."""
    indexes = []
    for at, row in read_tsv(path):
        if len(row) != 1 or not row[0].strip().isdecimal():
            raise at.error(f"{row!r} is not a line number", "write one integer >= 0 per line")
        indexes.append((int(row[0]), at))
    if len(indexes) != expected:
        raise SourceLine(path).error(
            f"{len(indexes)} line numbers for {expected} test problems",
            f"write exactly one line number per line of {GSM8K_FILES['test']}",
        )
    require_unique((f"{index:04d}", at) for index, at in indexes)
    return [index for index, _ in indexes]
