"""The ingested tables' schemas, documented once, as code.

Every ``data_ingest`` output follows one of these schemas, one per task family:

- :data:`MATH_TEXT_SCHEMA`: ``mgsm_problems``, ``gsm8k_train_problems``, ``gsm8k_test_problems``
- :data:`VISUAL_SCHEMA`: ``mathvision_problems``, ``tabmwp_problems``
- :data:`MOVIELENS_RATINGS_SCHEMA`: ``movielens_ratings``
- :data:`MOVIELENS_ITEMS_SCHEMA`: ``movielens_items``
- :data:`MOVIELENS_TAGS_SCHEMA`: ``movielens_tags``

:data:`PROMPT_SCHEMA` describes a generic prompt set of one's own (the ``grpo`` pipeline), and
two schemas describe files of your own that the experience chain reads instead of its
synthetic world (``annotation.source``): :data:`RANKING_ITEMS_SCHEMA` (a catalogue) and
:data:`RANKING_IMPRESSIONS_SCHEMA` (impression logs), each with optional columns.

Column dtypes use these names:

- ``str``: pandas string dtype (``str`` in pandas 3), no missing values;
- ``int64`` / ``float64``: numpy dtypes, no missing values;
- ``Int64``: pandas nullable integer (``<NA>`` where unknown);
- ``list[str]``: object column of string lists. After a Parquet round trip pyarrow hands each
  cell back as a 1-D numpy array of str, so readers should treat cells as sequences.
- ``prompt``: object column of prompts, each a string or a list of ``{"role", "content"}``
  chat messages.

:func:`conform_frame` casts a freshly built frame to its schema; :func:`check_frame` checks
any frame (e.g. one loaded back from Parquet) against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

DTYPES = ("str", "int64", "float64", "Int64", "list[str]", "prompt")


@dataclass(frozen=True)
class Column:
    """One column: its name, dtype name (one of :data:`DTYPES`) and meaning."""

    name: str
    dtype: str
    doc: str

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"column {self.name!r}: unknown dtype {self.dtype!r}; valid: {DTYPES}")


@dataclass(frozen=True)
class TableSchema:
    """A table's columns (in order) and the columns whose values together are unique."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    doc: str

    @property
    def names(self) -> list[str]:
        return [column.name for column in self.columns]


MATH_TEXT_SCHEMA = TableSchema(
    name="math_text",
    doc="Math word problems with a numeric final answer (MGSM, GSM8K).",
    columns=(
        Column(
            "id",
            "str",
            "problem id: mgsm-0042 (0-based line in mgsm_<lang>.tsv, the same in every language), "
            "gsm8k-train-0000 / gsm8k-test-0000 (0-based line in the original GSM8K jsonl); "
            "mgsm-0042 and gsm8k-test-0042 are the same English problem",
        ),
        Column("language", "str", "ISO 639-1 code of `question` (en, de, zh, ...)"),
        Column("question", "str", "the problem text in `language`"),
        Column(
            "question_en",
            "str",
            "the English problem text (MGSM: the line-aligned mgsm_en.tsv line; GSM8K: = question)",
        ),
        Column(
            "answer",
            "str",
            "canonical final answer: a number as written with thousands commas stripped ('2125')",
        ),
    ),
    key=("id", "language"),
)

VISUAL_SCHEMA = TableSchema(
    name="visual",
    doc="Problems whose figure or table is given only as an image (MATH-Vision, TabMWP).",
    columns=(
        Column("id", "str", "problem id: mathvision-<MATH-V id>, tabmwp-<TabMWP pid>"),
        Column(
            "image_path",
            "str",
            "image file, as a path under the configured raw data dir (relative when that "
            "parameter is relative, e.g. data/01_raw/tabmwp_numeric300/tables/12.png)",
        ),
        Column("question", "str", "problem text (MATH-Vision keeps its <image1> placeholders)"),
        Column(
            "answer",
            "str",
            "gold answer: MATH-Vision an option letter or a number/expression; TabMWP a "
            "canonical number (thousands commas stripped; decimals and fractions as written)",
        ),
        Column("choices", "list[str]", "answer options for multiple choice, empty when free-form"),
    ),
    key=("id",),
)

