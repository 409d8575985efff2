"""Item annotators for the experience model (docs/methods/experience.md, step 1): the schema, a
measuring heuristic, VLM backends.

The registry (``annotation.base``: ``ANNOTATORS``, ``build_annotator``) and the local-VLM
backend (``annotation.hf_backend``) are imported from their modules, not from here: they
import torch and transformers, and the parameter check reads this package before torch loads
(``annotation.options``, ``annotation.ratings``)."""

from creditflow.chain.annotation.heuristic import HeuristicAnnotator
from creditflow.chain.annotation.openai_backend import OpenAIAnnotator
from creditflow.chain.annotation.schema import (
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
    "DIMENSIONS",
    "ITEM_COLUMNS",
    "QUERY_COLUMN",
    "SCHEMA_DESCRIPTION",
    "Annotation",
    "AnnotationParseError",
    "HeuristicAnnotator",
    "OpenAIAnnotator",
    "parse_annotation",
]
