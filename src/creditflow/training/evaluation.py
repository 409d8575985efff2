"""Greedy or sampled evaluation of a language or vision-language policy, scored by the rewards
of ``training.rewards``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from creditflow.config.grpo import DEFAULT_ROLLOUT_BACKEND
from creditflow.rollout import LanguagePolicy, SamplingSettings, VisionLanguagePolicy
from creditflow.training.policy_kinds import build_policy
from creditflow.training.rewards import BoundRewards, Reward, reward_columns
from creditflow.training.seeding import step_seed


def greedy_completions(
    policy, prompts: Sequence[Any], batch_size: int = 32, progress: bool = False
) -> list[str]:
    """Greedy decodes of ``prompts`` with a ``LanguagePolicy`` or ``VisionLanguagePolicy``
    (its rollout backend), in batches."""
    texts: list[str] = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="eval", disable=not progress):
        texts += policy.greedy(list(prompts[start : start + batch_size]))
    return texts


def evaluation_policy(
    model, processing, sampling: SamplingSettings, cache_bytes: Mapping[str, int] | None = None
) -> LanguagePolicy | VisionLanguagePolicy:
    """A policy for evaluating ``model`` with its tokenizer or processor ``processing``: the
    default rollout backend where it applies (the ``lean`` decoder draws the same tokens as
    ``model.generate`` up to float ties), else ``hf``; ``cache_bytes``: a vision-language
    policy's cache budgets (``grpo_runs.grpo_policy``)."""
    return build_policy(model, processing, sampling, {"name": DEFAULT_ROLLOUT_BACKEND}, cache_bytes)


