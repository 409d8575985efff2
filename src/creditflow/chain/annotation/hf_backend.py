"""Local VLM annotator through transformers (docs/methods/experience.md, step 1): the paper's Qwen2.5-VL annotator in-process.

Each item is one user turn of a Qwen2.5-VL-style model: the cover image, then the OpenAI
backend's prompt (title, category and the schema instructions; ``DEFAULT_PROMPT_TEMPLATE``),
so both backends ask the same question. Output is parsed with
:func:`creditflow.chain.annotation.schema.parse_annotation`.

Decoding: the first attempt is greedy, so an annotation is a deterministic function of the item
and the model. An item whose output does not parse is retried up to ``max_retries`` times with
temperature sampling (greedy would only repeat itself); retry ``k`` of a batch samples under
``torch.manual_seed`` of a seed derived from ``(seed, batch index, k)`` inside ``fork_rng``, so
a run is reproducible for a given ``seed`` and ``batch_size`` and the caller's global RNG is left
as it was. An item that never parses gets
``status == "failed"`` with its last raw output and no scores; an undecodable cover or a
generation error fails its items the same way. Nothing is invented and nothing raises per item.

Vision markers are suppressed during generation (``vision_token_ids``): an untrained or small
model may emit ``<|image_pad|>``, which means nothing in an answer.

The model is loaded on the first ``annotate`` call, not in the constructor, so building the
annotator from a config (``build_annotator("hf", ...)``) costs nothing; an id that is neither a
local directory nor in the Hugging Face cache then fails with what to download.

Cache and resume: every valid annotation goes to the on-disk cache
(:mod:`creditflow.chain.annotation.cache`, on by default) as soon as its batch is done, keyed by the
cover, title, prompt, the model and the decoding settings; a rerun, or a run resumed after a
crash, generates only for the items not in it (and loads no model when none is missing).
Failures are not cached. The model's part of the key is its ``spec`` (plus the names, sizes and
modification times of a local checkpoint directory's files) or, for a passed model, a hash of
its weights; a passed ``processor`` adds its tokenizer's. The sampled retries of a resumed run
draw other seeds than an uninterrupted run would (the seeds follow the batches, and only the
missing items are batched); the greedy first attempt does not depend on them.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from PIL import Image
from tqdm.auto import tqdm
from transformers import GenerationConfig

from creditflow.chain.annotation.cache import DEFAULT_CACHE_DIR, AnnotationCache, open_cache
from creditflow.chain.annotation.openai_backend import DEFAULT_PROMPT_TEMPLATE
from creditflow.chain.annotation.options import HFOptions
from creditflow.chain.annotation.schema import (
    SCHEMA_DESCRIPTION,
    annotations_frame,
    failed_row,
    item_query,
    ok_row,
    parse_annotation,
    query_prompt,
    visible_items,
)
from creditflow.errors import AnnotationParseError
from creditflow.models.loading import load_policy
from creditflow.models.vision import vision_token_ids, vl_prompt_inputs
from creditflow.training.checkpoint import tokenizer_digest

logger = logging.getLogger(__name__)


class HFAnnotator:
    """Annotate items with a local vision-language model (see module docstring).

    Exactly one model source: ``model_name_or_path`` (a Qwen2.5-VL-style hub id or checkpoint
    directory, loaded with ``dtype: auto``), ``spec`` (a ``load_policy`` dict, e.g.
    ``{"source": "pretrained", "name_or_path": ..., "dtype": "bfloat16"}``) or ``model`` with
    its ``processor`` (already built, e.g. the tiny test model).

    Args:
        model_name_or_path: hub id or local directory of the annotating model.
        spec: ``load_policy`` configuration.
        max_new_tokens: generation budget per attempt (>= 1).
        batch_size: items per ``generate`` call (>= 1).
        max_retries: sampled attempts after the greedy one for unparsable output (>= 0); an
            item takes at most ``max_retries + 1`` attempts.
        seed: seeds the sampled retries.
        model: a loaded model with ``generate`` (needs ``processor``).
        processor: the model's processor; with ``spec`` or ``model_name_or_path`` it replaces
            the checkpoint's own (``source: tiny`` needs it).
        prompt_template: text with the placeholders ``{title}``, ``{category}`` and
            ``{schema}``, as in ``OpenAIAnnotator``.
        retry_temperature: sampling temperature of the retries (> 0).
        device: where a loaded model runs; CUDA when available, else CPU, when None. A passed
            ``model`` stays where it is.
        progress: show a progress bar over batches (on by default; a local VLM is slow).
        cache_dir: folder of cached annotations (module docstring); None switches it off.
    """

    def __init__(
        self,
        model_name_or_path: str | os.PathLike | None = None,
        spec: Mapping[str, Any] | None = None,
        max_new_tokens: int = 256,
        batch_size: int = 4,
        max_retries: int = 1,
        seed: int = 0,
        model: Any = None,
        processor: Any = None,
        *,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        retry_temperature: float = 1.0,
        device: str | None = None,
        progress: bool = True,
        cache_dir: str | os.PathLike | None = DEFAULT_CACHE_DIR,
    ) -> None:
        # The checks live with the options (annotation.options), where the parameter check
        # runs them without torch.
        HFOptions(
            model_name_or_path,
            spec,
            max_new_tokens,
            batch_size,
            max_retries,
            seed,
            model,
            processor,
            prompt_template=prompt_template,
            retry_temperature=retry_temperature,
            device=device,
            progress=progress,
            cache_dir=cache_dir,
        )
        if model_name_or_path is not None:
            spec = {
                "source": "pretrained",
                "name_or_path": os.fspath(model_name_or_path),
                "dtype": "auto",
            }
        self.spec = dict(spec) if spec is not None else None
        self.model = model  # None until the first annotate() when loaded from spec
        self.processor = processor
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.seed = seed
        self.prompt_template = prompt_template
        self.retry_temperature = float(retry_temperature)
        self.device = device
        self.progress = progress
        self.cache = open_cache(cache_dir)
        self._processor_given = processor is not None
        self._model_key: str | None = None  # computed on the first annotate() with a cache

    @property
    def name(self) -> str:
        """The model's name for logs: its checkpoint or the passed model's class."""
        if self.spec is not None:
            return str(self.spec.get("name_or_path", self.spec.get("source")))
        return type(self.model).__name__

    def prompt(self, title: str, category: str, query: str | None = None) -> str:
        """The text part of an item's turn (the image comes first), judged for ``query`` when
        given."""
        text = self.prompt_template.format(
            title=title, category=category, schema=SCHEMA_DESCRIPTION
        )
        return query_prompt(text, query)

    def _item_prompt(self, item: Mapping[str, Any]) -> str:
        return self.prompt(item["title"], item["category"], item_query(item))

    def annotate(self, items: pd.DataFrame) -> pd.DataFrame:
        """Annotate every item not in the cache, loading the model first if any is missing.

        Args:
            items: frame with at least ``ITEM_COLUMNS``, and optionally ``QUERY_COLUMN`` (each
                row then judged for its query, ``schema.QUERY_PROMPT``); other columns are
                dropped unread.

        Returns:
            One row per item, in input order, with ``ANNOTATION_COLUMNS`` (and the query). ``attempts`` counts
            the generations of the item in this call (0 when served from the cache or when its
            cover could not be decoded).

        Raises:
            OSError: the checkpoint is neither a local directory nor cached (offline).
            ValueError: an invalid ``spec``.
        """
        records = visible_items(items).to_dict("records")
        rows: list[dict[str, Any] | None] = [None] * len(records)
        keys = [self.cache_key(record) for record in records] if self.cache else []
        missing = []
        for i, record in enumerate(records):
            cached = self.cache.get(keys[i]) if self.cache else None
            if cached is None:
                missing.append(i)
            else:
                rows[i] = ok_row(
                    record["item_id"], parse_annotation(cached), cached, 0, item_query(record)
                )
        if missing:
            self._load()
        todo = [records[i] for i in missing]
        batches = range(0, len(todo), self.batch_size)
        for batch_index, start in enumerate(
            tqdm(batches, desc="annotate", disable=not self.progress)
        ):
            batch = todo[start : start + self.batch_size]
            for offset, row in enumerate(self._annotate_batch(batch, batch_index)):
                i = missing[start + offset]
                rows[i] = row
                if self.cache and row["status"] == "ok":
                    self.cache.put(keys[i], row["raw_text"], self.name)
        frame = annotations_frame(rows)
        logger.info(
            "annotated %d items with %s: %d from cache, %d failed",
            len(frame),
            self.name,
            len(records) - len(missing),
            int((frame["status"] == "failed").sum()),
        )
        return frame

    def cache_key(self, item: Mapping[str, Any]) -> str:
        """The cache key of an item: cover, title, prompt, model and decoding settings."""
        prompt = self._item_prompt(item)
        return AnnotationCache.key(item["image_png"], item["title"], prompt, self._model_part())

    def _model_part(self) -> str:
        """The model's and the decoding settings' part of every cache key (module docstring)."""
        if self._model_key is None:
            parts: dict[str, Any] = {
                "max_new_tokens": self.max_new_tokens,
                "max_retries": self.max_retries,
                "retry_temperature": self.retry_temperature,
                "seed": self.seed,
            }
            if self.spec is not None:
                parts["spec"] = self.spec
                parts["files"] = _directory_listing(self.spec.get("name_or_path"))
            else:
                parts["weights"] = _weights_digest(self.model)
            if self._processor_given:
                parts["tokenizer"] = tokenizer_digest(self.processor.tokenizer)
            self._model_key = json.dumps(parts, sort_keys=True, default=str)
        return self._model_key

    # ------------------------------------------------------------------ internals
    def _load(self) -> None:
        if self.model is None:
            model, self.processor = load_policy(self.spec, processing_class=self.processor)
            device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
            self.model = model.to(device)
        tokenizer = self.processor.tokenizer
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self._eos_ids = [eos] if isinstance(eos, int) else list(eos)
        self._vision_ids = vision_token_ids(tokenizer)

    def _annotate_batch(self, batch: list[dict[str, Any]], batch_index: int) -> list[dict]:
        """Rows of one batch: greedy attempt, then sampled retries of the unparsable items."""
        rows: list[dict[str, Any] | None] = [None] * len(batch)
        images: dict[int, Image.Image] = {}
        for i, item in enumerate(batch):
            try:
                images[i] = _decode_image(item["image_png"])
            except Exception as exc:  # bytes PIL cannot read, None, ...: this item only
                error = f"cover image unreadable: {exc!r}"
                rows[i] = failed_row(item["item_id"], None, 0, error, item_query(item))
        pending = sorted(images)
        raw_text: dict[int, str] = {}
        errors: dict[int, str] = {}
        for attempt in range(self.max_retries + 1):
            if not pending:
                break
            try:
                texts = self._generate(
                    [self._item_prompt(batch[i]) for i in pending],
                    [images[i] for i in pending],
                    sample_seed=None if attempt == 0 else self._retry_seed(batch_index, attempt),
                )
            except Exception as exc:
                # A failing generate (out of memory, a broken input) fails this batch's
                # remaining items, not the run; the traceback goes to the log.
                logger.exception("batch %d attempt %d: generation failed", batch_index, attempt + 1)
                for i in pending:
                    rows[i] = failed_row(
                        batch[i]["item_id"],
                        raw_text.get(i),
                        attempt + 1,
                        f"generation failed: {exc!r}",
                        item_query(batch[i]),
                    )
                return rows
            still_pending = []
            for i, text in zip(pending, texts, strict=True):
                raw_text[i] = text
                try:
                    annotation = parse_annotation(text)
                except AnnotationParseError as exc:
                    errors[i] = f"unparsable output: {exc}"
                    still_pending.append(i)
                else:
                    query = item_query(batch[i])
                    rows[i] = ok_row(batch[i]["item_id"], annotation, text, attempt + 1, query)
            pending = still_pending
        for i in pending:
            rows[i] = failed_row(
                batch[i]["item_id"],
                raw_text[i],
                self.max_retries + 1,
                errors[i],
                item_query(batch[i]),
            )
        return rows

    def _retry_seed(self, batch_index: int, attempt: int) -> int:
        # SeedSequence mixes the three numbers, so nearby batches get unrelated streams.
        return int(np.random.SeedSequence([self.seed, batch_index, attempt]).generate_state(1)[0])

    @torch.no_grad()
    def _generate(
        self, prompts: Sequence[str], images: Sequence[Image.Image], sample_seed: int | None
    ) -> list[str]:
        """One text per prompt: greedy when ``sample_seed`` is None, else sampled under it."""
        device = next(self.model.parameters()).device
        inputs = vl_prompt_inputs(self.processor, prompts, images)
        inputs = {key: value.to(device) for key, value in inputs.items()}
        if sample_seed is None:
            options: dict[str, Any] = {"do_sample": False}
        else:
            # top_k=0 / top_p=1: plain temperature sampling; a checkpoint's top_k=1 would
            # turn every retry back into the greedy answer.
            options = {
                "do_sample": True,
                "temperature": self.retry_temperature,
                "top_k": 0,
                "top_p": 1.0,
            }
        # As in rollout.vision_policy: only the options set here apply, not whatever the
        # checkpoint's generation_config.json adds (repetition penalty, top-k ...).
        saved_config = self.model.generation_config
        self.model.generation_config = GenerationConfig()
        rng_devices = [device.index or 0] if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=rng_devices):
                if sample_seed is not None:
                    torch.manual_seed(sample_seed)
                output = self.model.generate(
                    **inputs,
                    max_new_tokens=self.max_new_tokens,
                    pad_token_id=self.processor.tokenizer.pad_token_id,
                    eos_token_id=self._eos_ids,
                    suppress_tokens=self._vision_ids,
                    **options,
                )
        finally:
            self.model.generation_config = saved_config
        completions = output[:, inputs["input_ids"].shape[1] :].tolist()  # (B, T)
        return [self._decode(ids) for ids in completions]

    def _decode(self, ids: list[int]) -> str:
        """Text of the tokens before the first eos (the padding after it is dropped)."""
        cut = next((t for t, token in enumerate(ids) if token in self._eos_ids), len(ids))
        return self.processor.tokenizer.decode(ids[:cut], skip_special_tokens=True)


def _decode_image(image_png: bytes) -> Image.Image:
    with Image.open(io.BytesIO(image_png)) as image:
        return image.convert("RGB")


def _directory_listing(name_or_path: Any) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of every file of a local checkpoint directory, so a
    checkpoint saved again under the same path is another model; [] for a hub id."""
    if not isinstance(name_or_path, str | os.PathLike) or not Path(name_or_path).is_dir():
        return []
    root = Path(name_or_path)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return [(str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def _weights_digest(model: Any) -> str:
    """sha256 of a passed model's parameters (shape, dtype and bytes of each, in order)."""
    digest = hashlib.sha256()
    for tensor in model.parameters():
        digest.update(f"{tuple(tensor.shape)}{tensor.dtype}".encode())
        data = tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        digest.update(data)
    return digest.hexdigest()
