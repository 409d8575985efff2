"""The item-annotation schema y of docs/methods/experience.md, step 1 and the tolerant parser of annotator output.

An annotation is one flat JSON object::

    {
        "sharpness": 4,
        "exposure": 3,
        "noise": 5,
        "title_informativeness": 2,
        "relevance": 4,
        "overall": 3.6,
        "analysis": "The cover is sharp ...",
    }

Each dimension is an integer score from 1 (worst) to 5 (best experience; a ``noise`` of 5 means
a clean image), ``overall`` a number in [1, 5] and ``analysis`` the non-empty reasoning text.
The same JSON is what an annotator writes, what the ExpModel learns to generate in SFT
(docs/methods/experience.md, step 2), and what :func:`parse_annotation` reads back.

This module also fixes the frame every annotator returns (``ANNOTATION_COLUMNS``) and the item
fields an annotator may read (``ITEM_COLUMNS``).

An item may come with a search query (a ``QUERY_COLUMN`` column, one row per query and item):
the annotator then judges the item *for that query* (relevance to the query, not only to the
item's own category) and its rows carry the query too, so the experience model can learn the
query-aware score s_{q,v} of docs/methods/experience.md, step 3 (``expmodel_sft.score_mode: query``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pandas as pd

from creditflow.errors import AnnotationParseError

DIMENSIONS = ("sharpness", "exposure", "noise", "title_informativeness", "relevance")
SCORE_MIN, SCORE_MAX = 1, 5
STATUSES = ("ok", "failed")

# An annotator sees only these fields; the hidden true_* columns of the synthetic catalogue
# (creditflow.chain.world.catalogue) never reach it.
ITEM_COLUMNS = ("item_id", "category", "title", "image_png")
# The optional search query an item is judged for; annotations of (query, item) pairs carry it
# right after ``item_id``.
QUERY_COLUMN = "query_text"
ANNOTATION_COLUMNS = (
    "item_id",
    "status",
    "overall",
    *DIMENSIONS,
    "analysis",
    "raw_text",
    "attempts",
    "error",
)

DIMENSION_MEANINGS: Mapping[str, str] = MappingProxyType(
    {
        "sharpness": "is the cover in focus (5) or blurry (1)",
        "exposure": "is the cover well exposed (5) or too dark / washed out (1)",
        "noise": "is the cover clean (5) or grainy with pixel noise (1)",
        "title_informativeness": "does the title say concretely what the video shows (5) "
        "or is it vague / click-bait (1)",
        "relevance": "does the item stay on its topic (5) or mix in unrelated content (1)",
    }
)
# Put before a served annotator's prompt when an item is judged for a query.
QUERY_PROMPT = (
    "Search query: {query}\n"
    "Judge relevance by how well the item answers this query (an item on another topic is "
    "not relevant, however good it is).\n"
)
SCHEMA_DESCRIPTION = (
    "Answer with one JSON object and nothing else, with these keys:\n"
    + "".join(f'- "{d}": integer 1-5, {DIMENSION_MEANINGS[d]}\n' for d in DIMENSIONS)
    + '- "overall": number 1-5, the overall viewing experience\n'
    + '- "analysis": a few sentences explaining the scores\n'
)


def query_prompt(prompt: str, query: str | None) -> str:
    """``prompt`` for an item judged for ``query`` (``QUERY_PROMPT`` first); as is for None.

    >>> query_prompt("Rate it.", "pasta recipe").splitlines()[0]
    'Search query: pasta recipe'
    """
    return prompt if query is None else QUERY_PROMPT.format(query=query) + prompt


def item_query(record: Mapping[str, Any]) -> str | None:
    """The query a ``visible_items`` record is judged for (None: the item alone)."""
    query = record.get(QUERY_COLUMN)
    return None if query is None or (isinstance(query, float) and math.isnan(query)) else query


def annotation_json_schema() -> dict[str, Any]:
    """The annotation as a JSON Schema, for structured output (``response_format`` of type
    ``json_schema``, served by OpenAI, vLLM and SGLang): the keys in ``SCHEMA_DESCRIPTION``'s
    order, all required, no others. Scores are an ``enum`` of 1-5, which every grammar backend
    enforces; ``overall``'s range may be ignored by a server, :func:`parse_annotation` still
    checks it.

    >>> annotation_json_schema()["required"][-2:]
    ['overall', 'analysis']
    """
    score = list(range(SCORE_MIN, SCORE_MAX + 1))
    properties: dict[str, Any] = {
        d: {"type": "integer", "enum": score, "description": DIMENSION_MEANINGS[d]}
        for d in DIMENSIONS
    }
    properties["overall"] = {
        "type": "number",
        "minimum": SCORE_MIN,
        "maximum": SCORE_MAX,
        "description": "the overall viewing experience",
    }
    properties["analysis"] = {"type": "string", "description": "a few sentences on the scores"}
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


# Possessive quantifiers: with backtracking, an unclosed fence followed by a long run of
# letters or spaces would be rescanned once per character of the run.
_FENCE = re.compile(r"```[A-Za-z0-9_-]*+\s*+(.*?)```", re.DOTALL)
# The parser reads at most this many characters of a reply: an annotation is under 4 KB, so
# 64 KB leaves room for prose around it, and a reply of megabytes of junk costs no more than
# 64 KB of it.
MAX_PARSE_CHARS = 64 * 1024
# Each candidate object (a ``{`` opening a key) is decoded from a window of the text starting
# there, doubled while the window's end is what stopped the decoder: a failure costs what the
# decoder read, not the distance from the start of the text (``json.JSONDecodeError`` counts
# the lines before its position, so ``raw_decode(text, start)`` costs O(start) per failure,
# O(n^2) over a reply of many ``{``).
_FIRST_WINDOW = 512
# A window cut through a token (``-Infinity``, a ``\uXXXX`` escape, a number) fails within
# this many characters of its end; such a failure asks for a wider window.
_CUT_MARGIN = 16
# Failed candidates may together read at most this many times the text before the parser gives
# up, so no text costs more than linear time (deeply nested junk would make each of its
# candidates read far; a reply holding one annotation reads about its own length). A failed
# decode counts as reading at least _MIN_COST characters: raising its error costs about that.
_READ_FACTOR = 8
_MIN_COST = 64
_CANDIDATE = re.compile(r'\{[ \t\n\r]*"')
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Annotation:
    """One item's scores (integers 1-5 per ``DIMENSIONS``), overall score and analysis text."""

    scores: Mapping[str, int]
    overall: float
    analysis: str

    def __post_init__(self) -> None:
        _validate_fields({**self.scores, "overall": self.overall, "analysis": self.analysis})
        object.__setattr__(
            self, "scores", MappingProxyType({d: self.scores[d] for d in DIMENSIONS})
        )

    def to_dict(self) -> dict[str, Any]:
        """Flat dict in schema order: dimensions, ``overall``, ``analysis``."""
        return {**self.scores, "overall": self.overall, "analysis": self.analysis}

    def to_json(self) -> str:
        """The canonical JSON text of the annotation; ``parse_annotation`` reads it back."""
        return json.dumps(self.to_dict(), ensure_ascii=False)


