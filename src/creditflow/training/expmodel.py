"""ExpModel training (SPEC section 3, steps 2-3): SFT on item annotations, then pairwise PFT.

Stage I (SFT) teaches a small vision-language model to write an item's annotation y from its
cover image and title: ``L_SFT = -sum_t log p(y_t | y_<t, x)`` over the annotation tokens only.
Stage II (PFT) puts a scalar head on the SFT'd backbone (``creditflow.models.scorer.ExpScorer``)
and trains it on ordered pairs (A > B) of candidates of long-tail queries with
``pairwise_preference_loss``. ``score_items`` then gives every item its experience score
``s_exp``, the input of the augmented targets and the page-level reward (SPEC 3.4-3.5).

The prompt x is one user turn: the cover image, then ``EXPMODEL_PROMPT`` filled with the item's
category and title (the annotator judges relevance against the category, so the model sees it
too). ``SCORE_MODES`` says what is scored: ``"query"`` scores an item *for a search query*,
s_{q,v} as SPEC 3.3 writes it: the query text closes the prompt (``QUERY_PROMPT``), SFT learns
the annotation of the (query, item) pair (relevance judged for the query), and PFT pairs are
formed per query from those annotations; ``"item"`` scores the item alone, for catalogues
without queries. A frame of annotations, pairs or scores is per (query, item) when it has the
``QUERY_COLUMN`` column, per item otherwise. The target y is the annotation as compact JSON with the analysis *first*, then the five
dimension scores and ``overall`` (``expmodel_target``): the reasoning precedes the verdict, so a
generated score is conditioned on the generated analysis; ``parse_annotation`` reads it back.

Shape symbols: ``B`` sequences, ``T`` tokens (prompt + target, right-padded), ``N`` image
patches of a batch, ``D`` patch width (1176 for Qwen2.5-VL), ``H`` hidden width.
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from PIL import Image

from creditflow.algorithms import pairwise_preference_loss
from creditflow.annotation import DIMENSIONS, QUERY_COLUMN
from creditflow.models.scorer import ExpScorer
from creditflow.models.vision import vl_prompt_inputs
from creditflow.tasks.reranking import FREQUENCY_BANDS
from creditflow.training.checkpoint import CheckpointStore, content_digest, run_store
from creditflow.training.config import ConfigError
from creditflow.training.sft import IGNORE_INDEX
from creditflow.training.supervised import SupervisedConfig, SupervisedTrainer

logger = logging.getLogger(__name__)

EXPMODEL_PROMPT = (
    "Rate this item's cover and title for the viewing experience: write an analysis, then "
    "1-5 scores, as JSON.\nCategory: {category}\nTitle: {title}"
)
QUERY_PROMPT = "\nQuery: {query}"  # closes the prompt of an item scored for a query
ITEM_FIELDS = ("item_id", "category", "title", "image_png")
PAIR_COLUMNS = ("pos_item", "neg_item", "session_id")  # per query: QUERY_COLUMN first
SCORE_COLUMNS = ("item_id", "s_exp")  # per query: QUERY_COLUMN first
# What the ExpModel scores (expmodel_sft.score_mode): an item for a query, or an item alone.
QUERY_MODE, ITEM_MODE = "query", "item"
SCORE_MODES = (QUERY_MODE, ITEM_MODE)
ITEM_SPLIT_COLUMNS = ("item_id", "split")
TRAIN, UNSEEN = "train", "unseen"  # the values of an item split's ``split`` column
# Annotated overall scores are rounded to 2 decimals (0.2 steps for the heuristic annotator):
# a difference meant to equal the margin must not fall below it by float rounding.
_MARGIN_TOLERANCE = 1e-9
# The chain's ``SupervisedConfig`` settings for ExpModel SFT and PFT, under the YAML's
# ``training`` keys (``SupervisedConfig.from_params(params, **EXPMODEL_TRAINING)``): AdamW at a
# constant learning rate without weight decay, gradients clipped to norm 1.0.
EXPMODEL_TRAINING = {"schedule": "constant", "weight_decay": 0.0, "max_grad_norm": 1.0}


# --- prompts and targets ----------------------------------------------------------------------


def expmodel_prompt(category: str, title: str, query: str | None = None) -> str:
    """The text part of the ExpModel's user turn (the image comes before it); for an item
    scored for ``query``, the query closes it.

    >>> expmodel_prompt("cooking", "Pasta tutorial", "pasta recipe").splitlines()[-2:]
    ['Title: Pasta tutorial', 'Query: pasta recipe']
    """
    text = EXPMODEL_PROMPT.format(category=category, title=title)
    return text if query is None else text + QUERY_PROMPT.format(query=query)


def check_score_mode(score_mode: str) -> str:
    """``score_mode`` if it is one of ``SCORE_MODES``, else a ValueError listing them."""
    if score_mode not in SCORE_MODES:
        raise ValueError(f"unknown score_mode {score_mode!r}; valid: {', '.join(SCORE_MODES)}")
    return score_mode


def is_per_query(frame: pd.DataFrame) -> bool:
    """Whether annotations, pairs or scores are per (query, item) (a ``QUERY_COLUMN``)."""
    return QUERY_COLUMN in frame.columns


def query_candidates(sessions: pd.DataFrame) -> pd.DataFrame:
    """``QUERY_COLUMN, item_id``: every distinct (query, candidate) of ``sessions``, in order
    of first appearance: what query mode annotates and scores.

    >>> frame = pd.DataFrame({"query_text": ["a", "b", "a"], "candidates": [[1, 2], [2], [2, 3]]})
    >>> query_candidates(frame).values.tolist()
    [['a', 1], ['a', 2], ['b', 2], ['a', 3]]
    """
    missing = [c for c in (QUERY_COLUMN, "candidates") if c not in sessions.columns]
    if missing:
        raise ValueError(f"sessions are missing columns {missing}; query mode needs the queries")
    if sessions[QUERY_COLUMN].isna().any():
        raise ValueError(
            "some sessions have no query text: score them per item (expmodel_sft.score_mode: item)"
        )
    rows = [
        (query, item)
        for query, candidates in zip(sessions[QUERY_COLUMN], sessions["candidates"], strict=True)
        for item in candidates
    ]
    return pd.DataFrame(list(dict.fromkeys(rows)), columns=[QUERY_COLUMN, "item_id"]).reset_index(
        drop=True
    )


def expmodel_target(annotation: pd.Series | dict) -> str:
    """SFT target of one ``status == "ok"`` annotation row: compact JSON, analysis first.

    >>> row = {
    ...     "analysis": "Sharp.",
    ...     "sharpness": 5,
    ...     "exposure": 4,
    ...     "noise": 5,
    ...     "title_informativeness": 3,
    ...     "relevance": 4,
    ...     "overall": 4.2,
    ... }
    >>> expmodel_target(row)
    '{"analysis":"Sharp.","sharpness":5,"exposure":4,"noise":5,"title_informativeness":3,"relevance":4,"overall":4.2}'
    """
    payload = {"analysis": str(annotation["analysis"])}
    payload.update({d: int(annotation[d]) for d in DIMENSIONS})
    payload["overall"] = float(annotation["overall"])
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def _decode_image(image_png: bytes) -> Image.Image:
    with Image.open(io.BytesIO(image_png)) as image:
        return image.convert("RGB")


def _check_items(items_df: pd.DataFrame) -> None:
    missing = [c for c in ITEM_FIELDS if c not in items_df.columns]
    if missing:
        raise ValueError(f"items_df is missing columns {missing}; need {list(ITEM_FIELDS)}")
    if items_df["item_id"].duplicated().any():
        raise ValueError("items_df has repeated item_id values; one row per item is needed")


def ok_annotations(annotations_df: pd.DataFrame) -> pd.DataFrame:
    """The ``status == "ok"`` rows: failed annotations have no scores to learn or compare."""
    missing = [c for c in ("item_id", "status", "overall") if c not in annotations_df.columns]
    if missing:
        raise ValueError(f"annotations_df is missing columns {missing}")
    return annotations_df[annotations_df["status"] == "ok"]


# --- train / unseen items -----------------------------------------------------------------------


def split_items(item_ids: Sequence[Any], unseen_fraction: float, seed: int) -> pd.DataFrame:
    """Seeded split of the catalogue into the items the ExpModel trains on and unseen ones.

    SFT and PFT read only ``TRAIN`` items (``items_in_split``, ``pairs_within``); the
    evaluation measures ``s_exp`` on the ``UNSEEN`` ones, which no training step has seen
    (issue 15, section 2): what s_exp is for is scoring items nobody annotated or paired.

    >>> split_items([10, 11, 12, 13], 0.5, seed=0)["split"].value_counts().to_dict()
    {'train': 2, 'unseen': 2}

    Returns:
        ``ITEM_SPLIT_COLUMNS`` (``item_id``, ``split``) in ``item_ids`` order, exactly
        ``round(unseen_fraction * n)`` of them ``UNSEEN``.

    Raises:
        ValueError: a fraction outside [0, 1), repeated ids, or no training item left.
    """
    ids = list(item_ids)
    if type(unseen_fraction) not in (int, float) or not 0 <= unseen_fraction < 1:
        raise ValueError(f"unseen_fraction must lie in [0, 1), got {unseen_fraction!r}")
    if len(set(ids)) != len(ids):
        raise ValueError("item_ids has repeats; one row per item is needed")
    n_unseen = round(unseen_fraction * len(ids))
    if ids and n_unseen == len(ids):
        raise ValueError(f"unseen_fraction {unseen_fraction} leaves no training item; lower it")
    unseen = np.zeros(len(ids), dtype=bool)
    unseen[np.random.default_rng(seed).permutation(len(ids))[:n_unseen]] = True
    return pd.DataFrame(
        {"item_id": ids, "split": np.where(unseen, UNSEEN, TRAIN)}, columns=list(ITEM_SPLIT_COLUMNS)
    )


def split_ids(item_split: pd.DataFrame, split: str) -> set[Any]:
    """The ids of ``item_split`` (``split_items`` output) in ``split`` (``TRAIN`` or ``UNSEEN``)."""
    if split not in (TRAIN, UNSEEN):
        raise ValueError(f"unknown split {split!r}; valid: {TRAIN}, {UNSEEN}")
    missing = [c for c in ITEM_SPLIT_COLUMNS if c not in item_split.columns]
    if missing:
        raise ValueError(f"item_split is missing columns {missing}; build it with split_items")
    return set(item_split.loc[item_split["split"] == split, "item_id"])


def items_in_split(items_df: pd.DataFrame, item_split: pd.DataFrame, split: str) -> pd.DataFrame:
    """The rows of ``items_df`` whose item is in ``split`` of ``item_split``."""
    return items_df[items_df["item_id"].isin(split_ids(item_split, split))]


def pairs_within(pairs_df: pd.DataFrame, item_ids: set[Any]) -> pd.DataFrame:
    """The pairs whose two items are both in ``item_ids`` (a mixed pair would leak the other
    side into training, or train on it in an evaluation)."""
    inside = pairs_df["pos_item"].isin(item_ids) & pairs_df["neg_item"].isin(item_ids)
    return pairs_df[inside].reset_index(drop=True)


# --- stage I: SFT -------------------------------------------------------------------------------


@dataclass(frozen=True)
class VLExample:
    """One SFT example, unpadded: ``input_ids``, ``labels`` and ``mm_token_type_ids`` are
    ``T_i`` long; ``pixel_values`` ``(N_i, D)`` and ``image_grid_thw`` ``(1, 3)`` are the
    processor's for this item's image."""

    item_id: Any
    input_ids: list[int]
    labels: list[int]
    mm_token_type_ids: list[int]
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor


def expmodel_sft_examples(
    processor: Any,
    items_df: pd.DataFrame,
    annotations_df: pd.DataFrame,
    max_length: int | None = None,
) -> list[VLExample]:
    """SFT examples of every item with an ``ok`` annotation, in ``items_df`` order; with
    annotations per (query, item), one example per annotated pair whose item is in
    ``items_df`` (items in ``items_df`` order, each item's queries in annotation order), the
    query closing its prompt.

    Each example is the chat-formatted prompt (image placeholder expanded to its image tokens,
    then the text, then the assistant header) followed by ``expmodel_target`` + eos. Labels are
    ``IGNORE_INDEX`` on the whole prompt (image tokens included), so the loss covers exactly the
    target tokens and the eos (SPEC 3.2: "loss on the analysis tokens only").

    Args:
        processor: a Qwen2.5-VL processor (``build_tiny_processor`` or a checkpoint's).
        items_df: ``item_id, category, title, image_png`` (other columns are not read).
        annotations_df: annotator output (``ANNOTATION_COLUMNS``); failed rows and items
            without an annotation are skipped.
        max_length: cap on ``T_i``; the target is cut from the right (its eos first). The
            prompt is never cut (its image tokens must match the pixels).

    Raises:
        ValueError: no example is left, or a prompt alone reaches ``max_length``.
    """
    _check_items(items_df)
    annotations = _annotated_units(items_df, annotations_df)
    n_skipped = len(items_df) - annotations["item_id"].nunique()
    if n_skipped:
        logger.info("SFT skips %d items without an ok annotation", n_skipped)
    if annotations.empty:
        raise ValueError("no item has an ok annotation: nothing to fine-tune on")
    items = items_df.set_index("item_id", drop=False)
    tokenizer = processor.tokenizer
    examples = []
    for annotation in annotations.to_dict("records"):
        item = items.loc[annotation["item_id"]]
        query = annotation.get(QUERY_COLUMN)
        prompt = vl_prompt_inputs(
            processor,
            [expmodel_prompt(item["category"], item["title"], query)],
            [_decode_image(item["image_png"])],
        )
        prompt_ids = prompt["input_ids"][0].tolist()
        if max_length is not None and len(prompt_ids) >= max_length:
            # No labelled token would be left: the mean NLL would be 0/0.
            raise ValueError(
                f"item {item.item_id}: the prompt alone has {len(prompt_ids)} tokens, so "
                f"max_length={max_length} leaves no target token; raise max_length"
            )
        target = expmodel_target(annotation)
        target_ids = tokenizer(target, add_special_tokens=False)["input_ids"]
        target_ids = target_ids + [tokenizer.eos_token_id]
        if max_length is not None:
            target_ids = target_ids[: max_length - len(prompt_ids)]
        examples.append(
            VLExample(
                item_id=item.item_id,
                input_ids=prompt_ids + target_ids,
                labels=[IGNORE_INDEX] * len(prompt_ids) + target_ids,
                mm_token_type_ids=prompt["mm_token_type_ids"][0].tolist() + [0] * len(target_ids),
                pixel_values=prompt["pixel_values"],
                image_grid_thw=prompt["image_grid_thw"],
            )
        )
    return examples


def _annotated_units(items_df: pd.DataFrame, annotations_df: pd.DataFrame) -> pd.DataFrame:
    """The ok annotations of ``items_df``'s items, one per item (or per (query, item)), in
    ``items_df`` order."""
    keys = [QUERY_COLUMN, "item_id"] if is_per_query(annotations_df) else ["item_id"]
    ok = ok_annotations(annotations_df).drop_duplicates(keys)
    rank = pd.Series(np.arange(len(items_df)), index=items_df["item_id"].to_numpy())
    ok = ok[ok["item_id"].isin(rank.index)]
    order = np.argsort(rank.loc[ok["item_id"]].to_numpy(), kind="stable")
    return ok.iloc[order].reset_index(drop=True)


def expmodel_prompts(items_df: pd.DataFrame, annotations_df: pd.DataFrame) -> list[str]:
    """The prompt texts of the SFT examples (``expmodel_sft_examples`` order): what the
    ExpModel's tokenizer is trained on beside the targets."""
    fields = items_df.set_index("item_id")[["category", "title"]]
    units = _annotated_units(items_df, annotations_df)
    queries = units[QUERY_COLUMN] if is_per_query(units) else [None] * len(units)
    return [
        expmodel_prompt(*fields.loc[item], query)
        for item, query in zip(units["item_id"], queries, strict=True)
    ]


def collate_expmodel_sft(examples: Sequence[VLExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch: ``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``labels``
    ``(B, T)`` (pad: ``pad_id`` / 0 / 0 / ``IGNORE_INDEX``), ``pixel_values`` ``(N, D)`` (the
    examples' patches in batch order) and ``image_grid_thw`` ``(B, 3)``.

    Right padding is safe for the 3D rope positions: ``get_rope_index`` drops masked tokens
    before it numbers the rest, so a row's positions do not depend on its padding.
    """
    if not examples:
        raise ValueError("need at least one example")
    width = max(len(e.input_ids) for e in examples)
    batch_size = len(examples)
    input_ids = torch.full((batch_size, width), pad_id, dtype=torch.long)
    labels = torch.full((batch_size, width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, width), dtype=torch.long)
    mm_token_type_ids = torch.zeros((batch_size, width), dtype=torch.long)
    for row, example in enumerate(examples):
        length = len(example.input_ids)
        input_ids[row, :length] = torch.tensor(example.input_ids)
        labels[row, :length] = torch.tensor(example.labels)
        attention_mask[row, :length] = 1
        mm_token_type_ids[row, :length] = torch.tensor(example.mm_token_type_ids)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "mm_token_type_ids": mm_token_type_ids,
        "labels": labels,
        "pixel_values": torch.cat([e.pixel_values for e in examples]),  # (N, D)
        "image_grid_thw": torch.cat([e.image_grid_thw for e in examples]),  # (B, 3)
    }


def expmodel_sft_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token NLL over the tokens whose label is not ``IGNORE_INDEX``."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs, use_cache=False).logits  # (B, T, V)
    shift_logits = logits[:, :-1].float()  # (B, T-1, V): position t predicts token t+1
    shift_labels = batch["labels"][:, 1:]  # (B, T-1)
    return F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]),
        shift_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
    )


def train_expmodel_sft(
    model: torch.nn.Module,
    processor: Any,
    items_df: pd.DataFrame,
    annotations_df: pd.DataFrame,
    *,
    training: SupervisedConfig,
    max_length: int | None = 1024,
    checkpoints: CheckpointStore | None = None,
    progress: bool = True,
) -> tuple[torch.nn.Module, list[dict[str, float]]]:
    """SPEC 3.2: fine-tune the VL ``model`` in place to write each item's annotation.

    ``training``: steps, items per step, AdamW and clipping (the chain's settings:
    ``EXPMODEL_TRAINING``); examples are drawn in a seeded order, reshuffled every epoch
    (``EpochSampler``). ``max_length``: as in ``expmodel_sft_examples``. ``checkpoints``: a
    store to resume from and save to every ``training.checkpoint_every`` steps and at the end;
    the run goes into a subdirectory keyed by the starting weights, the examples and
    ``training``, so only the very same run resumes (a finished one is just loaded).

    Returns:
        ``(model, history)``: the model in eval mode and one row per step with ``step``,
        ``sft/loss``, ``sft/target_tokens`` (labelled tokens in the batch) and ``lr``.
    """
    examples = expmodel_sft_examples(processor, items_df, annotations_df, max_length)
    device = next(model.parameters()).device
    pad_id = processor.tokenizer.pad_token_id

    def batch_fn(rows: list[int]) -> dict[str, torch.Tensor]:
        batch = collate_expmodel_sft([examples[i] for i in rows], pad_id)
        return {k: v.to(device) for k, v in batch.items()}

    def loss_fn(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        loss = expmodel_sft_loss(model, batch)
        target_tokens = float((batch["labels"] != IGNORE_INDEX).sum())
        return loss, {"sft/loss": loss.item(), "sft/target_tokens": target_tokens}

    store = run_store(
        checkpoints,
        model,
        training.run_key(),
        [[e.input_ids, e.labels, content_digest(e.pixel_values)] for e in examples],
    )
    history = SupervisedTrainer(
        model,
        len(examples),
        batch_fn,
        loss_fn,
        training,
        store,
        desc="ExpModel SFT",
        progress=progress,
    ).train()
    logger.info(
        "ExpModel SFT: %d steps on %d items, final loss %.4f",
        training.steps,
        len(examples),
        history[-1]["sft/loss"],
    )
    return model.eval(), history


# --- stage II: preference pairs and PFT ---------------------------------------------------------


def preference_pairs(
    sessions_df: pd.DataFrame,
    annotations_df: pd.DataFrame,
    margin: float = 1.0,
    bands: Sequence[str] = ("tail",),
    max_pairs: int | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """SPEC 3.3: ordered pairs (A > B) of candidates under long-tail queries.

    Within each session whose ``query_frequency_band`` is in ``bands``, every ordered pair of
    candidates with ok annotations and ``overall(A) - overall(B) >= margin`` is a pair
    ``(pos_item=A, neg_item=B)``. A pair met in several sessions is kept once, with its first
    ``session_id``. Above ``max_pairs`` a seeded uniform sample is kept.

    With annotations per (query, item) (a ``QUERY_COLUMN``), ``overall`` is the session's
    query's annotation of each candidate, so A > B holds *for that query*: the pairs carry the
    query, and the same two items may pair one way under one query and the other way (or not at
    all) under another. A pair is then kept once per query.

    Args:
        sessions_df: ``generate_sessions`` frame (reads ``session_id``,
            ``query_frequency_band``, ``candidates``, and ``query_text`` for per-query
            annotations).
        annotations_df: annotator output, per item or per (query, item); failed rows are
            ignored.
        margin: least gap of annotated ``overall`` (1-5 scale), > 0 so ties never pair.
        bands: which query bands to take pairs from, a subset of ``FREQUENCY_BANDS``.
        max_pairs: cap on the number of pairs (None: all).
        seed: seed of the sample.

    Returns:
        ``PAIR_COLUMNS`` (``pos_item, neg_item, session_id``; ``QUERY_COLUMN`` first with
        per-query annotations), sorted by session, then ``pos_item``, then ``neg_item``.
    """
    unknown = sorted(set(bands) - set(FREQUENCY_BANDS))
    if unknown or not bands:
        raise ValueError(f"unknown bands {unknown or list(bands)}; valid: {list(FREQUENCY_BANDS)}")
    if not margin > 0:
        raise ValueError(f"margin must be > 0 (0 would pair ties both ways), got {margin}")
    if max_pairs is not None and max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1 or None, got {max_pairs}")
    per_query = is_per_query(annotations_df)
    if per_query and QUERY_COLUMN not in sessions_df.columns:
        raise ValueError(f"per-query annotations need sessions with {QUERY_COLUMN!r}")
    keys = [QUERY_COLUMN, "item_id"] if per_query else ["item_id"]
    ok = ok_annotations(annotations_df).drop_duplicates(keys)
    # (query, item) -> overall; the query is None for per-item annotations.
    queries = ok[QUERY_COLUMN] if per_query else [None] * len(ok)
    overall = dict(zip(zip(queries, ok["item_id"], strict=True), ok["overall"], strict=True))
    selected = sessions_df[sessions_df["query_frequency_band"].isin(bands)]
    seen: set[tuple[Any, Any, Any]] = set()
    rows = []
    for session in selected.sort_values("session_id").to_dict("records"):
        query = session[QUERY_COLUMN] if per_query else None
        candidates = [c for c in dict.fromkeys(session["candidates"]) if (query, c) in overall]
        scores = np.array([overall[query, c] for c in candidates], dtype=np.float64)  # (L',)
        better = scores[:, None] - scores[None, :] >= margin - _MARGIN_TOLERANCE  # (L', L')
        for i, j in zip(*np.nonzero(better), strict=True):
            pair = (query, candidates[i], candidates[j])
            if pair not in seen:
                seen.add(pair)
                rows.append((*pair, session["session_id"]))
    columns = [QUERY_COLUMN, *PAIR_COLUMNS]
    pairs = pd.DataFrame(rows, columns=columns)
    if not per_query:
        pairs = pairs.drop(columns=QUERY_COLUMN)
    if max_pairs is not None and len(pairs) > max_pairs:
        keep = np.random.default_rng(seed).choice(len(pairs), size=max_pairs, replace=False)
        pairs = pairs.iloc[np.sort(keep)]
    return pairs.sort_values(["session_id", "pos_item", "neg_item"]).reset_index(drop=True)


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


@dataclass(frozen=True)
class PFTOptions:
    """What PFT trains on and how, beside its ``SupervisedConfig``.

    lam: weight of the centring term ``mean((s+ + s-)^2)`` (>= 0).
    heldout_fraction: share held out, in [0, 1); 0 gives no held-out metric.
    heldout_split: what ``heldout_fraction`` is a share of (``HELDOUT_SPLITS``): ``"items"``
        holds out items and evaluates on pairs of two unseen items, dropping pairs that mix the
        two sides; this measures what ``s_exp`` is for, scoring items without pairs.
        ``"pairs"`` holds out pairs; their items are mostly trained on through other pairs, so
        it mostly measures how well the scores of seen items fit.
    train_backbone: True trains every parameter; False only the head, the last decoder layer
        and the final norm (``ExpScorer.parameters_to_train``), which skips the backward pass
        through the vision tower: the fast option for smoke runs.
    """

    lam: float = 0.01
    heldout_fraction: float = 0.2
    heldout_split: str = "items"
    train_backbone: bool = True

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> PFTOptions:
        """The options of a ``parameters_*.yml`` block; ConfigError on an unknown key."""
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise ConfigError(f"unknown PFT option(s) {unknown}; valid keys are {valid}")
        return cls(**params)

    def __post_init__(self) -> None:
        if type(self.lam) not in (int, float) or self.lam < 0:
            raise ConfigError(f"lam must be a number >= 0, got {self.lam!r}")
        if type(self.heldout_fraction) not in (int, float) or not 0 <= self.heldout_fraction < 1:
            raise ConfigError(f"heldout_fraction must lie in [0, 1), got {self.heldout_fraction!r}")
        if self.heldout_split not in HELDOUT_SPLITS:
            raise ConfigError(
                f"unknown heldout_split {self.heldout_split!r}; valid: "
                f"{', '.join(sorted(HELDOUT_SPLITS))}"
            )
        if not isinstance(self.train_backbone, bool):
            raise ConfigError(f"train_backbone must be true or false, got {self.train_backbone!r}")


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
    """SPEC 3.3: train ``scorer`` in place on ordered pairs with ``pairwise_preference_loss``.

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
    """SPEC 3.3 loss of one batch whose first half of rows are the preferred items: ``inputs``
    are the scorer's (any backbone: the VL ExpModel's, or a text one's ``input_ids`` and
    ``attention_mask``, ``training.text_expmodel``), ``(2b, P)`` each."""
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


def split_pairs(
    pairs_df: pd.DataFrame,
    heldout_fraction: float,
    seed: int,
    heldout_split: str = "items",
    known_items: Sequence[Any] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(train_pairs, heldout_pairs)`` of ``pairs_df`` by ``HELDOUT_SPLITS[heldout_split]``.

    Raises:
        ValueError: an unknown split, a fraction outside [0, 1), missing columns, items not
            in ``known_items`` (when given) or no training pair left.
    """
    if heldout_split not in HELDOUT_SPLITS:
        raise ValueError(
            f"unknown heldout_split {heldout_split!r}; valid: {', '.join(sorted(HELDOUT_SPLITS))}"
        )
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must lie in [0, 1), got {heldout_fraction}")
    missing = [c for c in ("pos_item", "neg_item") if c not in pairs_df.columns]
    if missing:
        raise ValueError(f"pairs_df is missing columns {missing}; build it with preference_pairs")
    if known_items is not None:
        named = set(pairs_df["pos_item"]) | set(pairs_df["neg_item"])
        unknown = sorted(named - set(known_items))
        if unknown:
            raise ValueError(f"pairs_df names items missing from items_df: {unknown[:10]}")
    train_rows, heldout_rows = HELDOUT_SPLITS[heldout_split](
        pairs_df, heldout_fraction, np.random.default_rng(seed)
    )
    train_pairs = pairs_df.iloc[np.sort(train_rows)].reset_index(drop=True)
    heldout_pairs = pairs_df.iloc[np.sort(heldout_rows)].reset_index(drop=True)
    if train_pairs.empty:
        raise ValueError(f"no training pair left of {len(pairs_df)}: lower heldout_fraction")
    return train_pairs, heldout_pairs


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


def pair_units(pairs_df: pd.DataFrame) -> pd.DataFrame:
    """``QUERY_COLUMN, item_id``: the distinct (query, item) of per-query pairs, both sides."""
    sides = [
        pairs_df[[QUERY_COLUMN, side]].set_axis([QUERY_COLUMN, "item_id"], axis=1)
        for side in ("pos_item", "neg_item")
    ]
    return pd.concat(sides).drop_duplicates().reset_index(drop=True)


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


# --- helpers ------------------------------------------------------------------------------------


def _queries_of(pairs_df: pd.DataFrame) -> list[Any]:
    """The query of each pair (None for per-item pairs)."""
    if is_per_query(pairs_df):
        return pairs_df[QUERY_COLUMN].tolist()
    return [None] * len(pairs_df)


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


def _split_by_pairs(
    pairs_df: pd.DataFrame, heldout_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``round(heldout_fraction * n)`` random pairs held out; their items may also be trained on."""
    permutation = rng.permutation(len(pairs_df))
    n_heldout = round(heldout_fraction * len(pairs_df))
    return permutation[n_heldout:], permutation[:n_heldout]


def _split_by_items(
    pairs_df: pd.DataFrame, heldout_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``round(heldout_fraction * n_items)`` random items held out: a pair of two held-out items
    is held out, a pair of two others trains, a mixed pair is dropped (it would leak)."""
    items = pd.unique(pairs_df[["pos_item", "neg_item"]].to_numpy().ravel())
    n_heldout = round(heldout_fraction * len(items))
    heldout_items = set(items[rng.permutation(len(items))[:n_heldout]].tolist())
    pos_out = pairs_df["pos_item"].isin(heldout_items).to_numpy()
    neg_out = pairs_df["neg_item"].isin(heldout_items).to_numpy()
    return np.flatnonzero(~pos_out & ~neg_out), np.flatnonzero(pos_out & neg_out)


# How train_expmodel_pft holds pairs out: name -> (pairs, fraction, rng) -> (train, held-out) rows.
HELDOUT_SPLITS = {"items": _split_by_items, "pairs": _split_by_pairs}


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


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