@torch.no_grad()
def sampled_completions(
    policy,
    prompts: Sequence[str],
    samples_per_prompt: int,
    batch_size: int = 32,
    seed: int = 0,
    progress: bool = False,
) -> list[str]:
    """``samples_per_prompt`` completions per prompt drawn with ``policy.sampling`` (the
    distribution GRPO trains), rows of one prompt consecutive.

    The draw is isolated from the global RNG (``fork_rng``), so evaluating does not shift a
    training run's seed, and every ``generate`` call is seeded on its own
    (``step_seed(seed, call index)``): two policies evaluated with one seed share their random
    numbers call by call (common random numbers), even where an earlier call of one of them
    stopped sooner and so drew fewer. Where the policies are close, their samples then
    coincide more often than independent draws would, and the paired difference of their
    rewards is less noisy while each policy's own mean is still an honest sample (tapo warm
    start vs 25 GRPO steps, 280 problems x 4 samples: standard error of the mean paired
    difference 0.0127 from one stream, 0.0088 and 0.0085 seeded per call, two seeds).
    ``batch_size`` counts generated rows per ``generate`` call; the pairing holds only
    between evaluations with the same ``batch_size`` and ``samples_per_prompt``.
    """
    if samples_per_prompt < 1:
        raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    prompts_per_call = max(1, batch_size // samples_per_prompt)
    texts: list[str] = []
    with torch.random.fork_rng(devices=[]):
        for call, start in enumerate(
            tqdm(
                range(0, len(prompts), prompts_per_call),
                desc="eval (sampled)",
                disable=not progress,
            )
        ):
            torch.manual_seed(step_seed(seed, call))
            chunk = list(prompts[start : start + prompts_per_call])
            batch = policy.sample(chunk, samples_per_prompt, with_logprobs=False)
            texts += batch.completion_texts
    return texts


def score_completions(
    completions: Sequence[str],
    references: Sequence[str],
    answers: Sequence[str],
    names: Sequence[Reward],
    columns: Mapping[str, Sequence[Any]] | None = None,
) -> pd.DataFrame:
    """One row per completion, one column ``reward/<name>`` per reward (not its flags);
    ``columns``: the callable rewards' keyword arguments, one value per completion."""
    rewards = BoundRewards(names, references, answers, columns=columns)
    scores = rewards(list(completions), torch.arange(len(completions)))
    return pd.DataFrame({f"reward/{k}": scores[k].numpy() for k in rewards.functions})


def evaluate_policy(
    model,
    processing,
    prompts: Sequence[Any],
    references: Sequence[str],
    answers: Sequence[str],
    reward_names: Sequence[Reward],
    max_new_tokens: int,
    batch_size: int = 32,
    columns: Mapping[str, Sequence[Any]] | None = None,
    cache_bytes: Mapping[str, int] | None = None,
) -> pd.DataFrame:
    """Greedy completions of ``prompts`` (texts, chat conversations, or for a
    vision-language ``model`` what ``as_visual_prompt`` accepts) scored with ``reward_names``
    (``columns``: the callable rewards' keyword arguments, one value per prompt): one row per
    prompt with ``completion`` and ``reward/<name>`` columns. ``processing``: the model's
    tokenizer or processor; ``cache_bytes`` as ``evaluation_policy``'s."""
    sampling = SamplingSettings(max_new_tokens=max_new_tokens)
    policy = evaluation_policy(model, processing, sampling, cache_bytes)
    completions = greedy_completions(policy, prompts, batch_size=batch_size, progress=True)
    scores = score_completions(completions, references, answers, reward_names, columns)
    return scores.assign(completion=completions)


def evaluate_policy_sampled(
    model,
    processing,
    prompts: Sequence[Any],
    references: Sequence[str],
    answers: Sequence[str],
    reward_names: Sequence[Reward],
    max_new_tokens: int,
    samples_per_prompt: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    batch_size: int = 32,
    seed: int = 0,
    columns: Mapping[str, Sequence[Any]] | None = None,
    cache_bytes: Mapping[str, int] | None = None,
) -> pd.DataFrame:
    """Expected rewards under sampling: ``samples_per_prompt`` completions per prompt (the
    way GRPO samples its rollouts), scored with ``reward_names`` and averaged per prompt.

    Returns one row per prompt (prompt order) with ``reward/<name>`` columns, each the mean
    over that prompt's samples. Greedy decoding (``evaluate_policy``) measures the policy's
    mode; this measures the distribution GRPO optimises, and the two can move apart (a
    policy's greedy answers can stay put while GRPO moves the distribution it samples from:
    docs/results.md, "The ToR world").
    """
    sampling = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    policy = evaluation_policy(model, processing, sampling, cache_bytes)
    return mean_sampled_rewards(
        policy,
        prompts,
        references,
        answers,
        reward_names,
        samples_per_prompt,
        batch_size,
        seed,
        columns,
    )


def mean_sampled_rewards(
    policy,
    prompts: Sequence[Any],
    references: Sequence[str],
    answers: Sequence[str],
    reward_names: Sequence[Reward],
    samples_per_prompt: int,
    batch_size: int,
    seed: int,
    columns: Mapping[str, Sequence[Any]] | None = None,
) -> pd.DataFrame:
    """``samples_per_prompt`` completions per prompt from ``policy`` (a ``LanguagePolicy`` or
    ``VisionLanguagePolicy``; ``sampled_completions``), scored with ``reward_names`` and
    averaged per prompt: one row per prompt (prompt order), ``reward/<name>`` columns.
    ``columns``: the callable rewards' keyword arguments, one value per prompt."""
    completions = sampled_completions(  # sample() switches the module to eval mode and back
        policy, prompts, samples_per_prompt, batch_size=batch_size, seed=seed, progress=True
    )
    k = samples_per_prompt
    scores = score_completions(
        completions,
        [r for r in references for _ in range(k)],
        [a for a in answers for _ in range(k)],
        reward_names,
        {name: [v for v in values for _ in range(k)] for name, values in (columns or {}).items()},
    )  # (len(prompts) * k) rows, prompt-major
    return scores.groupby(scores.index // k).mean().reset_index(drop=True)


def evaluate_problems(
    model,
    processing,
    problems: pd.DataFrame,
    prompts: Sequence[Any],
    reward_names: Sequence[Reward],
    max_new_tokens: int,
    batch_size: int = 32,
    samples_per_problem: int = 0,
    sampled_rows: Sequence[bool] | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    reference_column: str | None = "question_en",
    answer_column: str | None = "answer",
    cache_bytes: Mapping[str, int] | None = None,
) -> pd.DataFrame:
    """``problems`` (one row per prompt, with references in ``reference_column`` and gold
    answers in ``answer_column``; None: the table has none, and no reward reads them) with
    the greedy completion and its ``reward/<name>`` columns; with ``samples_per_problem`` > 0
    the rows where ``sampled_rows`` is True (all rows when None) also get
    ``sampled/reward/<name>``: the mean reward of that many completions sampled at
    ``temperature`` / ``top_p`` (``evaluate_policy_sampled``, seeded by ``seed``).
    Callable rewards get ``problems``' columns (``reward_columns``). ``processing``: the
    model's tokenizer or processor; ``cache_bytes`` as ``evaluation_policy``'s."""
    common = {
        "reward_names": reward_names,
        "max_new_tokens": max_new_tokens,
        "cache_bytes": cache_bytes,
    }
    return _greedy_and_sampled_scores(
        problems,
        prompts,
        (reference_column, answer_column),
        partial(evaluate_policy, model, processing, **common, batch_size=batch_size),
        partial(
            evaluate_policy_sampled,
            model,
            processing,
            **common,
            samples_per_prompt=samples_per_problem,
            temperature=temperature,
            top_p=top_p,
            batch_size=batch_size,
            seed=seed,
        ),
        samples_per_problem,
        sampled_rows,
    )


def _greedy_and_sampled_scores(
    problems: pd.DataFrame,
    prompts: Sequence[Any],
    reference_and_answer: tuple[str | None, str | None],
    greedy: Callable[..., pd.DataFrame],
    sampled: Callable[..., pd.DataFrame],
    samples_per_problem: int,
    sampled_rows: Sequence[bool] | None,
) -> pd.DataFrame:
    """``problems`` joined with ``greedy(prompts, references, answers, columns=...)``'s
    columns and, with ``samples_per_problem`` > 0, ``sampled(...)``'s on the ``sampled_rows``
    (all when None), prefixed ``sampled/``. References and answers are the columns
    ``reference_and_answer`` names (None for a column the table lacks: None on every row),
    ``columns`` the callable rewards' arguments (``reward_columns``)."""
    references, answers = (
        [None] * len(problems) if name is None else list(problems[name])
        for name in reference_and_answer
    )
    columns = reward_columns(problems, prompts)
    scored = greedy(prompts, references, answers, columns=columns)
    table = pd.concat([problems, scored], axis=1)
    if not samples_per_problem:
        return table
    keep = pd.Series(True if sampled_rows is None else list(sampled_rows), index=table.index)

    def kept(values: Sequence[Any]) -> list[Any]:
        return [value for value, k in zip(values, keep, strict=True) if k]

    means = sampled(
        kept(prompts),
        kept(references),
        kept(answers),
        columns={name: kept(values) for name, values in columns.items()},
    )
    means.index = table.index[keep]
    return table.join(means.add_prefix("sampled/"))