def parse_annotation(text: str, max_chars: int = MAX_PARSE_CHARS) -> Annotation:
    """Extract and validate the annotation JSON object from model output.

    Tolerates leading or trailing prose and Markdown code fences: fenced blocks are tried
    first, then the whole text; in each, the first ``{`` from which a JSON object decodes is
    taken. Keys outside the schema are ignored. Only the first ``max_chars`` characters are
    read (``MAX_PARSE_CHARS``), and the time taken grows linearly with them.

    Raises:
        AnnotationParseError: no JSON object in the first ``max_chars`` characters, a key
            missing, a score not an integer in [1, 5], ``overall`` not a number in [1, 5] or
            ``analysis`` empty.

    >>> parse_annotation(
    ...     'Sure! {"sharpness": 4, "exposure": 3, "noise": 5, "title_informativeness": 2, '
    ...     '"relevance": 4, "overall": 3.5, "analysis": "Sharp but dim."}'
    ... ).overall
    3.5
    """
    if not isinstance(text, str):
        raise AnnotationParseError(f"expected the model output as str, got {type(text).__name__}")
    payload = _first_json_object(text, max_chars)
    _validate_fields(payload)
    return Annotation(
        scores={d: int(payload[d]) for d in DIMENSIONS},
        overall=float(payload["overall"]),
        analysis=payload["analysis"].strip(),
    )


def _first_json_object(text: str, max_chars: int) -> dict[str, Any]:
    read = text[:max_chars]
    budget, spent = _READ_FACTOR * max(len(read), _FIRST_WINDOW), 0
    preview = text.strip().replace("\n", " ")[:120]
    cut = f" (only its first {max_chars} of {len(text)} characters are read)"
    where = f"the model output: {preview!r}" + (cut if len(text) > max_chars else "")
    for block in [*_FENCE.findall(read), read]:
        for start in (m.start() for m in _CANDIDATE.finditer(block)):
            value, cost = _decode_at(block, start)
            if isinstance(value, dict):
                return value
            spent += max(cost, _MIN_COST)
            if spent > budget:
                raise AnnotationParseError(
                    f"gave up after reading {spent} characters of failed JSON candidates in {where}"
                )
    raise AnnotationParseError(f"no JSON object found in {where}")


