"""Supervised warm start: next-token loss on the target tokens of (prompt, target) pairs, for a
text or a vision-language policy alike (``training.policy_kinds`` says how a pair becomes a
batch).

A from-scratch tiny policy cannot sample the task's format, so every completion would score 0
and GRPO would have no signal; a short SFT on gold completions gives it the format first.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from creditflow.config.supervised import SFTConfig
from creditflow.training.checkpoint import CheckpointStore, run_store
from creditflow.training.policy_kinds import policy_kind
from creditflow.training.supervised import SupervisedTrainer

logger = logging.getLogger(__name__)


def train_sft(
    model,
    processing,
    prompts: Sequence[Any],
    targets: Sequence[str],
    config: SFTConfig,
    use_chat_template: bool = True,
    progress: bool = True,
    checkpoints: CheckpointStore | None = None,
    cache_bytes: Mapping[str, int] | None = None,
) -> list[dict[str, float]]:
    """Train ``model`` in place on (prompt, target) pairs; returns one metrics row per step
    (``step``, ``sft/loss``, ``lr``).

    Args:
        model: a causal LM or a vision-language model.
        processing: its tokenizer, or its processor (``policy_kinds.policy_kind``).
        prompts: texts or chat conversations; for a vision-language model, what
            ``rollout.as_visual_prompt`` accepts.
        targets: one gold completion per prompt (EOS is added).
        config: the SFT settings.
        use_chat_template: a text prompt is wrapped as a user turn by the chat template.
        progress: show a progress bar.
        checkpoints: this run's store (``run_store``), or None.
        cache_bytes: a vision-language policy's cache budgets (they change no result).

    Raises:
        ValueError: prompts and targets differ in number, or a prompt alone fills
            ``config.max_length``.
    """
    if len(prompts) != len(targets):
        raise ValueError(f"{len(prompts)} prompts but {len(targets)} targets")
    kind = policy_kind(processing)
    batch_fn, loss_fn = kind.supervised(
        model,
        processing,
        kind.prompts(prompts),
        list(targets),
        config,
        use_chat_template=use_chat_template,
        cache_bytes=cache_bytes,
    )
    history = SupervisedTrainer(
        model,
        len(prompts),
        batch_fn,
        loss_fn,
        config.supervised(),
        checkpoints,
        desc="SFT",
        progress=progress,
    ).train()
    model.eval()
    logger.info(
        "SFT (%s) done: %d steps, final loss %.4f", kind.name, config.steps, history[-1]["sft/loss"]
    )
    return history


def run_sft(
    model,
    processing,
    prompts: Sequence[Any],
    targets: Sequence[str],
    sft_params: Mapping[str, Any],
    checkpoints: CheckpointStore | None = None,
    cache_bytes: Mapping[str, int] | None = None,
) -> tuple[Any, pd.DataFrame]:
    """SFT a copy of ``model`` (``train_sft``); returns it and the per-step metrics table (no
    rows, and the copy unchanged, when ``steps`` is 0).

    With ``checkpoints`` the run resumes (or, finished, is just loaded) from its own
    subdirectory, keyed by the starting weights, the prompts (a picture by its pixels'
    digest), the targets, the tokenizer (and image processor), the parameters and the thread
    count. ``cache_bytes`` are not part of that key: they change no result.
    """
    config = SFTConfig.from_params(dict(sft_params))
    model = copy.deepcopy(model)
    if config.skipped:
        logger.info("sft.steps is 0: no warm start, the initial policy passes through")
        return model.eval(), pd.DataFrame({"step": pd.Series(dtype="int64")})
    kind = policy_kind(processing)
    prompts, targets = kind.prompts(prompts), list(targets)
    store = run_store(
        checkpoints,
        model,
        config.supervised().run_key(),
        config.max_length,
        kind.prompt_keys(prompts),
        targets,
        *kind.processing_keys(processing),
    )
    history = train_sft(
        model, processing, prompts, targets, config, checkpoints=store, cache_bytes=cache_bytes
    )
    return model.eval(), pd.DataFrame(history)
