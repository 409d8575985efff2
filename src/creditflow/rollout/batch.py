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
        truncated: (B,) bool, True where the completion reached ``max_new_tokens`` without a
            stop token (``FINISH_LENGTH``); None when the policy does not report it.
        pad_id: the token id that pads ``prompt_ids`` and ``completion_ids`` (``concat_batches``
            pads with it).
        prompt_extras: the keys of ``extras`` aligned with the prompt tokens, ``(B, P)``,
            left-padded like ``prompt_ids`` (e.g. ``mm_token_type_ids``).
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
    truncated: torch.Tensor | None = None
    pad_id: int = 0
    prompt_extras: tuple[str, ...] = ()

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


def _pad_to(tensor: torch.Tensor, shape: tuple[int, ...], value: float, left: bool) -> torch.Tensor:
    """``tensor`` padded with ``value`` to ``shape`` (same leading dimension): on the left of
    dimension 1 when ``left``, else at the end of every dimension after the first."""
    if tuple(tensor.shape) == shape:
        return tensor
    out = torch.full(shape, value, dtype=tensor.dtype, device=tensor.device)
    if left:
        out[:, shape[1] - tensor.shape[1] :] = tensor
    else:
        out[tuple(slice(0, n) for n in tensor.shape)] = tensor
    return out


def _cat(parts: list[torch.Tensor], value: float, left: bool = False) -> torch.Tensor:
    shape = tuple(max(p.shape[d] for p in parts) for d in range(1, parts[0].dim()))
    return torch.cat([_pad_to(p, (p.shape[0], *shape), value, left) for p in parts])


def concat_batches(batches: list[RolloutBatch]) -> RolloutBatch:
    """The rows of ``batches``, in order, as one batch (e.g. the groups dynamic sampling kept
    from several draws): prompts and prompt-aligned extras left-padded to the longest prompt,
    completions right-padded to the longest completion (ids with ``pad_id``, masks and
    log-probs with 0), other per-row extras zero-padded at the end of each dimension (the
    vision policy's per-row pixel blocks). Every batch must share ``group_size``, ``pad_id``,
    ``prompt_extras`` and whether ``old_logp``, ``entropy``, ``sampler_logp`` and
    ``truncated`` are set."""
    first = batches[0]
    for other in batches[1:]:
        same = (other.group_size, other.pad_id, other.prompt_extras) == (
            first.group_size,
            first.pad_id,
            first.prompt_extras,
        )
        for name in ("old_logp", "entropy", "sampler_logp", "truncated"):
            a, b = getattr(first, name), getattr(other, name)
            same &= (a is None) == (b is None) and (a is None or (a.numel() > 0) == (b.numel() > 0))
        if not same or set(other.extras) != set(first.extras):
            raise ValueError("concat_batches needs batches from one policy with one setup")

    def optional(name: str, value: float) -> torch.Tensor | None:
        parts = [getattr(b, name) for b in batches]
        if parts[0] is None:
            return None
        return parts[0] if parts[0].numel() == 0 else _cat(parts, value)

    extras = {}
    for key, value in first.extras.items():
        rows = isinstance(value, torch.Tensor) and value.shape[:1] == (first.batch_size,)
        if not rows:
            extras[key] = value  # shared by every row, as ``select`` keeps it
            continue
        extras[key] = _cat([b.extras[key] for b in batches], 0, left=key in first.prompt_extras)
    return replace(
        first,
        prompt_ids=_cat([b.prompt_ids for b in batches], first.pad_id, left=True),
        prompt_mask=_cat([b.prompt_mask for b in batches], 0, left=True),
        completion_ids=_cat([b.completion_ids for b in batches], first.pad_id),
        completion_mask=_cat([b.completion_mask for b in batches], 0),
        old_logp=optional("old_logp", 0.0),
        completion_texts=[text for b in batches for text in b.completion_texts],
        prompt_index=torch.cat([b.prompt_index for b in batches]),
        entropy=optional("entropy", 0.0),
        sampler_logp=optional("sampler_logp", 0.0),
        truncated=optional("truncated", False),
        extras=extras,
    )


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
