"""The rollout-backend protocol: how a policy's completions are drawn.

A backend turns token-id prompts into sampled completion ids. Policies keep everything else:
tokenisation, ``RolloutBatch`` assembly and the scoring forward pass whose log-probs the loss
uses. A backend is chosen by name in ``grpo.rollout: {name: ..., ...options}``
(``creditflow.rollout.backends.ROLLOUT_BACKENDS``).

Shape symbols: N prompts, G completions per prompt, B = N * G rows (the G rows of a prompt
consecutive), P prompt tokens (left-padded), T completion tokens (right-padded).

Weights: ``hf`` and ``lean`` sample from the trained module itself (``samples_module`` is
True), so they are always current. An engine that holds its own copy of the weights (vLLM)
is told of every optimizer step (``GenerationRequest.weights_version``) and reloads before it
samples when its copy is older; the policy checks the version it reports afterwards, so a
sample from stale weights fails instead of training on the wrong distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import torch

FINISH_STOP = "stop"  # the completion ended on one of the stop ids (kept in the completion)
FINISH_LENGTH = "length"  # it reached max_new_tokens without a stop id


@dataclass(frozen=True)
class GenerationRequest:
    """N prompts to complete G times each.

    Attributes:
        prompt_ids: ``(N, P)`` long, left-padded with ``pad_id``.
        prompt_mask: ``(N, P)`` long, 1 on real prompt tokens.
        group_size: G, completions per prompt (rows ``n*G .. n*G+G-1`` answer prompt ``n``).
        max_new_tokens: the most tokens a completion may have.
        temperature, top_p, top_k: the sampler (``top_k`` 0 = off); ignored when
            ``do_sample`` is False (greedy decoding).
        stop_ids: ids that end a completion (kept as its last token).
        pad_id: the id written after a completion's end.
        suppressed_ids: ids that are never sampled (a vision-language model's image markers).
        do_sample: False = greedy (evaluation).
        weights_version: how many optimizer steps the trained module has taken; an engine
            with its own copy of the weights must sample with this version.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    group_size: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_ids: tuple[int, ...] = ()
    pad_id: int = 0
    suppressed_ids: tuple[int, ...] = ()
    do_sample: bool = True
    weights_version: int = 0

    @property
    def num_rows(self) -> int:
        return self.prompt_ids.shape[0] * self.group_size


@dataclass
class Generation:
    """A backend's answer to a ``GenerationRequest``.

    Attributes:
        completion_ids: ``(B, T)`` long, right-padded with ``pad_id`` after each row's first
            stop id (which is kept); T is at most ``max_new_tokens``.
        finish_reasons: B of ``FINISH_STOP`` / ``FINISH_LENGTH``.
        sampler_logp: ``(B, T)`` float log-probs of the sampled tokens under the engine's own
            sampling distribution (after temperature), when the engine reports them; None
            otherwise. Padding positions are 0.
        weights_version: the weights version the engine sampled with.
        logp, entropy: ``(B, T)`` float32 log-probs of the sampled tokens under the model's
            own distribution at the sampling temperature (no suppressed ids, top-k or top-p:
            what the policy's scoring forward computes) and its top-p entropy, when the engine
            was asked for them (``lean``'s ``ScoreSettings``); None otherwise. Padding is 0.
    """

    completion_ids: torch.Tensor
    finish_reasons: list[str]
    sampler_logp: torch.Tensor | None = None
    weights_version: int = 0
    logp: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    timings: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class RolloutBackend(Protocol):
    """An engine that samples completions for a policy.

    ``name`` is its key in ``ROLLOUT_BACKENDS``. ``samples_module``: True when ``generate``
    runs ``module`` itself (so its samples are on-policy and ``load_weights`` has nothing to
    do); False for an engine with its own copy of the weights, whose sampler may differ
    numerically from the trainer's forward (the loss may then correct with truncated
    importance sampling, ``GRPOConfig.importance_sampling_cap``).
    """

    name: ClassVar[str]
    samples_module: ClassVar[bool]

    def generate(self, module: torch.nn.Module, request: GenerationRequest) -> Generation:
        """Sample ``request.group_size`` completions for each prompt of ``request``."""
        ...

    def load_weights(self, module: torch.nn.Module, version: int) -> None:
        """Copy ``module``'s current weights into the engine and remember ``version``."""
        ...


def completion_mask_from_eos(completion_ids: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """(B, T) float mask: 1 up to and including the first EOS of each row, all 1 when none.

    completion_ids: (B, T) long.
    """
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    T = completion_ids.shape[1]
    positions = torch.arange(T, device=completion_ids.device).expand_as(completion_ids)
    first_eos = torch.where(is_eos, positions, torch.full_like(positions, T)).min(dim=1).values
    return (positions <= first_eos.unsqueeze(1)).float()


def finish_reasons(completion_ids: torch.Tensor, stop_ids: list[int]) -> list[str]:
    """B of ``FINISH_STOP`` (the row holds a stop id) / ``FINISH_LENGTH``."""
    stopped = torch.isin(completion_ids, torch.tensor(stop_ids, device=completion_ids.device))
    return [FINISH_STOP if s else FINISH_LENGTH for s in stopped.any(dim=1).tolist()]


def unsupported_reason(backend: RolloutBackend, module: torch.nn.Module) -> str | None:
    """Why ``backend`` cannot sample from ``module`` (None: it can); backends without a
    ``supports`` check are taken to support every module."""
    check = getattr(type(backend), "unsupported_reason", None)
    return None if check is None else check(backend, module)
