"""Supervised warm start of a vision-language policy: next-token loss on the target tokens of
(image prompt, target) pairs, teacher-forced through the policy's own scoring forward."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from creditflow.algorithms import masked_mean
from creditflow.config.supervised import SFTConfig
from creditflow.rollout import SamplingSettings, VisionLanguagePolicy, as_visual_prompt
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.checkpoint import (
    CheckpointStore,
    content_digest,
    run_store,
    tokenizer_digest,
)
from creditflow.training.supervised import SupervisedTrainer

logger = logging.getLogger(__name__)


def target_batch(
    policy: Any,
    prompts: Sequence[Any],
    target_ids: Sequence[Sequence[int]],
    max_length: int | None = None,
) -> RolloutBatch:
    """A rollout batch whose completions are given token ids (teacher forcing), one per prompt.

    Args:
        policy: a ``VisionLanguagePolicy`` (``encode_prompts`` per-row inputs).
        prompts: ``B`` prompts ``as_visual_prompt`` accepts.
        target_ids: ``B`` token-id lists (EOS included).
        max_length: tokens per example, image prompt included; targets are cut to fit.

    Returns:
        ``completion_ids`` right-padded, ``completion_mask`` 1 on the targets, ``old_logp``
        empty; ``extras`` as ``policy.sample`` sets them.

    Raises:
        ValueError: a prompt alone fills ``max_length`` (it would leave no target token and
            a 0/0 loss).
    """
    encoded = policy.encode_prompts(prompts)
    prompt_lengths = encoded["attention_mask"].sum(dim=1).tolist()
    if max_length is not None:
        too_long = [n for n in prompt_lengths if n >= max_length]
        if too_long:
            raise ValueError(
                f"a prompt has {max(too_long)} tokens (image included), so max_length="
                f"{max_length} leaves no target token; raise sft max_length"
            )
        target_ids = [
            list(ids)[: max_length - n] for ids, n in zip(target_ids, prompt_lengths, strict=True)
        ]
    width = max(len(ids) for ids in target_ids)
    ids = torch.full((len(target_ids), width), policy.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(target_ids), width)
    for row, tokens in enumerate(target_ids):
        ids[row, : len(tokens)] = torch.tensor(list(tokens), dtype=torch.long)
        mask[row, : len(tokens)] = 1.0
    extras = {k: encoded[k] for k in ("mm_token_type_ids", "pixel_values", "image_grid_thw")}
    return RolloutBatch(
        prompt_ids=encoded["input_ids"],
        prompt_mask=encoded["attention_mask"],
        completion_ids=ids.to(policy.device),
        completion_mask=mask.to(policy.device),
        old_logp=torch.empty(0),
        completion_texts=[""] * len(target_ids),
        prompt_index=torch.arange(len(target_ids)),
        group_size=1,
        extras=extras,
    )


def train_vl_sft(
    policy: Any,
    prompts: Sequence[Any],
    targets: Sequence[str],
    config: SFTConfig,
    progress: bool = True,
    checkpoints: CheckpointStore | None = None,
) -> list[dict[str, float]]:
    """Train ``policy.module`` in place on (image prompt, target) pairs: mean next-token NLL of
    the target tokens (EOS included) given the image and the prompt.

    ``policy`` is a ``VisionLanguagePolicy`` with temperature 1 (the loss is its log-prob).
    Examples longer than ``config.max_length`` tokens (image prompt + target) lose the end of
    their target. Returns one metrics row per step (``step``, ``sft/loss``, ``lr``).
    ``checkpoints``: this run's store (``run_store``), or None.
    """
    if len(prompts) != len(targets):
        raise ValueError(f"{len(prompts)} prompts but {len(targets)} targets")
    if policy.sampling.temperature != 1.0:
        raise ValueError("SFT scores the model's own distribution: use temperature 1")
    tokenizer = policy.tokenizer
    eos = tokenizer.eos_token_id
    target_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in targets]

    def batch_fn(rows: list[int]) -> RolloutBatch:
        return target_batch(
            policy, [prompts[i] for i in rows], [target_ids[i] for i in rows], config.max_length
        )

    def loss_fn(batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp, _ = policy.completion_logprobs(batch)  # (b, T)
        loss = -masked_mean(logp, batch.completion_mask)
        return loss, {"sft/loss": loss.item()}

    model = policy.module
    history = SupervisedTrainer(
        model,
        len(prompts),
        batch_fn,
        loss_fn,
        config.supervised(),
        checkpoints,
        desc="VL SFT",
        progress=progress,
    ).train()
    model.eval()
    logger.info("VL SFT done: %d steps, final loss %.4f", config.steps, history[-1]["sft/loss"])
    return history


def run_vl_sft(
    model,
    processor,
    prompts: Sequence[Any],
    targets: Sequence[str],
    sft_params: dict,
    checkpoints: CheckpointStore | None = None,
    cache_bytes: Mapping[str, int] | None = None,
) -> tuple[Any, pd.DataFrame]:
    """SFT a copy of a vision-language ``model`` on (image prompt, target) pairs; returns it and
    the per-step metrics table (no rows, and the copy unchanged, when ``steps`` is 0).
    ``prompts`` are what ``as_visual_prompt`` accepts. With ``checkpoints`` the run resumes
    (or, finished, is just loaded) from its own subdirectory, keyed by the starting weights,
    the prompts (texts and pixels), targets, the processor, the parameters and the thread
    count. ``cache_bytes``: ``prompt_cache_bytes`` / ``vision_cache_bytes`` of the
    ``VisionLanguagePolicy`` (they change no result and are not part of the key)."""
    config = SFTConfig.from_params(dict(sft_params))
    model = copy.deepcopy(model)
    if config.skipped:
        logger.info("sft.steps is 0: no warm start, the initial policy passes through")
        return model.eval(), pd.DataFrame({"step": pd.Series(dtype="int64")})
    visual = [as_visual_prompt(p) for p in prompts]  # decode every image once
    targets = list(targets)
    prompt_keys = [[p.text, content_digest(p.image.tobytes())] for p in visual]
    store = run_store(
        checkpoints,
        model,
        config.supervised().run_key(),
        config.max_length,
        prompt_keys,
        targets,
        tokenizer_digest(processor.tokenizer),
        processor.image_processor.to_dict(),  # image size and patching decide the pixels
    )
    # SFT takes the plain forward: its rows never share a prompt, so the shared-prefix path
    # (a group's prompt encoded once, its completions run on that cache) has nothing to share
    # and would only split each row's forward in two.
    policy = VisionLanguagePolicy(
        model, processor, SamplingSettings(shared_prefix=False), **(cache_bytes or {})
    )
    history = train_vl_sft(policy, visual, targets, config, checkpoints=store)
    return model.eval(), pd.DataFrame(history)
