"""The annotator interface and the name -> annotator table (docs/methods/experience.md, step 1).

Every annotator turns items (``ITEM_COLUMNS``: ``item_id, category, title, image_png``) into one
row per item with ``ANNOTATION_COLUMNS``: ``item_id``, ``status`` (``"ok"`` or ``"failed"``),
``overall``, one 1-5 score per ``DIMENSIONS``, ``analysis``, ``raw_text`` (the annotator's
output, the SFT target of docs/methods/experience.md, step 2), ``attempts`` and ``error``. Failed rows keep their scores
missing rather than guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import pandas as pd

from creditflow.chain.annotation.hf_backend import HFAnnotator
from creditflow.chain.annotation.options import ANNOTATOR_OPTIONS


@runtime_checkable
class Annotator(Protocol):
    """Anything that annotates a frame of items."""

    def annotate(self, items: pd.DataFrame) -> pd.DataFrame:
        """``items`` with ``ITEM_COLUMNS`` -> one row per item with ``ANNOTATION_COLUMNS``."""
        ...


# The names of annotation.options.ANNOTATOR_OPTIONS, which checks the options of each without
# torch; the hf backend in place of its options.
ANNOTATORS: Mapping[str, Callable[..., Annotator]] = MappingProxyType(
    {**ANNOTATOR_OPTIONS, "hf": HFAnnotator}  # loads its model on the first annotate(), not here
)


def build_annotator(name: str, **options) -> Annotator:
    """Build the annotator registered as ``name`` with its keyword ``options``.

    >>> type(build_annotator("heuristic")).__name__
    'HeuristicAnnotator'
    """
    if name not in ANNOTATORS:
        raise ValueError(f"unknown annotator {name!r}; valid: {', '.join(sorted(ANNOTATORS))}")
    return ANNOTATORS[name](**options)