def _decode_at(block: str, start: int) -> tuple[Any, int]:
    """The JSON value that starts at ``block[start]`` (None when none does) and about how many
    characters the decoder read to find out."""
    width = _FIRST_WINDOW
    while True:
        window = block[start : start + width]
        try:
            value, end = _DECODER.raw_decode(window)
        except RecursionError:  # nested deeper than the interpreter allows: no annotation
            return None, len(window)
        except ValueError as exc:  # JSONDecodeError, or an integer of too many digits
            if not isinstance(exc, json.JSONDecodeError):
                return None, len(window)
            unterminated = exc.msg.startswith("Unterminated")
            if start + width < len(block) and (
                unterminated or exc.pos >= len(window) - _CUT_MARGIN
            ):
                width *= 2
                continue
            return None, len(window) if unterminated else exc.pos + 1
        return value, end


def _validate_fields(payload: Mapping[str, Any]) -> None:
    missing = [k for k in (*DIMENSIONS, "overall", "analysis") if k not in payload]
    if missing:
        raise AnnotationParseError(
            f"annotation is missing keys {missing}; expected {[*DIMENSIONS, 'overall', 'analysis']}"
        )
    for dim in DIMENSIONS:
        value = payload[dim]
        # JSON has one number type: 4.0 is the integer 4, 4.5 is not a score.
        is_integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not is_integral or not SCORE_MIN <= value <= SCORE_MAX:
            raise AnnotationParseError(
                f"{dim} must be an integer in [{SCORE_MIN}, {SCORE_MAX}], got {value!r}"
            )
    overall = payload["overall"]
    if (
        isinstance(overall, bool)
        or not isinstance(overall, int | float)
        or not math.isfinite(overall)
        or not SCORE_MIN <= overall <= SCORE_MAX
    ):
        raise AnnotationParseError(
            f"overall must be a number in [{SCORE_MIN}, {SCORE_MAX}], got {overall!r}"
        )
    analysis = payload["analysis"]
    if not isinstance(analysis, str) or not analysis.strip():
        raise AnnotationParseError(f"analysis must be a non-empty string, got {analysis!r}")


# --- the frame every annotator returns ------------------------------------------------------------


def visible_items(items: pd.DataFrame) -> pd.DataFrame:
    """Keep only ``ITEM_COLUMNS`` and, when there, ``QUERY_COLUMN`` (a copy), so no annotator
    can read hidden columns."""
    missing = [c for c in ITEM_COLUMNS if c not in items.columns]
    if missing:
        raise ValueError(
            f"items is missing columns {missing}; an annotator needs {list(ITEM_COLUMNS)}"
        )
    kept = [*ITEM_COLUMNS, QUERY_COLUMN] if QUERY_COLUMN in items.columns else list(ITEM_COLUMNS)
    return items.loc[:, kept].reset_index(drop=True).copy()


def ok_row(
    item_id: Any, annotation: Annotation, raw_text: str, attempts: int, query: str | None = None
) -> dict[str, Any]:
    """Row of an annotated item (judged for ``query`` when given)."""
    return {
        **_query_part(query),
        "item_id": item_id,
        "status": "ok",
        "overall": annotation.overall,
        **annotation.scores,
        "analysis": annotation.analysis,
        "raw_text": raw_text,
        "attempts": attempts,
        "error": None,
    }


def failed_row(
    item_id: Any, raw_text: str | None, attempts: int, error: str, query: str | None = None
) -> dict[str, Any]:
    """Row of an item no attempt could annotate: no scores are invented, they stay missing."""
    return {
        **_query_part(query),
        "item_id": item_id,
        "status": "failed",
        "overall": math.nan,
        **dict.fromkeys(DIMENSIONS, None),
        "analysis": None,
        "raw_text": raw_text,
        "attempts": attempts,
        "error": error,
    }


def _query_part(query: str | None) -> dict[str, str]:
    return {} if query is None else {QUERY_COLUMN: query}


def annotations_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> frame with ``ANNOTATION_COLUMNS`` (``QUERY_COLUMN`` after ``item_id`` when the
    rows were judged for queries); scores nullable ``Int64``, ``overall`` float."""
    columns = list(ANNOTATION_COLUMNS)
    if any(QUERY_COLUMN in row for row in rows):
        columns.insert(1, QUERY_COLUMN)
    frame = pd.DataFrame(rows, columns=columns)
    frame["overall"] = frame["overall"].astype("float64")
    for dim in DIMENSIONS:
        frame[dim] = frame[dim].astype("Int64")
    frame["attempts"] = frame["attempts"].astype("int64")
    return frame
