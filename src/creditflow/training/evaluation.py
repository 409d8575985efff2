"""Reward functions bound to a prompt table, and greedy evaluation of a language or
vision-language policy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from creditflow.rewards import get_reward_function
from creditflow.rollout import LanguagePolicy, SamplingSettings, VisionLanguagePolicy


class TextRewards:
    """Named text rewards bound to the references and answers of a prompt table.

    ``__call__(completions, prompt_index (B,))`` -> {name: (B,) float tensor}; row b is scored
    against the reference and answer of prompt ``prompt_index[b]``.
    """

    def __init__(self, names: Sequence[str], references: Sequence[str], answers: Sequence[str]):
        self.functions = {
            name: get_reward_function(name) for name in names
        }  # fails early on bad names
        self.references = list(references)
        self.answers = list(answers)

    def __call__(
        self, completions: list[str], prompt_index: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        rows = prompt_index.tolist()
        refs = [self.references[i] for i in rows]
        answers = [self.answers[i] for i in rows]
        return {
            name: torch.tensor(fn(completions, refs, answers), dtype=torch.float32)
            for name, fn in self.functions.items()
        }


@torch.no_grad()
def greedy_completions(
    policy, prompts: Sequence[str], batch_size: int = 32, progress: bool = False
) -> list[str]:
    """Greedy decodes of ``prompts`` with ``policy.module`` (a LanguagePolicy), in batches."""
    model, tokenizer = policy.module, policy.tokenizer
    was_training = model.training
    model.eval()
    texts: list[str] = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="eval", disable=not progress):
        ids, mask = policy.encode_prompts(list(prompts[start : start + batch_size]))
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=policy.sampling.max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=policy.eos_ids,
        )
        texts += tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    return texts


def score_completions(
    completions: Sequence[str],
    references: Sequence[str],
    answers: Sequence[str],
    names: Sequence[str],
) -> pd.DataFrame:
    """One row per completion, one column ``reward/<name>`` per reward."""
    rewards = TextRewards(names, references, answers)
    scores = rewards(list(completions), torch.arange(len(completions)))
    return pd.DataFrame({f"reward/{k}": v.numpy() for k, v in scores.items()})


def evaluate_text_policy(
    model,
    tokenizer,
    prompts: Sequence[str],
    references: Sequence[str],
    answers: Sequence[str],
    reward_names: Sequence[str],
    max_new_tokens: int,
    batch_size: int = 32,
) -> pd.DataFrame:
    """Greedy completions of ``prompts`` scored with ``reward_names``: one row per prompt with
    ``completion`` and ``reward/<name>`` columns."""
    policy = LanguagePolicy(model, tokenizer, SamplingSettings(max_new_tokens=max_new_tokens))
    completions = greedy_completions(policy, prompts, batch_size=batch_size, progress=True)
    scores = score_completions(completions, references, answers, reward_names)
    return scores.assign(completion=completions)


def evaluate_vl_policy(
    model,
    processor,
    prompts: Sequence[Any],
    references: Sequence[str],
    answers: Sequence[str],
    reward_names: Sequence[str],
    max_new_tokens: int,
    batch_size: int = 32,
) -> pd.DataFrame:
    """Greedy completions of image ``prompts`` (anything ``as_visual_prompt`` accepts) scored
    with ``reward_names``: one row per prompt with ``completion`` and ``reward/<name>``."""
    policy = VisionLanguagePolicy(model, processor, SamplingSettings(max_new_tokens=max_new_tokens))
    completions: list[str] = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="eval"):
        completions += policy.greedy(list(prompts[start : start + batch_size]))
    scores = score_completions(completions, references, answers, reward_names)
    return scores.assign(completion=completions)
