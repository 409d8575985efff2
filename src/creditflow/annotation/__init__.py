"""Item annotators for the experience model (docs/methods/experience.md, step 1): the schema, a measuring heuristic, VLM
backends."""

from creditflow.annotation.base import ANNOTATORS, Annotator, build_annotator
from creditflow.annotation.heuristic import HeuristicAnnotator
from creditflow.annotation.hf_backend import HFAnnotator
from creditflow.annotation.openai_backend import OpenAIAnnotator
from creditflow.annotation.schema import (
    ANNOTATION_COLUMNS,
    DIMENSIONS,
    ITEM_COLUMNS,
    QUERY_COLUMN,
    SCHEMA_DESCRIPTION,
    Annotation,
    parse_annotation,
)
from creditflow.errors import AnnotationParseError

__all__ = [
    "ANNOTATION_COLUMNS",
    "ANNOTATORS",
    "DIMENSIONS",
    "ITEM_COLUMNS",
    "QUERY_COLUMN",
    "SCHEMA_DESCRIPTION",
    "Annotation",
    "AnnotationParseError",
    "Annotator",
    "HFAnnotator",
    "HeuristicAnnotator",
    "OpenAIAnnotator",
    "build_annotator",
    "parse_annotation",
]
