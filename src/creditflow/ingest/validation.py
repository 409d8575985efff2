"""Validation helpers shared by the loaders: located errors, numbers, fields, images and raw
readers.

Every error names the file and, where there is one, the 1-based line of the bad record in
that file, says what is wrong and how to fix it.
"""

from __future__ import annotations

import csv
import io
import json
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from creditflow.errors import DataValidationError

# A plain number after commas are stripped: integer, decimal or fraction, as the sources
# write them ('18', '-3', '3.30', '48/103'); TabMWP labels its fractions decimal_number.
# ASCII digits only: Python's \d also takes '٣' or '３', which the reasoning reward's
# parser (math_verify) does not read as numbers.
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+|[0-9]+/[0-9]+)")
# Commas are only accepted as thousands separators: in multilingual data '1,5' may be a
# decimal comma, and stripping it would silently turn 1.5 into 15.
_GROUPED = re.compile(r"-?[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?")
_WHITESPACE = re.compile(r"\s*")


@dataclass(frozen=True)
class SourceLine:
    """Where a record comes from: a file and the 1-based line it starts on (None: whole file)."""

    path: Path
    line: int | None = None

    def error(self, problem: str, fix: str) -> DataValidationError:
        return DataValidationError(self.path, self.line, problem, fix)


def canonical_number(text: str) -> str:
    """Strip surrounding whitespace and thousands commas from a numeric answer.

    >>> canonical_number("2,125"), canonical_number(" 3.30"), canonical_number("48/103")
    ('2125', '3.30', '48/103')

    Raises:
        ValueError: ``text`` is not a number, or has commas that are not thousands separators.
    """
    text = text.strip()
    if "," in text:
        if not _GROUPED.fullmatch(text):
            raise ValueError(f"{text!r} has commas that are not thousands separators")
        text = text.replace(",", "")
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"{text!r} is not a number (integer, decimal or fraction)")
    if "/" in text and not int(text.partition("/")[2]):
        raise ValueError(f"{text!r} divides by zero")
    return text


def number_field(value: Any, field: str, at: SourceLine) -> str:
    """``canonical_number`` of a record field, with errors located at ``at``."""
    text = text_field(value, field, at)
    try:
        return canonical_number(text)
    except ValueError as err:
        raise at.error(
            f"field {field!r}: {err}", "write the answer as a plain number such as 1234 or 1,234.5"
        ) from err


def text_field(value: Any, field: str, at: SourceLine) -> str:
    """A record field that must be a non-empty string (surrounding whitespace is kept)."""
    if not isinstance(value, str):
        raise at.error(f"field {field!r} is {type(value).__name__}, not a string", "quote it")
    if not value.strip():
        raise at.error(f"field {field!r} is empty", f"fill in the {field} or delete the record")
    return value


def require_fields(record: Mapping[str, Any], fields: Iterable[str], at: SourceLine) -> None:
    """Raise when ``record`` lacks any of ``fields``."""
    missing = [field for field in fields if field not in record]
    if missing:
        raise at.error(
            f"missing field(s) {missing}; the record has {sorted(record)}",
            "add the missing fields (see the folder's SOURCE.md)",
        )


def require_unique(ids: Iterable[tuple[str, SourceLine]]) -> None:
    """Raise on the second occurrence of an id, naming both lines."""
    first_seen: dict[str, SourceLine] = {}
    for id_, at in ids:
        if id_ in first_seen:
            raise at.error(
                f"duplicate id {id_!r} (first on line {first_seen[id_].line})",
                "remove the duplicate record or give it its own id",
            )
        first_seen[id_] = at


