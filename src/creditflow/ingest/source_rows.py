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

Hostile cells are refused, never repaired, so that what trains is what the file says:

- text longer than its column's bound in :data:`MAX_TEXT_CHARS` (a 5 MB question would reach
  SFT as a prompt of millions of tokens, or exhaust memory in evaluation);
- control characters other than tab, newline and carriage return (C0, DEL and C1: a NUL in
  ``11\\0`` makes an answer no completion can ever match, and a NUL in text is the mark of a
  UTF-16 file read as UTF-8);
- chat control tokens (``<|im_end|>``, ``<|im_start|>``, any ``<|name|>``): the tokenizer
  reads them as the real control tokens, so a row could close the user turn and write an
  assistant turn of its own;
- a math-text ``answer`` that is no plain finite number as the reasoning reward reads it
  (``gold_answer``): ``NaN``, ``inf``, a spreadsheet formula, ``1/0``; ``\\boxed{NaN}`` would
  otherwise be "right".

A CSV file whose header names a column twice is refused before the first node
(:func:`check_csv_header`): pandas would load the repeat as ``<column>.1`` and the schema would
read the first alone.

The same problem ``id`` with different answers in different languages is allowed (each row
is scored against its own answer) but logged as a warning naming the ids.
"""

from __future__ import annotations

import copy
import json
import logging
import numbers
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from kedro_datasets.pandas import CSVDataset
from tqdm.auto import tqdm

from creditflow.errors import TaskSourceError
from creditflow.ingest.schemas import (
    MATH_TEXT_SCHEMA,
    PROMPT_SCHEMA,
    VISUAL_SCHEMA,
    TableSchema,
)
from creditflow.ingest.validation import canonical_number, image_problem, repeated_names
from creditflow.rewards.reasoning import MAX_ANSWER_CHARS, gold_answer

logger = logging.getLogger(__name__)

# The optional gold reasoning column of each schema: the SFT target's reasoning before the
# answer; without it SFT trains on the answer format alone.
REASONING_COLUMNS = {MATH_TEXT_SCHEMA.name: "reasoning_en", VISUAL_SCHEMA.name: "reasoning"}
_TEXT_AS_LOADED = (
    "load the column as text (a CSV: `load_args: {dtype: str, keep_default_na: false}`)"
)
# The most characters a cell of each column may hold, checked before anything else reads it.
# Generous for real data: the longest question of GSM8K has 985 characters, of MGSM 693, of
# TabMWP 514, of MATH-Vision 524 (their answers at most 9). An answer's bound is the reasoning
# reward's own cap (a longer gold answer is rejected unread: its row could never be rewarded);
# ``choices``' bound holds for each option. Columns not named here (the ranking sources'
# titles, queries, ...) take DEFAULT_MAX_TEXT_CHARS.
MAX_TEXT_CHARS = {
    "id": 200,
    "language": 35,
    "image_path": 4096,
    "question": 20_000,
    "question_en": 20_000,
    "reasoning_en": 50_000,
    "reasoning": 50_000,
    "answer": MAX_ANSWER_CHARS,
    "choices": MAX_ANSWER_CHARS,
    "prompt": 20_000,  # each message's content, for chat prompts
    "completion": 50_000,
}
DEFAULT_MAX_TEXT_CHARS = 20_000
# C0 controls but tab, newline and carriage return; DEL; C1 controls (mojibake, never text).
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Qwen's chat template and vision tokens (<|im_start|>, <|im_end|>, <|endoftext|>,
# <|vision_start|>, <|image_pad|>, ...) and other families' (<|eot_id|>) share this form.
_CHAT_TOKEN = re.compile(r"<\|\w+\|>")
_DIGITS_ONLY = re.compile(r"[-0-9.,/]+")


def math_text_problems(data: Any, dataset: str) -> pd.DataFrame:
    """``data`` (a frame or Hugging Face ``Dataset``) as math-text problems: the columns of
    ``MATH_TEXT_SCHEMA`` then ``reasoning_en`` ("" where the source has none), all str.

    Raises:
        TaskSourceError: a column is missing, a cell is not text or is hostile (see the module
            docstring), ``question_en`` holds translation tags, an ``answer`` is no finite
            number, or ``(id, language)`` repeats.
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
    values = [_answer_value(text, dataset, row) for row, text in enumerate(out["answer"])]
    _require_unique(out, MATH_TEXT_SCHEMA, dataset)
    _warn_on_differing_answers(out["id"].tolist(), values, dataset)
    return out.astype("str")


