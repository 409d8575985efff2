"""A user's catalogue and impression logs as the experience chain's tables.

``annotation.source.items`` / ``annotation.source.impressions`` name catalog datasets in the
:data:`~creditflow.ingest.schemas.RANKING_ITEMS_SCHEMA` /
:data:`~creditflow.ingest.schemas.RANKING_IMPRESSIONS_SCHEMA` (Parquet, CSV, JSON lines ...;
docs/howto/own_data.md). :func:`ranking_items` turns the catalogue into ``catalogue_items`` and
:func:`ranking_sessions` the logs into the sessions of ``query_logs_{train,heldout}``, with the
columns the synthetic world writes (:mod:`creditflow.chain.world.catalogue`), so every later node
reads them unchanged:

- items get ``item_id`` 0..n-1 in file order (your id stays in ``source_item_id``), the cover
  as PNG bytes (``image_png``), ``popularity`` (1 where not given) and, only when the catalogue
  has ``true_quality``, the hidden ``true_quality`` and ``true_clickbait``;
- a session's candidates are its impressions in position order, so ``logged_order`` is
  ``0..L-1``; ``labels`` are ``C`` (clicked), ``E`` (exposed, not clicked), ``U`` (``exposed``
  0); ``query_id`` ranks the queries by their number of sessions (0 the most frequent, ties in
  order of first appearance) and ``query_frequency_band`` is
  :func:`~creditflow.chain.world.catalogue.frequency_bands` of those counts; the hidden
  ``relevance`` and ``true_quality`` lists are there only when the items have a true quality.

Every session must show ``list_length`` (``annotation.query_logs.list_length``, ``L``)
candidates at least: longer ones keep their first ``L`` positions, shorter ones are dropped;
both are counted in the log.

Every error names the dataset and, where there is one, the row (0-based, in load order; a
headed CSV's line is the row + 2) and the column, says what is wrong and how to fix it
(:class:`~creditflow.errors.TaskSourceError`). Cells: text columns take strings or
integers, 0/1 columns take 0, 1, booleans or the strings ``0``/``1``/``true``/``false``,
number columns take numbers or numeric strings; a blank optional cell takes the default.
"""

from __future__ import annotations

import io
import logging
import math
import numbers
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from creditflow.chain.world.catalogue import (
    LABEL_CLICKED,
    LABEL_EXPOSED,
    LABEL_UNEXPOSED,
    frequency_bands,
)
from creditflow.errors import TaskSourceError
from creditflow.ingest.schemas import (
    RANKING_IMPRESSIONS_OPTIONAL,
    RANKING_IMPRESSIONS_SCHEMA,
    RANKING_ITEMS_OPTIONAL,
    RANKING_ITEMS_SCHEMA,
)
from creditflow.ingest.source_rows import (
    _check_image,
    _is_missing,
    _text_column,
    checked_frame,
)

logger = logging.getLogger(__name__)

TRUTH_COLUMNS = ("true_quality", "true_clickbait")  # hidden item columns, with true_quality only
_FLAGS = {"0": 0, "1": 1, "false": 0, "true": 1}


def ranking_items(data: Any, dataset: str) -> pd.DataFrame:
    """``data`` (a frame or Hugging Face ``Dataset``) as ``catalogue_items`` (module docstring).

    Returns:
        Columns ``item_id`` (int64, 0..n-1), ``category``, ``title``, ``image_png`` (PNG bytes,
        RGB), ``popularity`` (float64 > 0), then ``true_quality`` and ``true_clickbait``
        (float64 in [0, 1]) when the catalogue has ``true_quality``, then ``source_item_id``
        and ``metadata`` (str).

    Raises:
        TaskSourceError: a column is missing, a cell is not of its type or out of range, an
            image is missing or unreadable, an ``item_id`` repeats, ``true_quality`` is blank
            on some rows only, or ``true_clickbait`` comes without ``true_quality``.
    """
    frame = checked_frame(
        data, dataset, RANKING_ITEMS_SCHEMA, [c.name for c in RANKING_ITEMS_OPTIONAL]
    )
    ids = _text_column(frame, "item_id", dataset)
    _require_unique_values(ids, dataset, "item_id", "give each item its own id")
    paths = _text_column(frame, "image_path", dataset)
    out = pd.DataFrame(
        {
            "item_id": np.arange(len(frame), dtype=np.int64),
            "category": _text_column(frame, "category", dataset),
            "title": _text_column(frame, "title", dataset),
            "image_png": [_png(Path(path), dataset, row) for row, path in enumerate(paths)],
            "popularity": _numbers(
                frame, "popularity", dataset, default=1.0, low=0.0, open_low=True
            ),
        }
    )
    if "true_quality" in frame.columns:
        out["true_quality"] = _numbers(frame, "true_quality", dataset, low=0.0, high=1.0)
        out["true_clickbait"] = _numbers(
            frame, "true_clickbait", dataset, default=0.0, low=0.0, high=1.0
        )
    elif "true_clickbait" in frame.columns:
        raise TaskSourceError(
            dataset,
            "has true_clickbait but no true_quality",
            "add true_quality (the simulated users need both) or drop true_clickbait",
            column="true_clickbait",
        )
    out["source_item_id"] = pd.Series(ids, dtype="str")
    out["metadata"] = pd.Series(
        ["" if _is_missing(v) else str(v) for v in _optional(frame, "metadata")], dtype="str"
    )
    for column in ("category", "title"):
        out[column] = out[column].astype("str")
    return out


