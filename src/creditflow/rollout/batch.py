"""The rollout batch every policy returns and every strategy reads.

Shape symbols: B sequences (= prompts x G), G group size, P prompt tokens, T completion tokens.
Masks follow one convention: 1 means the token counts, 0 is padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch


@dataclass
class RolloutBatch:
    """G sampled completions per prompt, grouped consecutively (rows g*G .. g*G+G-1 share a prompt).

    Attributes:
        prompt_ids: (B, P) long, left-padded.
        prompt_mask: (B, P) long, 1 on real prompt tokens.
        completion_ids: (B, T) long, right-padded.
        completion_mask: (B, T) float, 1 up to and including the first EOS.
        old_logp: (B, T) float, log-probs of the completion tokens under the sampling policy;
            empty (numel 0) when the rollout was sampled with ``with_logprobs=False``.
        completion_texts: B decoded completions (special tokens removed).
        prompt_index: (B,) long, row of the prompt table each sequence answers.
        group_size: G.
        entropy: (B, T) top-p entropy of the sampling distribution, when it was asked for.
        extras: model inputs that travel with the prompt (e.g. ``pixel_values``), keyed by name.
        sampler_logp: (B, T) log-probs of the completion tokens under the rollout engine's
            own sampler, when the backend reports them (``rollout.backends.Generation``); the
            loss's truncated importance-sampling correction reads them.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    old_logp: torch.Tensor
    completion_texts: list[str]
    prompt_index: torch.Tensor
    group_size: int
    entropy: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    sampler_logp: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The sub-batch of the given rows (e.g. one minibatch); groups are not kept intact."""
        rows_list = rows.tolist()
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and value.numel() > 0:  # old_logp may be unscored
                picked[f.name] = value[rows]
            elif f.name == "completion_texts":
                picked[f.name] = [value[i] for i in rows_list]
        picked["extras"] = {
            k: (v[rows] if isinstance(v, torch.Tensor) and v.shape[:1] == (self.batch_size,) else v)
            for k, v in self.extras.items()
        }
        return replace(self, **picked)


@runtime_checkable
class Policy(Protocol):
    """What the GRPO engine needs from a policy (a language model or the generative reranker).

    ``module`` is the trainable ``torch.nn.Module``; ``sample`` draws G completions per prompt
    with the current weights; ``completion_logprobs`` recomputes, with gradients, the log-probs
    (and on request the per-token top-p entropy) of the completions in a batch.
    ``samples_module``: whether ``sample`` runs ``module`` itself (False when a rollout engine
    with its own copy of the weights samples, e.g. vLLM); ``weights_updated`` is called after
    every optimizer step on ``module``.
    """

    module: torch.nn.Module
    samples_module: bool

    def weights_updated(self) -> None: ...

    def sample(
        self,
        prompts: list[Any],
        group_size: int,
        with_entropy: bool = False,
        with_logprobs: bool = True,
    ) -> RolloutBatch: ...

    def completion_logprobs(
        self, batch: RolloutBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class SamplesOwnModule:
    """Mixin of the policies that always sample with their trained module: on-policy by
    construction, with no engine copy of the weights to keep in step."""

    samples_module: ClassVar[bool] = True

    def weights_updated(self) -> None:
        """Nothing to copy: the next sample runs the updated module."""
