"""Processor outputs of vision-language prompts, kept per prompt so a prompt seen again is not
processed again.

A VL SFT run shows every training problem to the processor once per epoch (the default tor
warm start: 8 epochs) and GRPO once per step it is drawn; the processor's image resizing,
normalising and patching and its tokenising took a quarter of a tiny policy's SFT step on CPU.
The processor is deterministic and encodes each row of a batch on its own, so the prompts not
yet kept are encoded in one call, split per prompt and kept (up to a byte budget, least
recently used out first), and a batch is its rows left-padded exactly as the processor pads a
batch: ``input_ids`` with the pad token, ``attention_mask`` and
``mm_token_type_ids`` with 0, and each row's image patches zero-padded to the batch's longest
(``vision_policy.per_row_pixel_values``'s layout).

Shape symbols: ``B`` prompts, ``P`` prompt tokens (left-padded), ``N`` patches of one image,
``D`` values per patch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch

from creditflow.rollout.kept import KeptByBytes, tensor_bytes

# The keys a Qwen2.5-VL processor returns for image prompts; a processor returning anything
# else is not cached (its extra inputs would need their own padding rule).
ENCODED_KEYS = frozenset(
    {"input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw"}
)
# The tor default's 8,000 problems at 112 px keep 2.4 GB (64 patches x 1,176 float32 each).
DEFAULT_MAX_BYTES = 3 * 2**30


def encoded_bytes(row: dict[str, torch.Tensor]) -> int:
    return tensor_bytes(row.values())


def left_padded_batch(
    rows: Sequence[dict[str, torch.Tensor]], pad_id: int
) -> dict[str, torch.Tensor]:
    """One batch from per-prompt encodings.

    Args:
        rows: ``B`` encodings of one prompt each: ``input_ids``, ``attention_mask``,
            ``mm_token_type_ids`` ``(1, P_b)``, ``pixel_values`` ``(N_b, D)`` and
            ``image_grid_thw`` ``(1, 3)``.
        pad_id: the tokenizer's pad token id.

    Returns:
        ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` ``(B, P)`` left-padded (P the
        longest ``P_b``), ``pixel_values`` ``(B, N_max, D)`` zero-padded per row and
        ``image_grid_thw`` ``(B, 3)``.
    """
    width = max(row["input_ids"].shape[1] for row in rows)
    fill = {"input_ids": pad_id, "attention_mask": 0, "mm_token_type_ids": 0}
    batch = {}
    for key, value in fill.items():
        out = torch.full((len(rows), width), value, dtype=rows[0][key].dtype)
        for b, row in enumerate(rows):
            tokens = row[key][0]
            out[b, width - len(tokens) :] = tokens
        batch[key] = out
    counts = [row["pixel_values"].shape[0] for row in rows]
    if len(set(counts)) == 1:  # pictures of one size (the tor default): nothing to pad
        pixels = torch.stack([row["pixel_values"] for row in rows])
    else:
        first = rows[0]["pixel_values"]
        pixels = torch.zeros(len(rows), max(counts), first.shape[-1], dtype=first.dtype)
        for b, row in enumerate(rows):
            pixels[b, : counts[b]] = row["pixel_values"]
    batch["pixel_values"] = pixels
    batch["image_grid_thw"] = torch.cat([row["image_grid_thw"] for row in rows])
    return batch


def split_rows(batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Per-prompt encodings from one left-padded processor batch: the inverse of
    ``left_padded_batch``.

    Args:
        batch: ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` ``(B, P)`` (left
            padding, mask 1 on real tokens), ``pixel_values`` ``(sum_b N_b, D)`` (the
            processor's flat layout) and ``image_grid_thw`` ``(B, 3)``.

    Returns:
        ``B`` encodings as one prompt alone gives them: ``(1, P_b)`` token rows, the row's
        ``(N_b, D)`` patches and its ``(1, 3)`` grid (copies, so a kept row holds no view of
        the whole batch).
    """
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    patches = torch.split(batch["pixel_values"], batch["image_grid_thw"].prod(dim=-1).tolist())
    rows = []
    for b, n in enumerate(lengths):
        row = {
            key: batch[key][b : b + 1, batch[key].shape[1] - n :].clone()
            for key in ("input_ids", "attention_mask", "mm_token_type_ids")
        }
        row["pixel_values"] = patches[b].clone()
        row["image_grid_thw"] = batch["image_grid_thw"][b : b + 1].clone()
        rows.append(row)
    return rows


class PromptEncodingCache:
    """Per-prompt encodings by key, the least recently used dropped beyond ``max_bytes``."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self._kept: KeptByBytes[dict[str, torch.Tensor]] = KeptByBytes(max_bytes, encoded_bytes)

    @property
    def max_bytes(self) -> int:
        return self._kept.max_bytes

    def __len__(self) -> int:
        return len(self._kept)

    def rows(
        self,
        keys: Sequence[Hashable],
        encode_batch: Callable[[list[int]], dict[str, torch.Tensor]],
    ) -> list[dict[str, torch.Tensor]] | None:
        """The encoding of each key. The prompts not kept go through ``encode_batch(indices)``
        (one processor call for them all, as uncached: a miss costs no more than before) and
        are split per prompt (``split_rows``); None when the processor returns keys other
        than ``ENCODED_KEYS`` (not cacheable)."""

        def encode_missing(indices: list[int]) -> list[dict[str, torch.Tensor]] | None:
            encoded = encode_batch(indices)
            return split_rows(encoded) if set(encoded) == ENCODED_KEYS else None

        return self._kept.lookup(keys, encode_missing)
