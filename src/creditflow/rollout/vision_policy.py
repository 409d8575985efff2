"""A GRPO policy around a Qwen2.5-VL-style vision-language model: ToR's policy (docs/methods/tor.md).

Shape symbols: ``B`` sequences, ``P`` prompt tokens (left-padded), ``T`` completion tokens
(right-padded), ``V`` vocabulary, ``N`` patches of one image (at most ``N_max`` in a batch),
``D`` values per patch (``C * temporal_patch_size * patch_size**2``).

Images travel with the batch in ``RolloutBatch.extras`` *per row*: the processor returns the
patches of all images concatenated, ``(sum_b N_b, D)``, which ``RolloutBatch.select`` could not
cut into minibatches; here each row keeps its own zero-padded ``(N_max, D)`` block and
``image_grid_thw`` says how many of its patches are real, so a row subset is a plain row
index, and the model's flat layout is rebuilt just before each forward (``flat_pixel_values``).

The forward over ``[prompt, completion]`` follows ``creditflow.models.vision``: it passes
``mm_token_type_ids`` and no ``position_ids``, so the model derives the same 3D rope positions
as ``generate`` did (see that module's docstring). As in ``LanguagePolicy`` it stops before the
output head, which is then applied a chunk of positions at a time.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from creditflow.models.vision import sequence_forward_inputs, vision_token_ids, vl_prompt_inputs
from creditflow.rollout.backends.base import FINISH_LENGTH, Generation, finish_reasons
from creditflow.rollout.backends.hf import HFBackend
from creditflow.rollout.backends.lean import LeanBackend, ScoreSettings
from creditflow.rollout.backends.lean_vl import generate_with_images
from creditflow.rollout.batch import RolloutBatch, SamplesOwnModule
from creditflow.rollout.language_policy import (
    SamplingSettings,
    completion_mask_from_eos,
    score_completions,
    stop_token_ids,
)
from creditflow.rollout.modules import output_head, output_head_inputs
from creditflow.rollout.prompt_cache import DEFAULT_MAX_BYTES as PROMPT_CACHE_BYTES
from creditflow.rollout.prompt_cache import PromptEncodingCache, left_padded_batch
from creditflow.rollout.shared_prefix import (
    prompt_runs,
    sequence_positions,
    shared_prefix_hidden,
)
from creditflow.rollout.vision_cache import DEFAULT_MAX_BYTES as VISION_CACHE_BYTES
from creditflow.rollout.vision_cache import FrozenVisionFeatures


@dataclass(frozen=True)
class VisualPrompt:
    """One user turn: an image, then ``text`` (Qwen2.5-VL's order)."""

    text: str
    image: Image.Image


def as_visual_prompt(prompt: Any) -> VisualPrompt:
    """A ``VisualPrompt`` from itself or a ``(text, image)`` pair, the image a PIL image or
    encoded bytes (e.g. a ``tor_*_tasks`` row's ``image_png``)."""
    if isinstance(prompt, VisualPrompt):
        return prompt
    if isinstance(prompt, tuple) and len(prompt) == 2 and isinstance(prompt[0], str):
        text, image = prompt
        if isinstance(image, (bytes, bytearray)):
            with Image.open(io.BytesIO(image)) as opened:
                image = opened.convert("RGB")
        if isinstance(image, Image.Image):
            return VisualPrompt(text, image)
    raise TypeError(
        "a vision-language prompt is a VisualPrompt or a (text, image) pair with a PIL image "
        f"or image bytes; got {type(prompt).__name__}"
    )


def prompt_key(prompt: Any) -> tuple:
    """What identifies ``prompt``'s processor output (``as_visual_prompt``'s forms): its text
    and its image's encoded bytes as given (not decoded: a kept prompt is never decoded
    again), else the image's mode, size and pixels."""
    if isinstance(prompt, tuple) and len(prompt) == 2 and isinstance(prompt[1], (bytes, bytearray)):
        return (prompt[0], bytes(prompt[1]))
    visual = as_visual_prompt(prompt)
    image = visual.image
    return (visual.text, image.mode, image.size, image.tobytes())


def flat_pixel_values(pixel_rows: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
    """The model's ``(sum_b N_b, D)`` patch layout from per-row blocks.

    Args:
        pixel_rows: ``(B, N_max, D)``, row ``b``'s first ``N_b`` patches real, the rest zeros.
        image_grid_thw: ``(B, 3)``; ``N_b = t * h * w`` of row ``b``.
    """
    counts = image_grid_thw.prod(dim=-1).tolist()
    if all(n == pixel_rows.shape[1] for n in counts):  # no padding: the same values, no copy
        return pixel_rows.reshape(-1, pixel_rows.shape[-1])
    return torch.cat([pixel_rows[b, :n] for b, n in enumerate(counts)], dim=0)


def per_row_pixel_values(pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
    """``(B, N_max, D)`` zero-padded blocks from the processor's ``(sum_b N_b, D)`` layout."""
    counts = image_grid_thw.prod(dim=-1).tolist()
    rows = torch.zeros(len(counts), max(counts), pixel_values.shape[-1], dtype=pixel_values.dtype)
    for b, chunk in enumerate(torch.split(pixel_values, counts)):
        rows[b, : len(chunk)] = chunk
    return rows


class VisionLanguagePolicy(SamplesOwnModule):
    """Samples and scores completions of a Qwen2.5-VL-style model for (image, text) prompts.

    Satisfies ``rollout.Policy``; prompts are anything ``as_visual_prompt`` accepts. Besides
    ``sample`` and ``completion_logprobs`` it offers ToR's ``no_image_logprobs`` and greedy
    decoding for evaluation.

    Args:
        model: e.g. ``Qwen2_5_VLForConditionalGeneration`` (``build_tiny_qwen2_5_vl``).
        processor: its processor (``build_tiny_processor`` or the checkpoint's); the
            tokenizer must have a pad token.
        sampling: generation settings; ``temperature`` also scales the recomputed logits.
        backend: ``hf`` (``model.generate``, the default and the reference) or ``lean``
            (``rollout.backends.lean_vl``); no other backend takes images.
        prompt_cache_bytes: budget of the kept processor outputs (``rollout.prompt_cache``);
            0 sends every prompt to the processor each time.
        vision_cache_bytes: budget of the frozen ViT's kept outputs
            (``rollout.vision_cache``); 0 runs the ViT in every forward.
    """

    def __init__(
        self,
        model,
        processor,
        sampling: SamplingSettings,
        backend: HFBackend | LeanBackend | None = None,
        prompt_cache_bytes: int = PROMPT_CACHE_BYTES,
        vision_cache_bytes: int = VISION_CACHE_BYTES,
    ):
        tokenizer = processor.tokenizer
        self.module = model
        self.processor = processor
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.eos_ids = stop_token_ids(model, tokenizer)
        # A sampled <|image_pad|> would make the recomputation forward fail (the model counts
        # image tokens against image features), so generation never emits vision markers.
        self.vision_ids = vision_token_ids(tokenizer)
        self.backend = backend if backend is not None else HFBackend()
        self._prompt_positions: dict[bytes, torch.Tensor] = {}  # sequence_rope_positions
        # encode_prompts: each prompt processed once (0 bytes: every time)
        self._encodings = PromptEncodingCache(prompt_cache_bytes)
        # A frozen ViT runs once per picture (rollout.vision_cache); 0 bytes: every time.
        self.vision_features = FrozenVisionFeatures(model, vision_cache_bytes)

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    # ------------------------------------------------------------------ inputs
    def encode_prompts(self, prompts: Sequence[Any]) -> dict[str, torch.Tensor]:
        """Left-padded prompt inputs, one row per prompt: ``input_ids``, ``attention_mask``,
        ``mm_token_type_ids`` ``(B, P)``, ``pixel_values`` ``(B, N_max, D)`` (per-row blocks)
        and ``image_grid_thw`` ``(B, 3)``. Each distinct prompt goes through the processor
        once (the new ones of a batch in one call) and is kept (``rollout.prompt_cache``: the same tensors as one batched
        processor call)."""

        def encode_batch(indices: list[int]) -> dict[str, torch.Tensor]:
            visual = [as_visual_prompt(prompts[i]) for i in indices]
            return vl_prompt_inputs(
                self.processor, [p.text for p in visual], [p.image for p in visual]
            )

        rows = None
        if self._encodings.max_bytes > 0:
            rows = self._encodings.rows([prompt_key(p) for p in prompts], encode_batch)
        if rows is not None:
            inputs = left_padded_batch(rows, self.tokenizer.pad_token_id)
        else:  # no budget, or a processor with inputs of its own: the whole batch, every time
            visual = [as_visual_prompt(p) for p in prompts]
            inputs = vl_prompt_inputs(
                self.processor, [p.text for p in visual], [p.image for p in visual]
            )
            inputs["pixel_values"] = per_row_pixel_values(
                inputs["pixel_values"], inputs["image_grid_thw"]
            )
        return {k: v.to(self.device) for k, v in inputs.items()}

    def _model_prompt_inputs(self, batch_like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-row prompt inputs in the model's layout (flat pixel values)."""
        return {
            "input_ids": batch_like["input_ids"],
            "attention_mask": batch_like["attention_mask"],
            "mm_token_type_ids": batch_like["mm_token_type_ids"],
            "pixel_values": flat_pixel_values(
                batch_like["pixel_values"], batch_like["image_grid_thw"]
            ),
            "image_grid_thw": batch_like["image_grid_thw"],
        }

    @staticmethod
    def _batch_prompt_inputs(batch: RolloutBatch) -> dict[str, torch.Tensor]:
        return {"input_ids": batch.prompt_ids, "attention_mask": batch.prompt_mask, **batch.extras}

    # ------------------------------------------------------------------ sampling
    @property
    def decodes_lean(self) -> bool:
        """Whether the ``lean`` decoder samples: each prompt and its image prefilled once per
        group, and the log-probs and entropy read off the logits it sampled from."""
        return isinstance(self.backend, LeanBackend)

    @torch.no_grad()
    def generate(
        self,
        inputs: dict[str, torch.Tensor],
        do_sample: bool,
        group_size: int = 1,
        scores: ScoreSettings | None = None,
    ) -> Generation:
        """The backend's ``Generation`` for the N prompts ``inputs`` (``encode_prompts``): G
        rows per prompt, consecutive, padded after the first EOS; sampled with
        ``self.sampling`` or greedy. ``hf`` repeats every prompt and its image G times;
        ``lean`` prefills each once and, given ``scores``, also returns each drawn token's
        log-prob and top-p entropy (``Generation.logp`` / ``entropy``)."""
        was_training = self.module.training
        self.module.eval()
        if not self.decodes_lean:
            inputs = {k: v.repeat_interleave(group_size, dim=0) for k, v in inputs.items()}
        model_inputs = self._model_prompt_inputs(inputs)
        request = self.sampling.request(
            model_inputs.pop("input_ids"),
            model_inputs.pop("attention_mask"),
            # hf: the rows are already repeated, each carrying its own image
            group_size=group_size if self.decodes_lean else 1,
            stop_ids=self.eos_ids,
            pad_id=self.tokenizer.pad_token_id,
            do_sample=do_sample,
            suppressed_ids=tuple(self.vision_ids),
        )
        try:
            with self.vision_features.installed():
                if self.decodes_lean:
                    return generate_with_images(
                        self.backend, self.module, request, model_inputs, scores
                    )
                return self.backend.generate(self.module, request, model_inputs)
        finally:
            self.module.train(was_training)

    @torch.no_grad()
    def sample(
        self,
        prompts: Sequence[Any],
        group_size: int,
        with_entropy: bool = False,
        with_logprobs: bool = True,
    ) -> RolloutBatch:
        """Draw ``group_size`` completions per prompt; rows of one prompt are consecutive, each
        with its own copy of the image. ``old_logp`` (and ``entropy`` when asked) come from the
        ``lean`` decoder's logits (float32 runs), else from one extra forward pass, exactly as
        ``completion_logprobs`` computes them (the two agree to float rounding)."""
        encoded = self.encode_prompts(prompts)
        scores = None
        # Under autocast (bf16) the decoder's logits and the scoring forward's differ by more
        # than float32 rounding (other kernels, other op order), and the loss compares
        # old_logp with the update's forward: there the scoring forward gives them.
        autocast = torch.is_autocast_enabled(self.device.type)
        if self.decodes_lean and (with_logprobs or with_entropy) and not autocast:
            top_p = self.sampling.entropy_top_p if with_entropy else None
            scores = ScoreSettings(self.sampling.temperature, top_p)
        generation = self.generate(encoded, do_sample=True, group_size=group_size, scores=scores)
        completion_ids = generation.completion_ids  # (B, T)
        rows = {k: v.repeat_interleave(group_size, dim=0) for k, v in encoded.items()}
        batch = RolloutBatch(
            prompt_ids=rows["input_ids"],
            prompt_mask=rows["attention_mask"],
            completion_ids=completion_ids,
            completion_mask=completion_mask_from_eos(completion_ids, self.eos_ids),
            old_logp=torch.empty(0),
            completion_texts=self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True),
            prompt_index=torch.arange(len(prompts)).repeat_interleave(group_size),
            group_size=group_size,
            extras={
                "mm_token_type_ids": rows["mm_token_type_ids"],  # (B, P)
                "pixel_values": rows["pixel_values"],  # (B, N_max, D)
                "image_grid_thw": rows["image_grid_thw"],  # (B, 3)
            },
            truncated=torch.tensor(
                [r == FINISH_LENGTH for r in finish_reasons(completion_ids, self.eos_ids)],
                dtype=torch.bool,
                device=completion_ids.device,
            ),
            pad_id=self.tokenizer.pad_token_id,
            prompt_extras=("mm_token_type_ids",),
        )
        if scores is not None:
            batch.old_logp = generation.logp  # (B, T)
            batch.entropy = generation.entropy if with_entropy else None
        # with_logprobs=False: the trainer will use the update's own log-probs (one optimizer
        # step per rollout), so the extra scoring forward is skipped.
        elif with_logprobs or with_entropy:
            batch.old_logp, batch.entropy = self.completion_logprobs(batch, with_entropy)
        return batch

    @torch.no_grad()
    def greedy(self, prompts: Sequence[Any]) -> list[str]:
        """Greedy decodes of ``prompts`` (one batch), special tokens removed."""
        generation = self.generate(self.encode_prompts(prompts), do_sample=False)
        return self.tokenizer.batch_decode(generation.completion_ids, skip_special_tokens=True)

    # ------------------------------------------------------------------ scoring
    def _forward_inputs(
        self, prompt_inputs: dict[str, torch.Tensor], batch: RolloutBatch
    ) -> dict[str, torch.Tensor]:
        """Inputs of one forward over ``[prompt, completion]`` keeping the T + 1 last positions."""
        inputs = sequence_forward_inputs(
            prompt_inputs, batch.completion_ids, batch.completion_mask
        )  # no position_ids: the model derives the 3D rope positions (models/vision.py)
        return {**inputs, "logits_to_keep": batch.completion_ids.shape[1] + 1, "use_cache": False}

    def _score(
        self, batch: RolloutBatch, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T) log-probs (and optionally top-p entropy) of the completions after their
        image prompts, the head applied a chunk of positions at a time. With
        ``SamplingSettings.shared_prefix`` each run of rows with one prompt and one image runs
        that prompt (and its image) once (``rollout.shared_prefix``)."""
        with self.vision_features.installed():
            return self._score_images(batch, with_entropy)

    def _score_images(
        self, batch: RolloutBatch, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        owner = rope_index_owner(self.module)
        if not self.sampling.shared_prefix or owner is None:
            prompt_inputs = self._model_prompt_inputs(self._batch_prompt_inputs(batch))
            inputs = self._forward_inputs(prompt_inputs, batch)
            if owner is not None:  # the same integer positions, kept per prompt
                inputs["position_ids"] = sequence_rope_positions(
                    owner, batch, self._prompt_positions
                )
            hidden = output_head_inputs(self.module, **inputs)[:, :-1]  # (B, T, H)
            return self._head(hidden, batch, with_entropy)
        pixel_rows, grids = batch.extras["pixel_values"], batch.extras["image_grid_thw"]
        position_ids = sequence_rope_positions(owner, batch, self._prompt_positions)
        hidden = shared_prefix_hidden(
            self.module,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            position_ids=position_ids,
            prompt_inputs=lambda rows: {
                "pixel_values": flat_pixel_values(pixel_rows[rows], grids[rows]),
                "image_grid_thw": grids[rows],
            },
            run_keys=(pixel_rows, grids),
        )  # (B, T, H)
        return self._head(hidden, batch, with_entropy)

    def _head(
        self, hidden: torch.Tensor, batch: RolloutBatch, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T) log-probs (and entropy) from the (B, T, H) hidden states that predict them;
        with ``shared_prefix`` the head is applied to the real completion tokens only
        (``completion_mask``; padding after a completion's end gets 0): about half the
        positions of a batch whose completions end early, each real one's value the same."""
        head = output_head(self.module)
        mask = batch.completion_mask.bool()  # (B, T)
        if bool(mask.all()) or not self.sampling.shared_prefix:  # the plain path: all
            return score_completions(
                hidden, head, batch.completion_ids, self.sampling, with_entropy
            )
        logp, entropy = score_completions(
            hidden[mask][None], head, batch.completion_ids[mask][None], self.sampling, with_entropy
        )  # (1, n) each
        zeros = torch.zeros(mask.shape, dtype=logp.dtype, device=logp.device)
        if entropy is not None:
            entropy = zeros.masked_scatter(mask, entropy[0])
        return zeros.masked_scatter(mask, logp[0]), entropy

    def completion_logits(self, batch: RolloutBatch) -> torch.Tensor:
        """(B, T, V) temperature-scaled logits with the image in the prompt: the plain
        single-pass path ``completion_logprobs`` is checked against (it holds all of them)."""
        prompt_inputs = self._model_prompt_inputs(self._batch_prompt_inputs(batch))
        logits = self.module(**self._forward_inputs(prompt_inputs, batch)).logits
        return logits[:, :-1, :].float() / self.sampling.temperature  # (B, T, V)

    def completion_logprobs(
        self, batch: RolloutBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T) log-probs of the completion tokens (with grad when enabled), and on request the
        (B, T) top-p entropy (docs/methods/tor.md) of the same forward's distribution (no grad)."""
        return self._score(batch, with_entropy)

    @torch.no_grad()
    def no_image_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """(B, T) log pi(o_t | no image, q, o_<t) for every completion token (docs/methods/tor.md).

        The image is removed from each prompt: its vision marker and placeholder tokens are
        dropped from the ids (the remaining tokens are the text-only chat rendering of the
        same turn) and no pixels are passed. Completion tokens keep their columns, so the
        result lines up with ``batch.old_logp``. Same temperature as ``completion_logprobs``.
        """
        prompt_ids, prompt_mask = strip_prompt_tokens(
            batch.prompt_ids, batch.prompt_mask, self.vision_ids, self.tokenizer.pad_token_id
        )  # (B, P')
        attention_mask = torch.cat([prompt_mask, batch.completion_mask.to(prompt_mask.dtype)], 1)
        # Text positions count real tokens only, as for the image prompts; the model's own
        # default for text without images (0, 1, ... over the padding too) gives the same
        # attention up to rounding (rope depends on differences of positions only).
        position_ids = sequence_positions(attention_mask)  # (B, P'+T)
        if self.sampling.shared_prefix:
            hidden = shared_prefix_hidden(
                self.module,
                prompt_ids,
                prompt_mask,
                batch.completion_ids,
                batch.completion_mask,
                position_ids=position_ids,
            )  # (B, T, H): each run's text prompt once
        else:
            inputs = self._forward_inputs(
                {"input_ids": prompt_ids, "attention_mask": prompt_mask}, batch
            )
            hidden = output_head_inputs(self.module, **inputs, position_ids=position_ids)
            hidden = hidden[:, :-1]  # (B, T, H)
        logp, _ = self._head(hidden, batch, with_entropy=False)
        return logp


def sequence_rope_positions(
    owner: torch.nn.Module, batch: RolloutBatch, cache: dict[bytes, torch.Tensor] | None = None
) -> torch.Tensor:
    """(3, B, P + T) rope positions of ``[prompt, completion]``, as the plain forward derives
    them (``owner.get_rope_index`` over the whole sequence): padding 0, the prompt's own 3-D
    positions, then the completion's real tokens on all three axes from the prompt's last
    position + 1 on (``get_rope_index`` continues a text span after the last one). The
    prompt's positions are derived once per run of rows with one prompt and one image (a
    Python loop over rows in transformers), or taken from ``cache`` (prompt row -> its
    (3, P) positions; they depend on the row's ids, mask, token types and image grid only, so
    an SFT epoch after the first derives none); the completion's are arithmetic."""
    extras = batch.extras
    types, grids = extras["mm_token_type_ids"], extras["image_grid_thw"]
    runs = prompt_runs(batch.prompt_ids, batch.prompt_mask, extras["pixel_values"], grids)  # (N,)
    first = (torch.cumsum(runs, dim=0) - runs).tolist()  # N first rows
    cache = {} if cache is None else cache
    keys = [
        b"".join(
            t[row].cpu().numpy().tobytes()
            for t in (batch.prompt_ids, batch.prompt_mask, types, grids)
        )
        for row in first
    ]
    if len(cache) > _POSITION_CACHE_ROWS:
        cache.clear()
    missing = [(row, key) for row, key in zip(first, keys, strict=True) if key not in cache]
    if missing:
        rows = [row for row, _ in missing]
        derived, _ = owner.get_rope_index(
            batch.prompt_ids[rows],
            mm_token_type_ids=types[rows],
            image_grid_thw=grids[rows],
            attention_mask=batch.prompt_mask[rows],
        )  # (3, M, P)
        for i, (_, key) in enumerate(missing):
            cache[key] = derived[:, i]
    # (3, N, P); left-padded, so position P - 1 is the last real token
    prompt_positions = torch.stack([cache[key] for key in keys], dim=1)
    B = batch.batch_size
    prompt_positions = prompt_positions.repeat_interleave(runs, dim=1, output_size=B)  # (3, B, P)
    mask = batch.completion_mask.to(torch.long)  # (B, T)
    after = prompt_positions[0, :, -1:] + mask.cumsum(dim=1)  # (B, T): last + 1, + 2, ...
    completion = (after * mask).unsqueeze(0).expand(3, -1, -1)  # (3, B, T), padding 0
    return torch.cat([prompt_positions, completion.to(prompt_positions.dtype)], dim=2)


# Prompt rows whose 3-D positions a policy keeps (a few MB at the tor defaults' 8,000).
_POSITION_CACHE_ROWS = 100_000


def rope_index_owner(module: torch.nn.Module) -> torch.nn.Module | None:
    """The submodule of a Qwen2-VL-style model that derives its 3-D rope positions
    (``get_rope_index``; ``Qwen2_5_VLModel``), also inside a DDP or PEFT wrapper; None when
    there is none (the policy then scores with the plain forward)."""
    return next((m for m in module.modules() if hasattr(m, "get_rope_index")), None)


def strip_prompt_tokens(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, drop_ids: Sequence[int], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts without the tokens in ``drop_ids``.

    Args:
        prompt_ids: ``(B, P)`` long, left-padded.
        prompt_mask: ``(B, P)``, 1 on real tokens.
        drop_ids: token ids to remove (e.g. the vision markers and image placeholders).
        pad_id: id written on the new left padding.

    Returns:
        ``(ids, mask)``, each ``(B, P')`` with ``P'`` the longest remaining prompt.
    """
    drop = torch.tensor(list(drop_ids), dtype=prompt_ids.dtype, device=prompt_ids.device)
    keep = prompt_mask.bool() & ~torch.isin(prompt_ids, drop)  # (B, P)
    lengths = keep.sum(dim=1)  # (B,)
    width = int(lengths.max())
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=prompt_ids.dtype)
    mask = torch.zeros((len(prompt_ids), width), dtype=prompt_mask.dtype)
    ids, mask = ids.to(prompt_ids.device), mask.to(prompt_mask.device)
    for b in range(len(prompt_ids)):
        n = int(lengths[b])
        ids[b, width - n :] = prompt_ids[b][keep[b]]
        mask[b, width - n :] = 1
    return ids, mask
