"""Raw-source ingestion: one small loader per raw data set, each validated on load.

The loaders are the project's I/O layer for raw files (TSV, JSON lines, JSON, CSV). They
return pandas frames that follow the schemas documented in :mod:`creditflow.ingest.schemas`
and raise :class:`DataValidationError` naming the file and the 1-based source line of any
bad record. Kedro nodes in ``creditflow.pipelines.data_ingest`` only call them.
"""

from creditflow.errors import DataValidationError
from creditflow.ingest.config import SOURCE_DIRS, IngestConfig
from creditflow.ingest.math_text import load_gsm8k, load_mgsm
from creditflow.ingest.ranking import load_movielens, load_movielens_tags
from creditflow.ingest.schemas import (
    MATH_TEXT_SCHEMA,
    MOVIELENS_ITEMS_SCHEMA,
    MOVIELENS_RATINGS_SCHEMA,
    MOVIELENS_TAGS_SCHEMA,
    VISUAL_SCHEMA,
    Column,
    TableSchema,
    check_frame,
    conform_frame,
)
from creditflow.ingest.validation import SourceLine, canonical_number
from creditflow.ingest.visual import load_mathvision, load_tabmwp

__all__ = [
    "MATH_TEXT_SCHEMA",
    "MOVIELENS_ITEMS_SCHEMA",
    "MOVIELENS_RATINGS_SCHEMA",
    "MOVIELENS_TAGS_SCHEMA",
    "SOURCE_DIRS",
    "VISUAL_SCHEMA",
    "Column",
    "DataValidationError",
    "IngestConfig",
    "SourceLine",
    "TableSchema",
    "canonical_number",
    "check_frame",
    "conform_frame",
    "load_gsm8k",
    "load_mathvision",
    "load_mgsm",
    "load_movielens",
    "load_movielens_tags",
    "load_tabmwp",
]
