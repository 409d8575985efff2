"""Supervised warm start: next-token loss on completion tokens only.

A from-scratch tiny policy cannot sample the TAPO format, so every completion would score 0
and GRPO would have no signal; a short SFT on gold completions gives it the format first.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from creditflow.config.supervised import SFTConfig
from creditflow.models.tokenizer import Prompt, chat_messages
from creditflow.training.checkpoint import CheckpointStore, run_store, tokenizer_digest
from creditflow.training.supervised import SupervisedTrainer

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100  # transformers' label value for "no loss here"


def build_sft_examples(
    tokenizer,
    prompts: Sequence[Prompt],
    targets: Sequence[str],
    max_length: int,
    use_chat_template: bool = True,
) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per example: the chat-formatted prompt, then target + EOS; labels are
    IGNORE_INDEX on the prompt so only the completion is learned (``train_sft``).
    Raises ValueError when truncation to ``max_length`` leaves an example no target token."""
    if len(prompts) != len(targets):
        raise ValueError(f"{len(prompts)} prompts but {len(targets)} targets")
    examples = []
    for index, (prompt, target) in enumerate(zip(prompts, targets, strict=True)):
        text = prompt
        if use_chat_template:  # text as one user turn, chat messages as they are
            text = tokenizer.apply_chat_template(
                chat_messages(prompt), add_generation_prompt=True, tokenize=False
            )
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        target_ids = tokenizer(target, add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id
        ]
        ids = (prompt_ids + target_ids)[:max_length]
        labels = ([IGNORE_INDEX] * len(prompt_ids) + target_ids)[:max_length]
        if len(prompt_ids) >= max_length:
            # A batch of such examples has no labelled token: the mean NLL is 0/0 = NaN and
            # one NaN step destroys the weights.
            raise ValueError(
                f"example {index}: the prompt alone has {len(prompt_ids)} tokens, so "
                f"max_length={max_length} leaves no target token; raise sft max_length"
            )
        examples.append((ids, labels))
    return examples


def collate_right_padded(
    examples: Sequence[tuple[list[int], list[int]]], pad_id: int
) -> dict[str, torch.Tensor]:
    """Right-pad to the longest example: input_ids, attention_mask, labels, each (b, N)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def completion_nll(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token NLL over the tokens whose label is not IGNORE_INDEX."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    shift_logits = logits[:, :-1].float()  # (b, N-1, V): position n predicts token n+1
    shift_labels = batch["labels"][:, 1:]  # (b, N-1)
    return torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]),
        shift_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
    )


def train_sft(
    model,
    tokenizer,
    prompts: Sequence[str],
    targets: Sequence[str],
    config: SFTConfig,
    use_chat_template: bool = True,
    progress: bool = True,
    checkpoints: CheckpointStore | None = None,
) -> list[dict[str, float]]:
    """Train ``model`` in place on (prompt, target) pairs; returns one metrics row per step
    (``step``, ``sft/loss``, ``lr``). ``checkpoints``: this run's store (``run_store``), or
    None."""
    examples = build_sft_examples(tokenizer, prompts, targets, config.max_length, use_chat_template)
    device = next(model.parameters()).device

    def batch_fn(rows: list[int]) -> dict[str, torch.Tensor]:
        batch = collate_right_padded([examples[i] for i in rows], tokenizer.pad_token_id)
        return {k: v.to(device) for k, v in batch.items()}

    def loss_fn(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        loss = completion_nll(model, batch)
        return loss, {"sft/loss": loss.item()}

    history = SupervisedTrainer(
        model,
        len(examples),
        batch_fn,
        loss_fn,
        config.supervised(),
        checkpoints,
        desc="SFT",
        progress=progress,
    ).train()
    logger.info("SFT done: %d steps, final loss %.4f", config.steps, history[-1]["sft/loss"])
    return history


def run_sft(
    model,
    tokenizer,
    prompts: Sequence[str],
    targets: Sequence[str],
    sft_params: dict,
    checkpoints: CheckpointStore | None = None,
) -> tuple[Any, pd.DataFrame]:
    """SFT a copy of ``model``; returns it and the per-step metrics table (no rows, and the
    copy unchanged, when ``steps`` is 0). With ``checkpoints``
    the run resumes (or, finished, is just loaded) from its own subdirectory, keyed by the
    starting weights, the data, the tokenizer, the parameters and the thread count."""
    config = SFTConfig.from_params(dict(sft_params))
    model = copy.deepcopy(model)
    if config.skipped:
        logger.info("sft.steps is 0: no warm start, the initial policy passes through")
        return model.eval(), pd.DataFrame({"step": pd.Series(dtype="int64")})
    prompts, targets = list(prompts), list(targets)
    store = run_store(
        checkpoints,
        model,
        config.supervised().run_key(),
        config.max_length,
        prompts,
        targets,
        tokenizer_digest(tokenizer),
    )
    history = train_sft(model, tokenizer, prompts, targets, config, checkpoints=store)
    return model.eval(), pd.DataFrame(history)