def visual_problems(data: Any, dataset: str) -> pd.DataFrame:
    """``data`` (a frame or Hugging Face ``Dataset``) as visual problems: the columns of
    ``VISUAL_SCHEMA`` (``choices`` as lists of str) then ``reasoning`` ("" where absent).
    Every ``image_path`` must be a file Pillow can read (relative paths are taken from the
    working directory, the project root under ``kedro run``).

    Raises:
        TaskSourceError: a column is missing, a cell is not text or is hostile (see the module
            docstring), ``choices`` is not a list of strings, an image is missing, cannot be
            decoded or is over Pillow's pixel bound, or an ``id`` repeats.
    """
    frame = checked_frame(data, dataset, VISUAL_SCHEMA, REASONING_COLUMNS[VISUAL_SCHEMA.name])
    text = [name for name in VISUAL_SCHEMA.names if name != "choices"]
    out = pd.DataFrame({name: _text_column(frame, name, dataset) for name in text}).astype("str")
    out["choices"] = [
        _choices(value, dataset, row) for row, value in enumerate(frame["choices"].tolist())
    ]
    out["reasoning"] = pd.Series(_optional_text_column(frame, "reasoning", dataset), dtype="str")
    for row, path in _cells(out["image_path"].tolist(), dataset, "image_path"):
        _check_image(Path(path), dataset, row)
    _require_unique(out, VISUAL_SCHEMA, dataset)
    return out[[*VISUAL_SCHEMA.names, "reasoning"]]


# Keyword arguments TRL's reward call passes itself: a column by one of these names would be
# shadowed (``rewards.plugins.TRL_ARGUMENTS``).
RESERVED_PROMPT_COLUMNS = ("prompts", "completions", "completion_ids", "trainer_state")
CHAT_ROLES = ("system", "user", "assistant")


def prompt_rows(data: Any, dataset: str) -> pd.DataFrame:
    """``data`` (a frame or Hugging Face ``Dataset``) as a generic prompt set
    (``PROMPT_SCHEMA``, ``creditflow.tasks.prompts``): ``id`` as text, ``prompt`` as text or
    a list of ``{"role", "content"}`` dicts, the optional ``completion`` as text, then every
    other column as loaded, its cells as plain Python values (a Parquet list cell, a numpy
    array, becomes a list; a missing value None) so the rewards that read them get what the
    file says.

    Raises:
        TaskSourceError: ``id`` or ``prompt`` is missing, an ``id`` is blank or repeats, a
            prompt is neither text nor chat messages (a role outside ``CHAT_ROLES``, a
            message without ``content``), text and chat prompts are mixed, a prompt or
            completion is blank or hostile (module docstring), or a column is named like one
            of TRL's own reward arguments.
    """
    frame = checked_frame(data, dataset, PROMPT_SCHEMA, ["completion", "any other column"])
    reserved = [str(c) for c in frame.columns if c in RESERVED_PROMPT_COLUMNS]
    if reserved:
        raise TaskSourceError(
            dataset,
            f"column(s) {reserved} are named like the arguments a TRL-style reward gets from "
            "the trainer itself",
            "rename them (the rewards get every other column by its name)",
            column=reserved[0],
        )
    out = pd.DataFrame({"id": _text_column(frame, "id", dataset)})
    out["prompt"] = [_prompt(value, dataset, row) for row, value in enumerate(frame["prompt"])]
    # A TRL dataset is conversational or not as a whole (its rewards get completions as
    # messages or as text accordingly), and so is a batch here.
    kinds = [isinstance(p, str) for p in out["prompt"]]
    if len(set(kinds)) > 1:
        first = kinds.index(not kinds[0])
        raise TaskSourceError(
            dataset,
            f"row 0's prompt is {'text' if kinds[0] else 'chat messages'}, this one "
            f"{'text' if kinds[first] else 'chat messages'}",
            "write every prompt one way: all text, or all chat messages (a text prompt is "
            '[{"role": "user", "content": "..."}])',
            first,
            "prompt",
        )
    if "completion" in frame.columns:
        out["completion"] = _text_column(frame, "completion", dataset)
    for column in frame.columns:
        if column not in out.columns:
            values = [_plain(value) for value in frame[column].tolist()]
            out[str(column)] = pd.Series(values, dtype=object)  # keeps None as None
    _require_unique(out, PROMPT_SCHEMA, dataset)
    return out


def _prompt(value: Any, dataset: str, row: int) -> str | list[dict[str, str]]:
    """A text prompt, checked; or chat messages as plain dicts, each content checked."""
    if isinstance(value, str):
        return _text(value, dataset, row, "prompt")
    messages = value.tolist() if isinstance(value, np.ndarray) else value
    fix = (
        'write the prompt as text, or as a list of messages such as [{"role": "user", '
        '"content": "..."}] (JSON lines or Parquet; a CSV cell is always text)'
    )
    if _is_missing(value):
        raise TaskSourceError(dataset, "missing value", fix, row, "prompt")
    if not isinstance(messages, list) or not messages:
        raise TaskSourceError(
            dataset, f"{value!r} is neither text nor a list of chat messages", fix, row, "prompt"
        )
    out = []
    for index, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or set(message) - {"role", "content"}
            or ("role" not in message or "content" not in message)
        ):
            raise TaskSourceError(
                dataset,
                f"message {index} is {message!r}, not {{'role': ..., 'content': ...}}",
                fix,
                row,
                "prompt",
            )
        if message["role"] not in CHAT_ROLES:
            raise TaskSourceError(
                dataset,
                f"message {index} has the role {message['role']!r}",
                f"use one of {list(CHAT_ROLES)}",
                row,
                "prompt",
            )
        content = _text(message["content"], dataset, row, "prompt")
        out.append({"role": str(message["role"]), "content": content})
    return out