def image_problem(path: Path) -> str | None:
    """Why Pillow cannot decode the image file at ``path``, or None when it can.

    ``verify`` checks the file's structure (a PNG's checksums) but decodes nothing, and for a
    JPEG it checks nothing at all: a truncated JPEG passed it and failed only when training
    first read its pixels (``OSError: image file is truncated``, naming no file). So the pixels
    are decoded too. An image over Pillow's pixel bound (``Image.MAX_IMAGE_PIXELS``, 89 M) is
    refused before decoding, from its header: a decompression bomb (a PNG of a few KB that
    decodes to gigabytes) is Pillow's error past twice the bound and only a warning below it.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.verify()
            with Image.open(path) as image:
                image.load()
    # PIL's errors for a bad file; the bomb error and (made an error above) warning
    except (
        OSError,
        SyntaxError,
        ValueError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    ) as error:
        return f"{type(error).__name__}: {error}"
    return None


def require_file(path: Path) -> Path:
    """Return ``path`` if it is a file, else raise saying where it was looked for."""
    if not path.is_file():
        raise DataValidationError(
            path,
            None,
            f"file not found (resolved to {path.resolve()})",
            "check data_ingest.raw_data_dir (relative paths are taken from the project root) and "
            "fetch the data sets into it with `creditflow fetch-data` (docs/data.md)",
        )
    return path


def read_text(path: Path) -> str:
    """The whole of a UTF-8 text file. Invalid UTF-8 is an error naming the line and the byte
    (Python's own error names neither the file nor the line, only a byte offset).

    Raises:
        DataValidationError: the file is missing or is not valid UTF-8.
    """
    data = require_file(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        raise SourceLine(path, data.count(b"\n", 0, err.start) + 1).error(
            f"invalid UTF-8: byte {data[err.start]:#04x} at byte {err.start - line_start + 1} "
            f"of the line ({err.reason})",
            "save the file as UTF-8 (a spreadsheet's 'CSV UTF-8' export; a Windows-1252 or "
            "Latin-1 file converts with `iconv -f cp1252 -t utf-8`)",
        ) from err


def read_tsv(path: Path) -> list[tuple[SourceLine, list[str]]]:
    """Rows of a header-less, quote-free TSV file with their line numbers."""
    f = io.StringIO(read_text(path), newline="")
    # QUOTE_NONE: MGSM questions contain bare double quotes (see mgsm/SOURCE.md).
    reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    return [(SourceLine(path, reader.line_num), row) for row in reader]


def repeated_names(header: Sequence[str]) -> list[str]:
    """The names ``header`` holds more than once, in the order they first repeat.

    >>> repeated_names(["id", "answer", "question", "answer", "id"])
    ['answer', 'id']
    """
    seen: set[str] = set()
    repeated: list[str] = []
    for name in header:
        if name in seen and name not in repeated:
            repeated.append(name)
        seen.add(name)
    return repeated


def read_csv(path: Path, required: Sequence[str]) -> tuple[list[int], dict[str, list[str]]]:
    """A headed RFC-4180 CSV file as string columns, with each row's line number.

    Returns:
        (line numbers, {column: values}) for the ``required`` columns, one entry per row.
    """
    # csv rather than pandas.read_csv: pandas silently turns a row with one field too
    # many into an index column, and skipping blank lines would shift line numbers.
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    header = next(reader, [])
    # Which of two same-named columns holds the data is anyone's guess: refuse, never pick one.
    if repeated := repeated_names(header):
        raise SourceLine(path, 1).error(
            f"the header names column(s) {repeated} more than once",
            "rename or remove the repeated column(s): only one column of a name can be read",
        )
    missing = [name for name in required if name not in header]
    if missing:
        raise SourceLine(path, 1).error(
            f"header {header} lacks column(s) {missing}",
            f"restore the header line (it needs {list(required)})",
        )
    lines, rows = [], []
    for fields in reader:
        if len(fields) != len(header):
            raise SourceLine(path, reader.line_num).error(
                f"{len(fields)} fields, but the header has {len(header)}",
                "quote fields that contain commas and fill in empty ones",
            )
        lines.append(reader.line_num)
        rows.append(fields)
    positions = [header.index(name) for name in required]
    columns = {name: [row[i] for row in rows] for name, i in zip(required, positions, strict=True)}
    return lines, columns


def read_jsonl(path: Path) -> list[tuple[SourceLine, dict[str, Any]]]:
    """JSON-lines records (objects) with their line numbers; blank lines are errors."""
    records = []
    # newline=None: universal newlines, as open() reads text
    for number, text in enumerate(io.StringIO(read_text(path), newline=None), start=1):
        at = SourceLine(path, number)
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            raise at.error(f"invalid JSON ({err.msg})", "write one JSON object per line") from err
        if not isinstance(record, dict):
            raise at.error(f"a JSON {type(record).__name__}, not an object", "write an object")
        records.append((at, record))
    return records


def read_json_object(path: Path) -> list[tuple[SourceLine, str, Any]]:
    """The members of a top-level JSON object ``{key: value}``, each with its key's line.

    ``json.load`` gives no line numbers and silently keeps only the last of duplicate keys,
    so the top level is walked with ``raw_decode`` and duplicates are reported.
    """
    text = read_text(path)
    decoder = json.JSONDecoder()
    members: list[tuple[SourceLine, str, Any]] = []
    line, counted = 1, 0

    def at(pos: int) -> SourceLine:
        nonlocal line, counted
        line, counted = line + text.count("\n", counted, pos), pos
        return SourceLine(path, line)

    def expect(pos: int, chars: str) -> tuple[str, int]:
        pos = _WHITESPACE.match(text, pos).end()
        if pos >= len(text) or text[pos] not in chars:
            raise at(pos).error(f"expected one of {chars!r} here", "fix the JSON syntax")
        return text[pos], _WHITESPACE.match(text, pos + 1).end()

    _, pos = expect(0, "{")
    sep = ","
    if text.startswith("}", pos):  # an empty object
        sep, pos = "}", pos + 1
    while sep == ",":
        key_at = at(pos)
        try:
            key, pos = decoder.raw_decode(text, pos)
            _, pos = expect(pos, ":")
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise SourceLine(path, err.lineno).error(
                f"invalid JSON ({err.msg})", "fix the JSON syntax"
            ) from err
        if not isinstance(key, str):
            raise key_at.error(f"key {key!r} is not a string", "fix the JSON syntax")
        members.append((key_at, key, value))
        sep, pos = expect(pos, ",}")
    if text[pos:].strip():
        raise at(pos).error("text after the closing '}'", "remove it")
    require_unique((key, key_at) for key_at, key, _ in members)
    return members