def ranking_sessions(
    data: Any, items: pd.DataFrame, dataset: str, list_length: int
) -> pd.DataFrame:
    """``data`` (impression logs) as sessions over ``items`` (``ranking_items``' frame).

    Args:
        data: a frame or Hugging Face ``Dataset`` in the impressions schema.
        items: the catalogue the logs show, with ``item_id`` and ``source_item_id`` (and the
            hidden ``true_quality`` when known).
        dataset: the dataset's name, for the errors.
        list_length: ``L``: sessions keep their first ``L`` positions; shorter ones are dropped.

    Returns:
        One row per kept session, in order of first appearance: the columns of
        ``chain.world.catalogue.SESSION_COLUMNS`` (less ``relevance`` and ``true_quality`` when
        ``items`` has no ``true_quality``), then ``source_session_id``.

    Raises:
        TaskSourceError: a missing column or bad cell, an item not in the catalogue, a
            long view without a click, a click on an unexposed candidate, a session with two
            queries, a repeated position or item within a session, no session of ``L``
            impressions at all, or no exposed impression in the kept sessions.
    """
    frame = checked_frame(
        data, dataset, RANKING_IMPRESSIONS_SCHEMA, [c.name for c in RANKING_IMPRESSIONS_OPTIONAL]
    )
    sessions = _text_column(frame, "session_id", dataset)
    queries = _text_column(frame, "query", dataset)
    row_of_item = dict(zip(items["source_item_id"], items["item_id"], strict=True))
    item_ids = []
    for row, item in enumerate(_text_column(frame, "item_id", dataset)):
        if item not in row_of_item:
            raise TaskSourceError(
                dataset,
                f"item {item!r} is not in the catalogue",
                "add the item to the catalogue (annotation.source.items) or drop the row",
                row,
                "item_id",
            )
        item_ids.append(int(row_of_item[item]))
    positions = [_position(v, dataset, row) for row, v in enumerate(frame["position"].tolist())]
    clicked = _flags(frame, "clicked", dataset)
    long_viewed = _flags(frame, "long_viewed", dataset)
    exposed = _flags(frame, "exposed", dataset, default=1)
    relevance = _numbers(frame, "relevance", dataset, default=1.0, low=0.0, high=1.0)
    for row in range(len(frame)):
        if long_viewed[row] and not clicked[row]:
            raise TaskSourceError(
                dataset,
                "a long view without a click",
                "set clicked to 1 or long_viewed to 0",
                row,
                "long_viewed",
            )
        if clicked[row] and not exposed[row]:
            raise TaskSourceError(
                dataset,
                "a click on an unexposed candidate",
                "set exposed to 1 or clicked to 0",
                row,
                "clicked",
            )

    groups: dict[str, list[int]] = {}
    for row, session in enumerate(sessions):
        groups.setdefault(session, []).append(row)
    truth = items.set_index("item_id")["true_quality"] if "true_quality" in items.columns else None
    kept, short = [], 0
    for session, unordered in groups.items():
        rows = _session_rows(unordered, session, positions, queries, item_ids, dataset)
        if len(rows) < list_length:
            short += 1
            continue
        kept.append((session, rows[:list_length]))
    if not kept:
        lengths = sorted(Counter(len(rows) for rows in groups.values()).items())
        raise TaskSourceError(
            dataset,
            f"no session shows list_length = {list_length} candidates (sessions by length: "
            f"{dict(lengths)})",
            "lower annotation.query_logs.list_length to a length most sessions reach",
        )
    if not any(exposed[r] for _, rows in kept for r in rows):
        # The click model and page GRPO learn from what users saw; with nothing seen the run
        # would fail only at reranker_grpo, after annotation and both ExpModel stages.
        raise TaskSourceError(
            dataset,
            "no impression of the kept sessions is exposed: the click logs show nothing a user saw",
            "set exposed to 1 on the impressions users saw (or drop the column: every logged "
            "impression then counts as seen)",
            column="exposed",
        )
    cut = sum(len(groups[session]) > list_length for session, _ in kept)
    logger.info(
        "%s: %d sessions of %d impressions kept (%d cut to that length), %d shorter ones dropped",
        dataset,
        len(kept),
        list_length,
        cut,
        short,
    )

    counts = Counter(queries[rows[0]] for _, rows in kept)
    ranked = sorted(counts, key=lambda q: -counts[q])  # stable: ties in order of appearance
    query_id = {q: i for i, q in enumerate(ranked)}
    traffic = np.array([counts[q] for q in ranked], dtype=np.float64)
    bands = frequency_bands(traffic / traffic.sum())
    records = []
    for index, (session, rows) in enumerate(kept):
        query = queries[rows[0]]
        candidates = [item_ids[r] for r in rows]
        record = {
            "session_id": index,
            "query_id": query_id[query],
            "query_text": query,
            "query_frequency_band": bands[query_id[query]],
            "candidates": candidates,
            "logged_order": list(range(len(rows))),
            "labels": [_label(clicked[r], exposed[r]) for r in rows],
            "clicks": [int(clicked[r]) for r in rows],
            "long_views": [int(long_viewed[r]) for r in rows],
        }
        if truth is not None:
            record["relevance"] = [float(relevance[r]) for r in rows]
            record["true_quality"] = [
                float(relevance[r]) * float(truth.loc[i])
                for r, i in zip(rows, candidates, strict=True)
            ]
        record["source_session_id"] = session
        records.append(record)
    return pd.DataFrame(records)


