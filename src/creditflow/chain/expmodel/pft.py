"""ExpModel stage II (PFT): a scalar head on the SFT'd backbone, trained on ordered pairs of
candidates with the pairwise preference loss."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import pandas as pd
import torch

from creditflow.chain.expmodel.data import (
    PFTOptions,
    _queries_of,
    is_per_query,
    pair_units,
    split_pairs,
)
from creditflow.chain.expmodel.losses import pairwise_preference_loss
from creditflow.chain.expmodel.scorer import ExpScorer
from creditflow.chain.expmodel.scoring import _ItemPrompts, pair_scores, score_items
from creditflow.training.checkpoint import CheckpointStore, content_digest, run_store
from creditflow.training.supervised import SupervisedConfig, SupervisedTrainer

logger = logging.getLogger(__name__)

# The metrics key of the pair accuracy on held-out pairs, measured once after PFT.
HELDOUT_ACCURACY = "pft/heldout_accuracy"


def pair_accuracy(s_pos: torch.Tensor, s_neg: torch.Tensor) -> float:
    """Share of pairs ordered right, ties counted as half: ``mean(1[s+ > s-] + 0.5 * 1[s+ = s-])``.

    Counting ties as half makes a constant scorer (the untrained ``ExpScorer``) exactly 0.5.

    >>> pair_accuracy(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 0.0, 3.0]))
    0.5
    """
    if s_pos.shape != s_neg.shape or s_pos.dim() != 1 or s_pos.numel() == 0:
        raise ValueError(
            f"s_pos and s_neg must both be (N,) with N >= 1, got {tuple(s_pos.shape)} "
            f"and {tuple(s_neg.shape)}"
        )
    right = (s_pos > s_neg).double() + 0.5 * (s_pos == s_neg).double()
    return float(right.mean())


def train_expmodel_pft(
    scorer: ExpScorer,
    processor: Any,
    items_df: pd.DataFrame,
    pairs_df: pd.DataFrame,
    *,
    training: SupervisedConfig,
    options: PFTOptions | None = None,
    checkpoints: CheckpointStore | None = None,
    progress: bool = True,
) -> tuple[ExpScorer, list[dict[str, float]], float]:
    """docs/methods/experience.md, step 3: train ``scorer`` in place on ordered pairs with ``pairwise_preference_loss``.

    Part of the pairs is held out (``options.heldout_split``) and scored after training. Each
    step scores the ``2 * batch_size`` items of ``batch_size`` training pairs in one
    left-padded forward.

    Args:
        scorer: ``ExpScorer`` on the SFT'd backbone.
        processor: the ExpModel's processor.
        items_df: ``item_id, category, title, image_png`` of every item in ``pairs_df``.
        pairs_df: ``preference_pairs`` output (``pos_item``, ``neg_item``, and the
            ``QUERY_COLUMN`` both items are scored for when the pairs are per query).
        training: steps, pairs per step, AdamW and clipping (the chain's settings:
            ``EXPMODEL_TRAINING``); its ``seed`` also draws the held-out split.
        options: ``PFTOptions`` (None: its defaults). Either way of ``train_backbone``, parameters the caller set
            to ``requires_grad=False`` stay frozen, and every ``requires_grad`` flag is as it
            was on return.
        checkpoints: as in ``train_expmodel_sft`` (the run is keyed by the scorer's weights,
            the training pairs, their items, ``training``, ``lam`` and ``train_backbone``).

    Returns:
        ``(scorer, history, heldout_accuracy)``: the scorer in eval mode; one row per step with
        ``step``, ``pft/loss``, ``pft/accuracy`` (the batch's pairs), ``pft/score_mean`` and ``lr``;
        ``pair_accuracy`` on the held-out pairs after training (NaN without held-out pairs).
    """
    options = options or PFTOptions()
    lam, train_backbone = options.lam, options.train_backbone
    prompts = _ItemPrompts(items_df)
    train_pairs, heldout_pairs = split_pairs(
        pairs_df,
        options.heldout_fraction,
        training.seed,
        options.heldout_split,
        known_items=prompts.ids,
    )
    # A parameter the caller froze stays frozen.
    trainable = [p for p in scorer.parameters_to_train(train_backbone) if p.requires_grad]
    if not trainable:
        raise ValueError("no parameter to train: every chosen parameter has requires_grad=False")
    device = next(scorer.parameters()).device
    pos_items = train_pairs["pos_item"].tolist()
    neg_items = train_pairs["neg_item"].tolist()
    queries = _queries_of(train_pairs)

    def batch_fn(rows: list[int]) -> dict[str, torch.Tensor]:
        batch_items = [pos_items[i] for i in rows] + [neg_items[i] for i in rows]
        batch_queries = [queries[i] for i in rows] * 2
        inputs = prompts.inputs(processor, batch_items, batch_queries)
        return {k: v.to(device) for k, v in inputs.items()}

    # Per-item pairs keep the key they always had, so their finished runs still load.
    pair_lists = [pos_items, neg_items] + ([queries] if is_per_query(train_pairs) else [])
    store = run_store(
        checkpoints,
        scorer,
        training.run_key(),
        {"lam": lam, "train_backbone": train_backbone},
        pair_lists,
        _items_digest(items_df, set(pos_items) | set(neg_items)),
    )
    trainer = SupervisedTrainer(
        scorer,
        len(train_pairs),
        batch_fn,
        lambda inputs: pft_loss(scorer, inputs, lam),
        training,
        store,
        parameters=trainable,
        desc="ExpModel PFT",
        progress=progress,
    )
    with _trainable_only(scorer, trainable):
        history = trainer.train()
    scorer.eval()

    heldout_accuracy = math.nan
    if not heldout_pairs.empty:
        needed = pd.unique(heldout_pairs[["pos_item", "neg_item"]].to_numpy().ravel())
        scores = score_items(
            scorer,
            processor,
            prompts.frame(needed),
            batch_size=2 * training.batch_size,
            units=pair_units(heldout_pairs) if is_per_query(heldout_pairs) else None,
        )
        heldout_accuracy = pair_accuracy(*pair_scores(heldout_pairs, scores))
    logger.info(
        "ExpModel PFT: %d steps on %d pairs, final loss %.4f, held-out accuracy %.3f (%d pairs)",
        training.steps,
        len(train_pairs),
        history[-1]["pft/loss"],
        heldout_accuracy,
        len(heldout_pairs),
    )
    return scorer, history, heldout_accuracy


def pft_loss(
    scorer: ExpScorer, inputs: dict[str, torch.Tensor], lam: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """docs/methods/experience.md, step 3 loss of one batch whose first half of rows are the preferred items: ``inputs``
    are the scorer's (any backbone: the VL ExpModel's, or a text one's ``input_ids`` and
    ``attention_mask``, ``chain.expmodel.text``), ``(2b, P)`` each."""
    scores = scorer(**inputs)  # (2b,)
    n_pairs = scores.shape[0] // 2
    s_pos, s_neg = scores[:n_pairs], scores[n_pairs:]  # (b,) each
    loss = pairwise_preference_loss(s_pos, s_neg, lam)
    metrics = {
        "pft/loss": loss.item(),
        "pft/accuracy": pair_accuracy(s_pos.detach(), s_neg.detach()),
        "pft/score_mean": scores.detach().mean().item(),
    }
    return loss, metrics


@contextmanager
def _trainable_only(module: torch.nn.Module, trainable: Sequence[torch.nn.Parameter]):
    """Only ``trainable`` require grad inside (no backward through the frozen rest, e.g. the
    vision tower); every parameter's own ``requires_grad`` is restored on exit."""
    chosen = {id(p) for p in trainable}
    before = [(p, p.requires_grad) for p in module.parameters()]
    for parameter, _ in before:
        parameter.requires_grad_(id(parameter) in chosen)
    try:
        yield
    finally:
        for parameter, flag in before:
            parameter.requires_grad_(flag)


def _items_digest(items_df: pd.DataFrame, item_ids: set[Any]) -> str:
    """One digest of what the scorer reads of ``item_ids``: id, category, title and cover."""
    rows = items_df[items_df["item_id"].isin(item_ids)].sort_values("item_id")
    return content_digest(
        b"".join(
            content_digest(f"{r.item_id}\x00{r.category}\x00{r.title}").encode()
            + content_digest(bytes(r.image_png)).encode()
            for r in rows.itertuples(index=False)
        )
    )
