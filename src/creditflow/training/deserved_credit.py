"""The credit a completion's tokens deserve, estimated by Monte Carlo from the policy itself.

For each recorded completion the value of a prefix (the prompt and its first ``t`` completion
tokens) is the mean reward of K continuations the policy samples from it, as VinePPO does
(arXiv 2410.01679); the credit of a span is the change in value across it
(``algorithms.prefix_values``). The last prefix is the whole completion, whose value is its
own reward: nothing is sampled for it.

``estimate_deserved_credit`` needs only two callables, so any policy and any reward can use it
(the credit inspector with a language or vision-language policy and the run's reward
function; a bench with a tabular policy and a known reward):

- a ``PrefixSampler``, ``(rows (N,), lengths (N,), K) -> (ids (N*K, T'), mask (N*K, T'))``:
  K whole completions of each prefix, the first ``lengths[n]`` tokens of completion
  ``rows[n]`` followed by a sampled continuation (rows of one prefix consecutive);
- a ``Scorer``, ``(rows (M,), ids (M, T'), mask (M, T')) -> (M,)``: the scalar reward of each
  completion, ``rows`` saying whose prompt it answers.

Shape symbols: ``B`` completions, ``T`` completion tokens, ``N`` prefixes, ``K``
continuations per prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch

from creditflow.algorithms.prefix_values import (
    every_n_boundaries,
    known_prefixes,
    segment_boundaries,
    span_credits,
)
from creditflow.rollout.backends import completion_mask_from_eos
from creditflow.rollout.batch import RolloutBatch

PrefixSampler = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
Scorer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# Prefixes whose continuations are sampled in one call: K * PREFIX_CHUNK rows at most.
PREFIX_CHUNK = 16


def span_boundaries(
    every: int | str, mask: torch.Tensor, segment_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, T) bool span ends for ``every`` (an int n: every n tokens; ``"segments"``: where
    ``segment_ids`` (B, T) changes); mask: (B, T)."""
    if every == "segments":
        if segment_ids is None:
            raise ValueError("every='segments' needs the tokens' segment ids")
        return segment_boundaries(segment_ids, mask)
    if isinstance(every, int) and not isinstance(every, bool):
        return every_n_boundaries(mask, every)
    raise ValueError(f"every must be an int >= 1 or 'segments', got {every!r}")


@torch.no_grad()
def estimate_prefix_values(
    sampler: PrefixSampler,
    scorer: Scorer,
    boundaries: torch.Tensor,
    mask: torch.Tensor,
    final_rewards: torch.Tensor,
    continuations: int,
) -> torch.Tensor:
    """(B, T + 1) prefix values (``algorithms.prefix_values``): column ``t`` the mean reward of
    ``continuations`` samples from the prefix of ``t`` tokens where that prefix starts a span
    (``known_prefixes``), a row's own reward at its full length, NaN elsewhere.

    boundaries: (B, T) bool; mask: (B, T); final_rewards: (B,) the completions' rewards.
    """
    if continuations < 1:
        raise ValueError(f"continuations must be >= 1, got {continuations}")
    B, T = mask.shape
    n_valid = mask.sum(dim=1).long().cpu()  # (B,)
    values = torch.full((B, T + 1), float("nan"), dtype=torch.float64)
    values[torch.arange(B), n_valid] = final_rewards.detach().double().cpu()
    needed = known_prefixes(boundaries.bool().cpu() & mask.bool().cpu())  # (B, T + 1)
    needed &= torch.arange(T + 1)[None] < n_valid[:, None]  # the full prefix is known
    rows, lengths = needed.nonzero(as_tuple=True)  # (N,), (N,)
    for start in range(0, len(rows), PREFIX_CHUNK):
        r, t = rows[start : start + PREFIX_CHUNK], lengths[start : start + PREFIX_CHUNK]
        ids, sample_mask = sampler(r, t, continuations)  # (n*K, T')
        rewards = scorer(r.repeat_interleave(continuations), ids, sample_mask)  # (n*K,)
        values[r, t] = rewards.detach().double().cpu().view(len(r), continuations).mean(dim=1)
    return values


def estimate_deserved_credit(
    sampler: PrefixSampler,
    scorer: Scorer,
    boundaries: torch.Tensor,
    mask: torch.Tensor,
    final_rewards: torch.Tensor,
    continuations: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) deserved credit per token and the (B, T + 1) prefix values it comes from
    (``estimate_prefix_values``; NaN where no value was needed)."""
    values = estimate_prefix_values(sampler, scorer, boundaries, mask, final_rewards, continuations)
    return span_credits(values, boundaries.cpu(), mask.cpu()).float(), values


# ------------------------------------------------------------------ a policy's side
@contextmanager
def _new_token_budget(policy: Any, tokens: int) -> Iterator[None]:
    """``policy.sampling`` with ``max_new_tokens = tokens`` for the duration: a continuation
    of a t-token prefix may add only what the completion's budget leaves."""
    sampling = policy.sampling
    policy.sampling = replace(sampling, max_new_tokens=tokens)
    try:
        yield
    finally:
        policy.sampling = sampling