PROMPT_SCHEMA = TableSchema(
    name="prompts",
    doc=(
        "A generic prompt set (the grpo pipeline; creditflow.tasks.prompts): optional "
        "`completion` (the SFT target) and any other columns, which TRL-style rewards get as "
        "keyword arguments."
    ),
    columns=(
        Column("id", "str", "prompt id, unique; the held-out split is drawn over ids"),
        Column(
            "prompt",
            "prompt",
            "one user turn as text, or chat messages [{role: system|user|assistant, content}]",
        ),
    ),
    key=("id",),
)

MOVIELENS_RATINGS_SCHEMA = TableSchema(
    name="movielens_ratings",
    doc="Explicit ratings (ranking interactions), in ratings.csv order.",
    columns=(
        Column("user_id", "int64", "MovieLens userId"),
        Column("item_id", "int64", "MovieLens movieId; always present in movielens_items"),
        Column("rating", "float64", "explicit rating, 0.5-5.0 in half stars"),
        Column("timestamp", "int64", "Unix seconds, UTC"),
    ),
    key=("user_id", "item_id"),
)

MOVIELENS_ITEMS_SCHEMA = TableSchema(
    name="movielens_items",
    doc="The full MovieLens catalogue (item text for rankers).",
    columns=(
        Column("item_id", "int64", "MovieLens movieId"),
        Column("title", "str", "title from movies.csv (year included, outer spaces stripped)"),
        Column(
            "genres",
            "list[str]",
            "genres; empty for MovieLens' '(no genres listed)'",
        ),
        Column(
            "year",
            "Int64",
            "release year from the title's trailing '(YYYY)' (first year of a 'YYYY-YYYY' "
            "range); <NA> when the title has none",
        ),
    ),
    key=("item_id",),
)

MOVIELENS_TAGS_SCHEMA = TableSchema(
    name="movielens_tags",
    doc="Free-text tags users gave movies (item text for the text-only ExpModel), in tags.csv "
    "order. A tag is an interaction too: readers that hold ratings back drop the same "
    "(user_id, item_id) tags (creditflow.chain.world.movielens.without_held_back).",
    columns=(
        Column("user_id", "int64", "MovieLens userId of the tagger"),
        Column("item_id", "int64", "MovieLens movieId; always present in movielens_items"),
        Column("tag", "str", "the tag as written (outer spaces stripped), never empty"),
        Column("timestamp", "int64", "Unix seconds, UTC"),
    ),
    key=("user_id", "item_id", "tag"),
)

# --- a user's catalogue and logs for the experience chain -----------------
# Read as task sources (annotation.source.items / .impressions; creditflow.chain.world.sources
# turns them into catalogue_items and query_logs_{train,heldout}). The key columns are required;
# the *_OPTIONAL ones may be left out (or left blank per row) and get the default they name.

RANKING_ITEMS_SCHEMA = TableSchema(
    name="ranking_items",
    doc="A catalogue of your own: one row per item (a short video, a product, a post).",
    columns=(
        Column("item_id", "str", "your id of the item (text or integer), unique"),
        Column(
            "image_path",
            "str",
            "the cover image, any format Pillow reads (relative paths from the project root); "
            "stored in catalogue_items as PNG bytes",
        ),
        Column("title", "str", "the item's title or caption"),
        Column("category", "str", "the item's topic (the rerankers' category_match feature)"),
    ),
    key=("item_id",),
)
RANKING_ITEMS_OPTIONAL = (
    Column(
        "popularity",
        "float64",
        "a prior popularity signal > 0 (views, followers); 1 when not given (the rerankers' "
        "log_popularity_z feature is then 0)",
    ),
    Column("metadata", "str", "free text kept beside the item (no node reads it yet); ''"),
    Column(
        "true_quality",
        "float64",
        "a known quality in [0, 1] (editorial labels, a survey); without it the columns "
        "that need it (the simulated A/B, true nDCG, Kendall tau) are left out",
    ),
    Column(
        "true_clickbait",
        "float64",
        "a known click-bait appeal in [0, 1] the simulated users react to (needs "
        "true_quality); 0 when not given",
    ),
)