def _plain(value: Any) -> Any:
    """A cell as plain Python: numpy arrays as lists, numpy scalars as their item, nested; a
    missing value (NaN, ``pd.NA``: a JSON null in a numeric column) as None, as TRL's
    datasets hand a null to a reward."""
    if _is_missing(value):
        return None
    if isinstance(value, np.ndarray):
        return [_plain(item) for item in value.tolist()]
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


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


# read_csv arguments that shape the columns or rows of the table rather than how the file's text
# is read: the header row is read without them, as plain text.
_TABLE_ARGS = (
    "header",
    "names",
    "index_col",
    "usecols",
    "dtype",
    "converters",
    "parse_dates",
    "date_format",
    "nrows",
    "skipfooter",
    "chunksize",
    "iterator",
    "keep_default_na",
    "na_values",
)


def check_csv_header(source: Any, dataset: str) -> None:
    """TaskSourceError naming the file and the column when ``source`` (the catalog's
    ``dataset``) is a ``pandas.CSVDataset`` whose header names a column more than once.

    pandas loads a repeat of ``answer`` as ``answer.1``, so the schema would read the first
    ``answer`` and drop the other without a word. The loaded frame cannot tell a repeat from a
    column really named ``answer.1``, so the header row itself is read: through a copy of the
    dataset, with its own path, version, storage options and text arguments (separator,
    encoding, compression, skipped rows), as plain text with no header.
    """
    if not isinstance(source, CSVDataset) or not source.exists():
        return  # an absent file is the load's own error to report
    load_args = source._load_args
    if load_args.get("header", "infer") not in ("infer", 0) or load_args.get("names") is not None:
        return  # the file has no header row of its own
    first_row = copy.copy(source)
    first_row._load_args = {
        **{key: value for key, value in load_args.items() if key not in _TABLE_ARGS},
        **{"header": None, "nrows": 1, "dtype": str, "keep_default_na": False},
    }
    header = first_row.load()
    repeated = repeated_names(header.iloc[0].tolist()) if len(header) else []
    if repeated:
        raise TaskSourceError(
            dataset,
            f"{source._get_load_path()}: the header names column(s) {repeated} more than once "
            f"(pandas would load the repeat as `{repeated[0]}.1`, and only the first would be "
            "read)",
            "rename or remove the repeated column(s) in the file's header",
            column=repeated[0],
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


# A source with at least this many rows shows a progress bar per checked column: a million
# rows take minutes, and a silent minute looks like a hang.
PROGRESS_ROWS = 100_000


def _cells(values: list[Any], dataset: str, column: str) -> Any:
    """``enumerate(values)``, with a progress bar for a large source."""
    return enumerate(
        tqdm(values, desc=f"{dataset}.{column}", disable=len(values) < PROGRESS_ROWS, leave=False)
    )


def _text_column(frame: pd.DataFrame, column: str, dataset: str) -> list[str]:
    values = frame[column].tolist()
    # A blank CSV cell turns its whole column into floats: name the blank, not the first float.
    for row, value in enumerate(values):
        if _is_missing(value):
            raise TaskSourceError(
                dataset, "missing value", f"fill in the {column} or drop the row", row, column
            )
    return [_text(value, dataset, row, column) for row, value in _cells(values, dataset, column)]


def _optional_text_column(frame: pd.DataFrame, column: str, dataset: str) -> list[str]:
    if column not in frame.columns:
        return [""] * len(frame)
    return [
        "" if _is_missing(value) else _text(value, dataset, row, column, allow_empty=True)
        for row, value in enumerate(frame[column].tolist())
    ]


def _text(value: Any, dataset: str, row: int, column: str, allow_empty: bool = False) -> str:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_):
        return _checked_text(str(int(value)), dataset, row, column)
    if isinstance(value, str):
        _checked_text(value, dataset, row, column)
        if not value.strip() and not allow_empty:
            raise TaskSourceError(
                dataset, "empty text", f"fill in the {column} or drop the row", row, column
            )
        return value
    raise TaskSourceError(
        dataset, f"{value!r} is a {type(value).__name__}, not text", _TEXT_AS_LOADED, row, column
    )


