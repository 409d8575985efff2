"""Loaders for MovieLens (ranking interactions) into the ratings, items and tags schemas."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from creditflow.ingest.schemas import (
    MOVIELENS_ITEMS_SCHEMA,
    MOVIELENS_RATINGS_SCHEMA,
    MOVIELENS_TAGS_SCHEMA,
    conform_frame,
)
from creditflow.ingest.validation import SourceLine, read_csv, require_unique, text_field

logger = logging.getLogger(__name__)

RATINGS_FILE = "ratings.csv"
MOVIES_FILE = "movies.csv"
TAGS_FILE = "tags.csv"
RATING_RANGE = (0.5, 5.0)  # half stars (movielens_ml_latest_small/SOURCE.md)
NO_GENRES = "(no genres listed)"  # MovieLens' placeholder for an empty genre list
# The year closes the title: 'Toy Story (1995)'; series give a range: '(2006–2007)'.
_YEAR = re.compile(r"\((\d{4})(?:[-–]\d{4})?\)\s*$")
_UNSIGNED_INT = r"\d+"


def load_movielens(
    source_dir: Path, *, max_rows: int | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Load ratings.csv and movies.csv; every rated item must be in the catalogue.

    Args:
        source_dir: the ``movielens_ml_latest_small`` folder.
        max_rows: keep the first N ratings in file order (all when None); the item
            catalogue is always kept whole, since rankers draw unrated negatives from it.

    Returns:
        ``(ratings, items)`` following :data:`MOVIELENS_RATINGS_SCHEMA` and
        :data:`MOVIELENS_ITEMS_SCHEMA`.

    Raises:
        DataValidationError: a row is malformed, a rating is out of range, a key repeats or
            a rated movie is missing from movies.csv.
    """
    items = _load_items(source_dir / MOVIES_FILE)
    path = source_dir / RATINGS_FILE
    lines, ratings = _load_ratings(path)
    known = ratings["item_id"].isin(items["item_id"])
    _require_rows(
        path,
        lines,
        known,
        lambda row: f"movieId {ratings['item_id'][row]} is not in {MOVIES_FILE}",
        f"add the movie to {MOVIES_FILE} or drop its ratings",
    )
    logger.info("MovieLens: %d ratings, %d items from %s", len(ratings), len(items), source_dir)
    ratings = conform_frame(ratings.iloc[:max_rows], MOVIELENS_RATINGS_SCHEMA)
    return ratings, items


def load_movielens_tags(
    source_dir: Path, items: pd.DataFrame, *, max_rows: int | None = None
) -> pd.DataFrame:
    """Load tags.csv: every tagged movie must be in ``items`` (``load_movielens``' catalogue).

    Args:
        source_dir: the ``movielens_ml_latest_small`` folder.
        items: the ``movielens_items`` catalogue.
        max_rows: keep the first N tags in file order (all when None).

    Returns:
        A frame following :data:`MOVIELENS_TAGS_SCHEMA`.

    Raises:
        DataValidationError: a malformed id or timestamp, an empty tag, a (user, movie, tag)
            given twice or a tagged movie missing from movies.csv.
    """
    path = source_dir / TAGS_FILE
    lines, raw = read_csv(path, ("userId", "movieId", "tag", "timestamp"))
    columns = {}
    for source, target in (
        ("userId", "user_id"),
        ("movieId", "item_id"),
        ("timestamp", "timestamp"),
    ):
        columns[target] = _unsigned_column(path, lines, raw[source], source)
    tags = [
        text_field(tag, "tag", SourceLine(path, line)).strip()
        for line, tag in zip(lines, raw["tag"], strict=True)
    ]
    frame = pd.DataFrame({**columns, "tag": tags})[MOVIELENS_TAGS_SCHEMA.names]
    _require_rows(
        path,
        lines,
        frame["item_id"].isin(items["item_id"]),
        lambda row: f"movieId {frame['item_id'][row]} is not in {MOVIES_FILE}",
        f"add the movie to {MOVIES_FILE} or drop its tags",
    )
    _require_rows(
        path,
        lines,
        ~frame.duplicated(["user_id", "item_id", "tag"]),
        lambda row: (
            f"user {frame['user_id'][row]} tags movie {frame['item_id'][row]} "
            f"{frame['tag'][row]!r} twice"
        ),
        "keep one row per (userId, movieId, tag)",
    )
    logger.info(
        "MovieLens: %d tags of %d movies from %s", len(frame), frame["item_id"].nunique(), path
    )
    return conform_frame(frame.iloc[:max_rows], MOVIELENS_TAGS_SCHEMA)