RANKING_IMPRESSIONS_SCHEMA = TableSchema(
    name="ranking_impressions",
    doc="Impression logs of your own: one row per (session, position) a ranker served.",
    columns=(
        Column("session_id", "str", "your id of the search session (text or integer)"),
        Column("query", "str", "the query text, the same on every row of a session"),
        Column("position", "int64", "0-based position on the logged page, unique per session"),
        Column("item_id", "str", "the item shown there, an item_id of the catalogue"),
        Column("clicked", "int64", "1 when the user clicked it, else 0 (true / false too)"),
        Column(
            "long_viewed",
            "int64",
            "1 when the click became a long view (watched through, dwell time), else 0; "
            "1 needs clicked = 1",
        ),
    ),
    key=("session_id", "position"),
)
RANKING_IMPRESSIONS_OPTIONAL = (
    Column(
        "exposed",
        "int64",
        "0 for a candidate ranked there but never on screen (below the fold): label U; 1 when "
        "not given (every logged impression was seen); clicked = 1 needs exposed = 1",
    ),
    Column(
        "relevance",
        "float64",
        "a known query-item relevance in [0, 1] the simulated users read (with true_quality); "
        "1 when not given",
    ),
)


# The schemas a catalog entry's ``metadata: {task_schema: ...}`` can name for a real-data
# evaluation set.
TASK_TABLE_SCHEMAS = {schema.name: schema for schema in (MATH_TEXT_SCHEMA, VISUAL_SCHEMA)}


def empty_frame(schema: TableSchema) -> pd.DataFrame:
    """A table of ``schema``'s columns and no rows.

    >>> list(empty_frame(VISUAL_SCHEMA).columns)
    ['id', 'image_path', 'question', 'answer', 'choices']
    """
    kinds = {"str": "object", "list[str]": "object", "prompt": "object"}
    return pd.DataFrame(
        {c.name: pd.Series(dtype=kinds.get(c.dtype, c.dtype)) for c in schema.columns}
    )


def conform_frame(frame: pd.DataFrame, schema: TableSchema) -> pd.DataFrame:
    """Select ``schema``'s columns in order, cast them to its dtypes and check the result.

    Raises:
        ValueError: a column is missing or the cast result breaks the schema.
    """
    missing = [name for name in schema.names if name not in frame.columns]
    if missing:
        raise ValueError(f"{schema.name}: missing columns {missing}; expected {schema.names}")
    frame = frame[schema.names].reset_index(drop=True)
    casts = {c.name: c.dtype for c in schema.columns if c.dtype != "list[str]"}
    frame = frame.astype(casts)
    check_frame(frame, schema)
    return frame


def check_frame(frame: pd.DataFrame, schema: TableSchema) -> None:
    """Check columns (names and order), dtypes, missing values and key uniqueness.

    Raises:
        ValueError: listing every problem found.
    """
    if list(frame.columns) != schema.names:
        raise ValueError(
            f"{schema.name}: columns {list(frame.columns)} differ from the schema's {schema.names}"
        )
    problems = [
        f"column {column.name!r} {problem}"
        for column in schema.columns
        if (problem := _dtype_problem(frame[column.name], column.dtype))
    ]
    duplicated = frame.duplicated(list(schema.key), keep=False)
    if duplicated.any():
        first = frame.loc[duplicated, list(schema.key)].head(3).to_dict("records")
        problems.append(f"key {list(schema.key)} is not unique, e.g. {first}")
    if problems:
        raise ValueError(f"{schema.name}: " + "; ".join(problems))


def _dtype_problem(series: pd.Series, dtype: str) -> str | None:
    """Why ``series`` does not hold ``dtype`` values, or None when it does."""
    if dtype == "Int64":
        return None if series.dtype == pd.Int64Dtype() else f"has dtype {series.dtype}, not Int64"
    if series.isna().any():
        return f"has {int(series.isna().sum())} missing values"
    if dtype == "str":
        ok = pd.api.types.is_string_dtype(series.dtype) and series.map(type).eq(str).all()
        return None if ok else f"has dtype {series.dtype}, not str"
    if dtype == "list[str]":
        ok = series.dtype == object and series.map(_is_str_sequence).all()
        return None if ok else "holds values that are not sequences of str"
    if dtype == "prompt":
        ok = series.map(_is_prompt).all()
        return None if ok else "holds values that are neither str nor chat messages"
    return None if series.dtype == np.dtype(dtype) else f"has dtype {series.dtype}, not {dtype}"


def _is_prompt(value: object) -> bool:
    if isinstance(value, str):
        return True
    is_sequence = isinstance(value, np.ndarray | Sequence) and len(value) > 0
    return is_sequence and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) and "role" in m for m in value
    )


def _is_str_sequence(value: object) -> bool:
    # Parquet gives back np.ndarray for list cells, so accept any non-string sequence.
    is_sequence = isinstance(value, np.ndarray | Sequence) and not isinstance(value, str)
    return is_sequence and all(isinstance(item, str) for item in value)