def _checked_text(text: str, dataset: str, row: int, column: str) -> str:
    """``text``, unless it is hostile (the module docstring): over its column's bound, or
    holding a control character or a chat control token."""
    limit = MAX_TEXT_CHARS.get(column, DEFAULT_MAX_TEXT_CHARS)
    if len(text) > limit:  # first: the checks below scan the text
        raise TaskSourceError(
            dataset,
            f"{len(text):,} characters, over the bound of {limit:,} for `{column}` "
            "(creditflow.ingest.source_rows.MAX_TEXT_CHARS)",
            "shorten it or drop the row (real problems run under 1,000 characters; a cell "
            "this long is usually a whole file or column pasted into one cell)",
            row,
            column,
        )
    if found := _CONTROL.search(text):
        raise TaskSourceError(
            dataset,
            f"holds the control character U+{ord(found.group()):04X} at character "
            f"{found.start()} ({text[max(found.start() - 20, 0) : found.start()]!r} before it)",
            "delete it: text may hold tab, newline and carriage return, no other control "
            "character (NUL bytes throughout mean a UTF-16 file: save it as UTF-8)",
            row,
            column,
        )
    if found := _CHAT_TOKEN.search(text):
        raise TaskSourceError(
            dataset,
            f"holds the chat control token {found.group()!r} at character {found.start()}",
            "delete it: the tokenizer reads it as the real control token, so the row could "
            "end its user turn and write a turn of its own",
            row,
            column,
        )
    return text


def _answer_value(text: str, dataset: str, row: int) -> Fraction:
    """A math-text answer's value: it must be a plain finite number (integer, decimal or
    fraction) once the reasoning reward has normalised it (``gold_answer``: thousands
    separators dropped, outer spaces stripped). ``canonical_number``'s grammar is a strict
    subset of what the reward's parser (math_verify) reads as that number; math_verify itself
    is no gate: it reads ``NaN`` as the product N*a*N, ``=1+1`` as 1 and ``5 apples`` as 5."""
    gold = gold_answer(text)
    try:
        number = canonical_number(gold)
    except ValueError as error:
        # The grammar's own reason helps with digits ('1,5': a decimal comma; '1/0'), not
        # with words or formulas.
        why = f" ({error})" if _DIGITS_ONLY.fullmatch(gold) else ""
        raise TaskSourceError(
            dataset,
            f"{text!r} is not a finite number{why}",
            "write the final answer as a plain number, e.g. 12, -3.5 or 48/103 (thousands "
            "commas are fine); NaN, inf, formulas and words are no answers",
            row,
            "answer",
        ) from error
    # No screen_answer here: a plain number within MAX_TEXT_CHARS["answer"] (the reward's
    # length cap) has neither nesting nor its 10,000 digits.
    return Fraction(number)


def _warn_on_differing_answers(ids: list[str], values: list[Fraction], dataset: str) -> None:
    """Log the problem ids whose rows (one per language) give different answers: allowed, each
    row is scored against its own, but usually a row pasted into the wrong problem."""
    answers: dict[str, set[Fraction]] = {}
    for id_, value in zip(ids, values, strict=True):
        answers.setdefault(id_, set()).add(value)
    differing = [id_ for id_, found in answers.items() if len(found) > 1]
    if differing:
        shown = "; ".join(
            f"`{id_}`: {sorted(str(v) for v in answers[id_])}" for id_ in differing[:10]
        )
        logger.warning(
            "task source `%s`: %d problem id(s) have different answers in different languages "
            "(each row is scored against its own answer; check the rows are not pasted into the "
            "wrong problem): %s%s",
            dataset,
            len(differing),
            shown,
            "; ..." if len(differing) > 10 else "",
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
            return [_checked_text(item, dataset, row, "choices") for item in items]
    raise TaskSourceError(
        dataset,
        f"{value!r} is not a list of strings",
        'write the options as a list (in a CSV cell, a JSON list such as ["3", "4"]); '
        "leave it blank for a free-form answer",
        row,
        "choices",
    )


def _check_image(path: Path, dataset: str, row: int) -> None:
    """The file exists and Pillow decodes it (``image_problem``: every pixel, at most Pillow's
    pixel bound), so a broken, truncated or decompression-bomb image fails on load, naming its
    row, and not at evaluation after training."""
    fix = "correct the path (relative paths are taken from the project root) or drop the row"
    if not path.is_file():
        problem = f"no image file at {path} (resolved to {path.resolve()})"
        raise TaskSourceError(dataset, problem, fix, row, "image_path")
    if problem := image_problem(path):
        raise TaskSourceError(
            dataset,
            f"{path} is not a readable image ({problem})",
            "re-export the image (one over Pillow's pixel bound: scale it down) or drop the row",
            row,
            "image_path",
        )


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
