"""A text-only ExpModel (docs/methods/experience.md, steps 2-3) for catalogues without covers (MovieLens).

The same two stages as the VL ExpModel (``chain.expmodel.sft`` / ``expmodel_pft``), on a
text Qwen2:

- SFT: ``training.sft.run_sft`` on (item prompt, teacher annotation) pairs, the prompt being
  ``text_expmodel_prompt`` (title, year, genres, tags) in the chat template, the target
  ``text_expmodel_target`` (the analysis, then ``overall``, as compact JSON), loss on the target
  tokens only;
- PFT: ``ExpScorer`` on the SFT'd ``model.model`` (no LM head), trained by the shared
  ``SupervisedTrainer`` on ordered pairs (A > B) of items whose teacher scores differ by at least
  a margin (``expmodel_data.catalogue_pairs``), with ``expmodel_pft.pft_loss``
  (``-mean(log sigmoid(s+ - s-)) + lambda mean((s+ + s-)^2)``).

``score_text_items`` then scores any item from its text alone, the teacher-annotated ones and,
what the model is for, the ones the teacher could not judge (too few ratings). Scores are per
item (``expmodel_data.SCORE_COLUMNS``): MovieLens has no search queries.

Shape symbols: ``B`` prompts, ``P`` prompt tokens (left-padded).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from creditflow.chain.expmodel import data as expmodel_data
from creditflow.chain.expmodel import pft as expmodel_pft
from creditflow.chain.expmodel import scoring as expmodel_scoring
from creditflow.chain.expmodel.scorer import ExpScorer
from creditflow.training.supervised import SupervisedConfig, SupervisedTrainer

logger = logging.getLogger(__name__)

TEXT_EXPMODEL_PROMPT = (
    "Rate this movie for the viewing experience: write an analysis, then a 0.5-5 score, as "
    "JSON.\nTitle: {title}\nYear: {year}\nGenres: {genres}\nTags: {tags}"
)


def text_expmodel_prompt(title: str, year: Any, genres: Sequence[str], tags: Sequence[str]) -> str:
    """The user turn of the text ExpModel for one item (``chain.world.movielens.movielens_item_texts``
    fields); an unknown year, no genres or no tags are written as such.

    >>> print(text_expmodel_prompt("Heat (1995)", 1995, ["Action", "Crime"], []))
    Rate this movie for the viewing experience: write an analysis, then a 0.5-5 score, as JSON.
    Title: Heat (1995)
    Year: 1995
    Genres: Action, Crime
    Tags: none
    """
    return TEXT_EXPMODEL_PROMPT.format(
        title=title,
        year="unknown" if pd.isna(year) else int(year),
        genres=", ".join(genres) if len(genres) else "none listed",
        tags=", ".join(tags) if len(tags) else "none",
    )


def text_expmodel_prompts(item_texts: pd.DataFrame) -> dict[Any, str]:
    """``item_id -> text_expmodel_prompt`` of every row of ``item_texts``."""
    return {
        row.item_id: text_expmodel_prompt(row.title, row.year, row.genres, row.tags)
        for row in item_texts.itertuples(index=False)
    }


def text_expmodel_target(annotation: Mapping[str, Any]) -> str:
    """SFT target of one teacher annotation (``annotation.ratings``): the analysis first, so a
    generated score is conditioned on the generated reasoning (as ``expmodel_target``), cut to
    ``expmodel_data.MAX_TARGET_ANALYSIS_CHARS``.

    >>> text_expmodel_target({"analysis": "Loved.", "overall": 4.3})
    '{"analysis":"Loved.","overall":4.3}'
    """
    analysis = expmodel_data.target_analysis(annotation["analysis"])
    payload = {"analysis": analysis, "overall": float(annotation["overall"])}
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def prompt_inputs(tokenizer: Any, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` ``(B, P)`` of ``prompts`` in the chat template with the
    assistant header (as ``sft.build_sft_examples`` formats them), left-padded: the scorer pools
    the last real token, the one whose state would start the SFT'd answer."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p in prompts
    ]
    batch = tokenizer(
        texts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt"
    )
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def train_text_expmodel_pft(
    scorer: ExpScorer,
    tokenizer: Any,
    prompts: Mapping[Any, str],
    pairs: pd.DataFrame,
    *,
    training: SupervisedConfig,
    options: expmodel_pft.PFTOptions | None = None,
    progress: bool = True,
) -> tuple[ExpScorer, list[dict[str, float]], float]:
    """docs/methods/experience.md, step 3 on text: train ``scorer`` in place on ``pairs`` (``expmodel_data.catalogue_pairs``).

    Part of the pairs is held out as ``expmodel_pft.train_expmodel_pft`` does
    (``options.heldout_fraction`` / ``heldout_split``, ``expmodel_data.split_pairs``) and scored
    after training. Each step scores the ``2 b`` items of ``b`` pairs in one left-padded
    forward, preferred items first (``expmodel_pft.pft_loss``).

    Returns:
        ``(scorer, history, heldout_accuracy)`` as ``expmodel_pft.train_expmodel_pft``.
    """
    options = options or expmodel_pft.PFTOptions()
    train_pairs, heldout_pairs = expmodel_data.split_pairs(
        pairs, options.heldout_fraction, training.seed, options.heldout_split, list(prompts)
    )
    device = next(scorer.parameters()).device
    pos_items, neg_items = train_pairs["pos_item"].tolist(), train_pairs["neg_item"].tolist()

    def batch_fn(rows: list[int]) -> dict[str, torch.Tensor]:
        items = [pos_items[i] for i in rows] + [neg_items[i] for i in rows]
        inputs = prompt_inputs(tokenizer, [prompts[i] for i in items])
        return {k: v.to(device) for k, v in inputs.items()}

    history = SupervisedTrainer(
        scorer,
        len(train_pairs),
        batch_fn,
        lambda inputs: expmodel_pft.pft_loss(scorer, inputs, options.lam),
        training,
        None,
        parameters=scorer.parameters_to_train(options.train_backbone),
        desc="text ExpModel PFT",
        progress=progress,
    ).train()
    scorer.eval()
    heldout_accuracy = math.nan
    if not heldout_pairs.empty:
        needed = pd.unique(
            heldout_pairs[list(expmodel_data.CATALOGUE_PAIR_COLUMNS)].to_numpy().ravel()
        )
        scores = score_text_items(scorer, tokenizer, prompts, needed, 2 * training.batch_size)
        heldout_accuracy = expmodel_pft.pair_accuracy(
            *expmodel_scoring.pair_scores(heldout_pairs, scores)
        )
    logger.info(
        "text ExpModel PFT: %d steps on %d pairs, final loss %.4f, held-out accuracy %.3f",
        training.steps,
        len(train_pairs),
        history[-1]["pft/loss"],
        heldout_accuracy,
    )
    return scorer, history, heldout_accuracy


@torch.inference_mode()
def score_text_items(
    scorer: ExpScorer,
    tokenizer: Any,
    prompts: Mapping[Any, str],
    item_ids: Sequence[Any],
    batch_size: int = 64,
) -> pd.DataFrame:
    """``expmodel_data.SCORE_COLUMNS`` (``item_id, s_exp``) of ``item_ids`` in their order, each
    scored from its prompt alone in eval mode (restored afterwards)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids = list(item_ids)
    unknown = [i for i in ids if i not in prompts]
    if unknown:
        raise ValueError(f"{len(unknown)} item(s) have no prompt, e.g. {unknown[:5]}")
    values = expmodel_scoring.batched_scores(
        scorer,
        len(ids),
        lambda chunk: prompt_inputs(tokenizer, [prompts[i] for i in ids[chunk]]),
        batch_size,
    )
    return pd.DataFrame(
        {"item_id": ids, "s_exp": values}, columns=list(expmodel_data.SCORE_COLUMNS)
    )


def on_reference_scale(scores: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``scores`` moved affinely to the mean and standard deviation of ``reference``:
    ``mean(ref) + std(ref) (s - mean(s)) / std(s)``; the order of the scores is kept.

    A reranker reads s_exp raw (``chain.config.FEATURE_NAMES``: ``exp_score``, beside the
    scale-free ``exp_rank_gain``), so scores of another ExpModel, on its own arbitrary PFT
    scale, must be put on the scale of those it was trained with.

    >>> on_reference_scale(np.array([1.0, 3.0]), np.array([0.0, 10.0])).tolist()
    [0.0, 10.0]
    """
    scores, reference = np.asarray(scores, np.float64), np.asarray(reference, np.float64)
    if len(reference) < 2 or len(scores) < 2:
        raise ValueError("need at least two scores and two reference scores to match a scale")
    spread = scores.std()
    z = (scores - scores.mean()) / (spread if spread > 0 else 1.0)
    return reference.mean() + reference.std() * z
