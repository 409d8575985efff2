"""ExpModel stage I (SFT): the vision-language model learns to write an item's annotation from its
cover and title; the loss counts the annotation tokens only."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from creditflow.chain.annotation import QUERY_COLUMN
from creditflow.chain.expmodel.data import (
    _check_items,
    _decode_image,
    expmodel_prompt,
    expmodel_target,
    is_per_query,
    ok_annotations,
)
from creditflow.models.vision import vl_prompt_inputs
from creditflow.training.checkpoint import CheckpointStore, content_digest, run_store
from creditflow.training.supervised import SupervisedConfig, SupervisedTrainer
from creditflow.training.teacher_forcing import IGNORE_INDEX

logger = logging.getLogger(__name__)


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
    target tokens and the eos (docs/methods/experience.md, step 2: "loss on the analysis tokens only").

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
    """docs/methods/experience.md, step 2: fine-tune the VL ``model`` in place to write each item's annotation.

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
