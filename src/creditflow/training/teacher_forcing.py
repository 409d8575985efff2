"""(prompt, target) pairs as supervised batches: the gold completion fed in whole (teacher
forcing) and the mean next-token loss of its tokens. One recipe per kind of policy
(``training.policy_kinds`` picks it); ``training.sft`` trains either the same way.

A text policy's rows are the chat-formatted prompt and its target in one right-padded
sequence, scored by the model's plain forward (``build_sft_examples``, ``completion_nll``). A
vision-language policy's rows go through the policy's own scoring forward
(``target_batch``): the processor expands each image into its patch tokens, which only the
policy knows how to lay out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from creditflow.models.tokenizer import Prompt, chat_messages
from creditflow.rollout.batch import RolloutBatch

IGNORE_INDEX = -100  # transformers' label value for "no loss here"


def build_sft_examples(
    tokenizer,
    prompts: Sequence[Prompt],
    targets: Sequence[str],
    max_length: int,
    use_chat_template: bool = True,
) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per example: the chat-formatted prompt, then target + EOS; labels are
    IGNORE_INDEX on the prompt so only the completion is learned (``training.sft.train_sft``).
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