def _unsigned_column(path: Path, lines: list[int], raw: list[str], source: str) -> pd.Series:
    """A CSV column of non-negative integers as int64 (the first bad row raises)."""
    values = pd.Series(raw, dtype="str")
    _require_rows(
        path,
        lines,
        values.str.fullmatch(_UNSIGNED_INT),
        lambda row: f"{source} {values[row]!r} is not a non-negative integer",
        f"write {source} as digits only",
    )
    return values.astype("int64")


def _load_ratings(path: Path) -> tuple[list[int], pd.DataFrame]:
    """Line numbers and the checked ratings frame (schema column names) of ratings.csv."""
    lines, raw = read_csv(path, ("userId", "movieId", "rating", "timestamp"))
    columns = {
        target: _unsigned_column(path, lines, raw[source], source)
        for source, target in (
            ("userId", "user_id"),
            ("movieId", "item_id"),
            ("timestamp", "timestamp"),
        )
    }
    rating = pd.to_numeric(pd.Series(raw["rating"], dtype="str"), errors="coerce")
    _require_rows(
        path,
        lines,
        rating.between(*RATING_RANGE),  # NaN (unparsable) is outside too
        lambda row: f"rating {raw['rating'][row]!r} is not a number in {list(RATING_RANGE)}",
        "use MovieLens' half-star scale 0.5-5.0",
    )
    frame = pd.DataFrame({**columns, "rating": rating.astype("float64")})
    duplicated = frame.duplicated(["user_id", "item_id"])
    _require_rows(
        path,
        lines,
        ~duplicated,
        lambda row: f"user {frame['user_id'][row]} rates movie {frame['item_id'][row]} twice",
        "keep one rating per (userId, movieId)",
    )
    return lines, frame


def _load_items(path: Path) -> pd.DataFrame:
    """The movies.csv catalogue as a :data:`MOVIELENS_ITEMS_SCHEMA` frame."""
    lines, raw = read_csv(path, ("movieId", "title", "genres"))
    rows, ids = [], []
    for line, movie_id, raw_title, raw_genres in zip(
        lines, raw["movieId"], raw["title"], raw["genres"], strict=True
    ):
        at = SourceLine(path, line)
        if not re.fullmatch(_UNSIGNED_INT, movie_id):
            raise at.error(f"movieId {movie_id!r} is not a non-negative integer", "fix the id")
        title = text_field(raw_title, "title", at).strip()
        genres = text_field(raw_genres, "genres", at)
        year = _YEAR.search(title)
        rows.append(
            (
                int(movie_id),
                title,
                [] if genres == NO_GENRES else genres.split("|"),
                int(year.group(1)) if year else None,
            )
        )
        ids.append((movie_id, at))
    require_unique(ids)
    frame = pd.DataFrame(rows, columns=MOVIELENS_ITEMS_SCHEMA.names)
    return conform_frame(frame, MOVIELENS_ITEMS_SCHEMA)


def _require_rows(
    path: Path, lines: list[int], ok: pd.Series, problem: Callable[[int], str], fix: str
) -> None:
    """Raise at the source line of the first row where ``ok`` is False."""
    bad = ~ok.fillna(False).to_numpy(dtype=bool)
    if bad.any():
        row = int(bad.argmax())
        raise SourceLine(path, lines[row]).error(problem(row), fix)