# ------------------------------------------------------------------ cells and checks
def _optional(frame: pd.DataFrame, column: str) -> list[Any]:
    return frame[column].tolist() if column in frame.columns else [None] * len(frame)


def _blank(value: Any) -> bool:
    return _is_missing(value) or (isinstance(value, str) and not value.strip())


def _numbers(
    frame: pd.DataFrame,
    column: str,
    dataset: str,
    *,
    default: float | None = None,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
) -> list[float]:
    """A number column; blank cells take ``default`` (None: every cell is required)."""
    out = []
    for row, value in enumerate(_optional(frame, column)):
        if _blank(value):
            if default is None:
                raise TaskSourceError(
                    dataset,
                    "missing value",
                    f"fill in the {column} of every row, or drop the column",
                    row,
                    column,
                )
            out.append(default)
            continue
        number = _number(value, dataset, row, column)
        below = low is not None and (number <= low if open_low else number < low)
        if below or (high is not None and number > high):
            bounds = f"({low}, {high or 'inf'})" if open_low else f"[{low}, {high}]"
            raise TaskSourceError(
                dataset,
                f"{number} is outside {bounds}",
                f"give a {column} in {bounds}",
                row,
                column,
            )
        out.append(number)
    return out


def _number(value: Any, dataset: str, row: int, column: str) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        number = float(value)
    else:
        try:
            number = float(str(value).strip())
        except ValueError:
            number = math.nan
    if not math.isfinite(number):
        raise TaskSourceError(
            dataset,
            f"{value!r} is not a finite number",
            f"write the {column} as a number",
            row,
            column,
        )
    return number


def _flags(frame: pd.DataFrame, column: str, dataset: str, default: int | None = None) -> list[int]:
    out = []
    for row, value in enumerate(_optional(frame, column)):
        if _blank(value) and default is not None:
            out.append(default)
        elif isinstance(value, bool | np.bool_):
            out.append(int(value))
        elif isinstance(value, numbers.Real) and float(value) in (0.0, 1.0):
            out.append(int(value))
        elif isinstance(value, str) and value.strip().lower() in _FLAGS:
            out.append(_FLAGS[value.strip().lower()])
        else:
            raise TaskSourceError(
                dataset, f"{value!r} is not 0 or 1", f"write the {column} as 0 or 1", row, column
            )
    return out


def _position(value: Any, dataset: str, row: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        if float(value).is_integer() and value >= 0:
            return int(value)
    raise TaskSourceError(
        dataset,
        f"{value!r} is not a position (an integer >= 0)",
        "number each session's positions 0, 1, 2, ... from the top of the page",
        row,
        "position",
    )


def _png(path: Path, dataset: str, row: int) -> bytes:
    """The cover as RGB PNG bytes (what the chain's datasets and annotators carry)."""
    _check_image(path, dataset, row)
    with Image.open(path) as image:
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def _label(clicked: int, exposed: int) -> str:
    if clicked:
        return LABEL_CLICKED
    return LABEL_EXPOSED if exposed else LABEL_UNEXPOSED


def _require_unique_values(values: Sequence[str], dataset: str, column: str, fix: str) -> None:
    seen: dict[str, int] = {}
    for row, value in enumerate(values):
        if value in seen:
            raise TaskSourceError(
                dataset, f"{value!r} repeats (first on row {seen[value]})", fix, row, column
            )
        seen[value] = row


def _session_rows(
    rows: list[int],
    session: str,
    positions: Sequence[int],
    queries: Sequence[str],
    item_ids: Sequence[int],
    dataset: str,
) -> list[int]:
    """A session's rows in position order, checked: one query, positions and items unique."""
    rows = sorted(rows, key=lambda r: positions[r])
    for row in rows[1:]:
        if queries[row] != queries[rows[0]]:
            raise TaskSourceError(
                dataset,
                f"session {session!r} has the query {queries[rows[0]]!r} on row {rows[0]} and "
                f"{queries[row]!r} here",
                "give each search its own session_id",
                row,
                "query",
            )
    for column, values in (("position", positions), ("item_id", item_ids)):
        seen: dict[int, int] = {}
        for row in rows:
            if values[row] in seen:
                raise TaskSourceError(
                    dataset,
                    f"session {session!r} has this {column} on row {seen[values[row]]} too",
                    f"keep one row per {column} of a session",
                    row,
                    column,
                )
            seen[values[row]] = row
    return rows