def prefix_inputs(
    batch: RolloutBatch, rows: torch.Tensor, lengths: torch.Tensor, device: torch.device
) -> dict[str, torch.Tensor]:
    """The prompt inputs of N prefixes: row ``rows[n]``'s prompt and its first ``lengths[n]``
    completion tokens, left-padded as the rollout's prompts are. ``input_ids`` and
    ``attention_mask`` (N, P'); each prompt-aligned extra of ``batch`` (``prompt_extras``,
    e.g. a vision-language prompt's ``mm_token_type_ids``) the same width, 0 over the
    completion tokens and the padding; every other extra (``pixel_values``, ``image_grid_thw``)
    the rows' own."""
    pieces: dict[str, list[torch.Tensor]] = {"input_ids": []}
    pieces.update({key: [] for key in batch.prompt_extras})
    for row, t in zip(rows.tolist(), lengths.tolist(), strict=True):
        kept = batch.prompt_mask[row].bool()
        completion = batch.completion_ids[row, :t]
        pieces["input_ids"].append(torch.cat([batch.prompt_ids[row][kept], completion]))
        for key in batch.prompt_extras:
            values = batch.extras[key][row][kept]
            pieces[key].append(torch.cat([values, values.new_zeros(t)]))
    width = max(len(p) for p in pieces["input_ids"])
    inputs = {
        "input_ids": torch.full((len(rows), width), batch.pad_id, dtype=torch.long),
        "attention_mask": torch.zeros(len(rows), width, dtype=torch.long),
    }
    inputs.update(
        {key: batch.extras[key].new_zeros(len(rows), width) for key in batch.prompt_extras}
    )
    for n, prefix in enumerate(pieces["input_ids"]):
        inputs["input_ids"][n, width - len(prefix) :] = prefix
        inputs["attention_mask"][n, width - len(prefix) :] = 1
        for key in batch.prompt_extras:
            inputs[key][n, width - len(prefix) :] = pieces[key][n]
    for key, values in batch.extras.items():
        if key not in batch.prompt_extras:
            inputs[key] = values[rows.to(values.device)]
    return {key: value.to(device) for key, value in inputs.items()}


def prefix_sampler(policy: Any, batch: RolloutBatch) -> PrefixSampler:
    """The ``PrefixSampler`` of a policy over the completions of ``batch``: each prefix is the
    row's prompt (with its image, for a vision-language policy) and its first t completion
    tokens, completed by the policy's own sampler (same temperature, top-p, top-k and stop
    ids) within the completion's token budget. A language policy's ``generate`` takes the
    prefixes' ids and mask; a vision-language policy's (``rollout.VisionLanguagePolicy``) the
    whole input dict with the rows' pictures."""
    with_images = bool(batch.extras)
    if with_images and not hasattr(policy, "no_image_logprobs"):
        raise TypeError(
            f"the rollout carries inputs besides token ids ({sorted(batch.extras)}), which a "
            f"{type(policy).__name__} does not take: set credit_inspector.deserved to null"
        )
    budget = policy.sampling.max_new_tokens
    pad = batch.pad_id

    def sample(
        rows: torch.Tensor, lengths: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = prefix_inputs(batch, rows, lengths, policy.device)
        with _new_token_budget(policy, budget - int(lengths.min())):
            if with_images:
                generation = policy.generate(inputs, do_sample=True, group_size=k)
            else:
                generation = policy.generate(
                    inputs["input_ids"], inputs["attention_mask"], k, do_sample=True
                )
        tails = generation.completion_ids.to(policy.device)  # (n*K, T'')
        completions = torch.full((len(tails), budget), pad, dtype=torch.long, device=tails.device)
        for j, (row, t) in enumerate(
            zip(
                rows.repeat_interleave(k).tolist(),
                lengths.repeat_interleave(k).tolist(),
                strict=True,
            )
        ):
            completions[j, :t] = batch.completion_ids[row, :t]
            tail = tails[j, : budget - t]
            completions[j, t : t + len(tail)] = tail
        mask = completion_mask_from_eos(completions, policy.eos_ids)
        completions = torch.where(mask.bool(), completions, torch.full_like(completions, pad))
        return completions, mask

    return sample


def reward_scorer(
    reward_fn: Callable[[list[str], torch.Tensor], Mapping[str, torch.Tensor]],
    weights: Mapping[str, float],
    batch: RolloutBatch,
    tokenizer: Any,
) -> Scorer:
    """The ``Scorer`` of a run's reward function: completions decoded as the rollout decodes
    them (special tokens removed), scored against the prompt of their row of ``batch``, the
    named rewards summed with the run's weights (``GRPOConfig.rewards``)."""

    def score(rows: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        texts = tokenizer.batch_decode(ids.cpu(), skip_special_tokens=True)
        rewards = reward_fn(texts, batch.prompt_index.cpu()[rows.cpu()])
        return sum(w * rewards[name].float().cpu() for name, w in weights.items())

    return score
