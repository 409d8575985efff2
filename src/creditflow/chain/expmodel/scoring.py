"""ExpModel scoring: every item's (or every query-item pair's) experience score s_exp, batched, in
eval mode."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from creditflow.chain.annotation import QUERY_COLUMN
from creditflow.chain.expmodel.data import (
    SCORE_COLUMNS,
    _check_items,
    _decode_image,
    _queries_of,
    expmodel_prompt,
    is_per_query,
)
from creditflow.chain.expmodel.scorer import ExpScorer
from creditflow.models.vision import vl_prompt_inputs


class _ItemPrompts:
    """Decoded covers and the category and title of ``items_df``, by ``item_id`` (decoded once)."""

    def __init__(self, items_df: pd.DataFrame):
        _check_items(items_df)
        self._items = items_df.set_index("item_id", drop=False)
        self.ids = items_df["item_id"].tolist()
        self._fields = {
            row.item_id: (row.category, row.title) for row in items_df.itertuples(index=False)
        }
        self._images = {
            row.item_id: _decode_image(row.image_png) for row in items_df.itertuples(index=False)
        }

    def inputs(
        self, processor: Any, item_ids: Sequence[Any], queries: Sequence[Any] | None = None
    ) -> dict[str, torch.Tensor]:
        """Left-padded ``vl_prompt_inputs`` of ``item_ids`` (repeats allowed), each scored for
        its entry of ``queries`` (None: the item alone)."""
        queries = [None] * len(item_ids) if queries is None else queries
        texts = [
            expmodel_prompt(*self._fields[i], q) for i, q in zip(item_ids, queries, strict=True)
        ]
        return vl_prompt_inputs(processor, texts, [self._images[i] for i in item_ids])

    def frame(self, item_ids: Sequence[Any]) -> pd.DataFrame:
        return self._items.loc[list(item_ids)].reset_index(drop=True)


@torch.inference_mode()
def score_items(
    scorer: ExpScorer,
    processor: Any,
    items_df: pd.DataFrame,
    batch_size: int = 32,
    units: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The experience score of every item: ``SCORE_COLUMNS`` (``item_id``, ``s_exp``) in
    ``items_df`` order; with ``units`` (``QUERY_COLUMN, item_id``, e.g. ``query_candidates``),
    s_{q,v} of every (query, item) of it instead, in its order, the query first. Runs in eval
    mode (restored afterwards); batches are left-padded, and the scorer pools the last real
    token, so a score does not depend on its batch beyond float rounding.

    Raises:
        ValueError: a unit names an item missing from ``items_df``.
    """
    _check_positive(batch_size=batch_size)
    prompts = _ItemPrompts(items_df)
    item_ids = prompts.ids if units is None else units["item_id"].tolist()
    queries = [None] * len(item_ids) if units is None else units[QUERY_COLUMN].tolist()
    unknown = sorted(set(item_ids) - set(prompts.ids))
    if unknown:
        raise ValueError(f"units name items missing from items_df: {unknown[:10]}")
    values = batched_scores(
        scorer,
        len(item_ids),
        lambda chunk: prompts.inputs(processor, item_ids[chunk], queries[chunk]),
        batch_size,
    )
    frame = pd.DataFrame({"item_id": item_ids, "s_exp": values}, columns=list(SCORE_COLUMNS))
    return (
        frame
        if units is None
        else frame.assign(**{QUERY_COLUMN: queries})[[QUERY_COLUMN, *SCORE_COLUMNS]]
    )


@torch.inference_mode()
def batched_scores(
    scorer: ExpScorer,
    n_units: int,
    inputs_of: Callable[[slice], dict[str, torch.Tensor]],
    batch_size: int,
) -> np.ndarray:
    """``(n_units,)`` float32 scores of ``scorer`` in eval mode (its mode restored
    afterwards), ``batch_size`` units per forward; ``inputs_of(chunk)`` gives the model inputs
    of the units in ``chunk`` (a slice), on any device."""
    device = next(scorer.parameters()).device
    was_training = scorer.training
    scorer.eval()
    scores = []
    try:
        for start in range(0, n_units, batch_size):
            inputs = inputs_of(slice(start, start + batch_size))
            scores.append(scorer(**{k: v.to(device) for k, v in inputs.items()}).float().cpu())
    finally:
        scorer.train(was_training)
    return torch.cat(scores).numpy() if scores else np.zeros(0, dtype=np.float32)


def unit_scores(
    scores: pd.DataFrame, item_ids: Sequence[Any], queries: Sequence[Any]
) -> np.ndarray:
    """``(n,)`` s_exp of each (query, item) from ``score_items`` output: s_{q,v} when the
    scores are per query, the item's own score otherwise (then ``queries`` is not read).

    Raises:
        KeyError: a (query, item) or item without a score.
    """
    if is_per_query(scores):
        lookup = scores.set_index([QUERY_COLUMN, "item_id"])["s_exp"]
        return lookup.loc[list(zip(queries, item_ids, strict=True))].to_numpy()
    return scores.set_index("item_id")["s_exp"].loc[list(item_ids)].to_numpy()


def pair_scores(pairs_df: pd.DataFrame, scores: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s+ (P,), s- (P,))`` of the pairs (per query or per item) under ``scores``."""
    queries = _queries_of(pairs_df)
    return tuple(
        torch.tensor(unit_scores(scores, pairs_df[side].tolist(), queries))
        for side in ("pos_item", "neg_item")
    )


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
