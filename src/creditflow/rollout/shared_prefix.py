"""Score the G completions of a prompt with one forward of that prompt.

Shape symbols: B rows, N runs (maximal blocks of consecutive rows with the same prompt ids and
mask; a GRPO batch has one per prompt, of length G), P prompt tokens (left-padded), T completion
tokens (right-padded), H hidden size.

The plain scoring forward runs every row over ``[prompt, completion]``, so each prompt G times.
Here each run's prompt goes through the model once with a KV cache; every layer's cached keys and
values are repeated to the rows of their run (``repeat_interleave``, whose backward sums the
rows' gradients into the prompt's); then the completions run on top of the cache with the full
``(B, P + T)`` attention mask and the position ids the plain forward uses. Every completion
token attends to the same keys and values at the same positions as in the plain forward, so
log-probs and gradients are the plain forward's up to float rounding.

A vision-language model (Qwen2.5-VL) takes the same path with two additions: its inputs that
belong to the prompt (pixels, image grid, token types) go to the prompt pass only, and its 3-D
rope positions, which ``get_rope_index`` derives from the whole sequence, are computed by the
caller over ``[prompt, completion]`` as the plain forward computes them and split here between
the two passes (``position_ids`` (3, B, P + T)). Rows whose images differ are not one run even
when their prompt ids are equal (``run_keys``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from creditflow.rollout.modules import bare_module, output_head_inputs


def prompt_runs(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *run_keys: torch.Tensor
) -> torch.Tensor:
    """(N,) lengths of the runs of consecutive rows with identical prompt ids and mask (and
    identical ``run_keys`` rows), in row order (they sum to B); a row whose neighbours differ is
    a run of 1.

    prompt_ids, prompt_mask: (B, P); run_keys: (B, ...) each, e.g. a row's image pixels.

    >>> ids = torch.tensor([[5, 6], [5, 6], [0, 7], [5, 6]])
    >>> prompt_runs(ids, (ids > 0).long()).tolist()
    [2, 1, 1]
    """
    same = torch.ones(len(prompt_ids) - 1, dtype=torch.bool, device=prompt_ids.device)
    for key in (prompt_ids, prompt_mask):
        same &= (key[1:] == key[:-1]).all(dim=1)  # (B-1,) row b+1 continues row b's run
    for key in run_keys:  # wide (a row's pixels): compared only where the ids already agree
        pairs = same.nonzero().squeeze(1)  # (M,)
        flat = key.reshape(len(key), -1)
        same[pairs] = (flat[pairs + 1] == flat[pairs]).all(dim=1)
    starts = torch.cat([same.new_ones(1), ~same]).nonzero().squeeze(1)  # (N,) first rows
    return torch.diff(starts, append=starts.new_tensor([len(prompt_ids)]))  # (N,)


def sequence_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) position ids of ``attention_mask`` (B, L): real tokens count 0, 1, ..., padding
    repeats its neighbour's, as ``generate`` numbers left-padded prompts; without this the
    recomputed log-probs drift from the sampling ones."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def plain_forward_inputs(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    **extras: Any,
) -> dict[str, Any]:
    """Inputs of the plain forward over ``[prompt, completion]`` (B, P + T) keeping the T + 1
    last positions (the last one predicts past the completion and is dropped)."""
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    return {
        "input_ids": torch.cat([prompt_ids, completion_ids], dim=1),  # (B, P+T)
        "attention_mask": attention_mask,  # (B, P+T)
        "position_ids": sequence_positions(attention_mask),  # (B, P+T)
        "logits_to_keep": completion_ids.shape[1] + 1,
        "use_cache": False,  # a scoring pass needs no KV cache
        **extras,
    }


def cache_argument(model: torch.nn.Module) -> str | None:
    """The name under which ``model.forward`` takes a KV cache (``cache`` since transformers
    5.x, ``past_key_values`` before), or None when it takes none."""
    parameters = inspect.signature(model.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def why_not_shared(model: torch.nn.Module, multimodal: bool = False) -> str | None:
    """Why the shared-prefix forward could not equal the plain one for ``model`` (the bare
    model, not a DDP wrapper), or None when it can.

    - not a ``transformers`` decoder-only text LM: an encoder-decoder has no prompt to cache,
      and a multimodal model (Qwen2.5-VL) derives its 3D rope positions from the whole
      sequence, which a forward over the completions alone does not see (``multimodal``:
      the caller passes those positions, computed over the whole sequence, so a model whose
      text config is a sub-config is accepted);
    - no cache argument in its forward;
    - cache layers other than a plain growing one (sliding window, linear attention,
      quantized): their cached states are not the prompt's keys and values as computed;
    - activation checkpointing while training with gradients: transformers then drops the
      cache (``GradientCheckpointingLayer``), so the completions would not see the prompt.
    """
    if not isinstance(model, PreTrainedModel):
        return f"{type(model).__name__} is not a transformers model"
    config = model.config
    if config.is_encoder_decoder or (
        not multimodal and config.get_text_config(decoder=True) is not config
    ):
        return f"{type(model).__name__} is not a decoder-only text LM"
    if cache_argument(model) is None:
        return f"{type(model).__name__}.forward takes no KV cache"
    if any(type(layer) is not DynamicLayer for layer in DynamicCache(config=config).layers):
        return f"{type(model).__name__}'s cache layers are not all full-attention DynamicLayers"
    if model.training and torch.is_grad_enabled() and model.is_activation_checkpointing:
        return "activation checkpointing drops the KV cache in a training forward"
    return None


def shared_prefix_hidden(
    module: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    position_ids: torch.Tensor | None = None,
    prompt_inputs: Callable[[torch.Tensor], dict[str, Any]] | None = None,
    run_keys: Sequence[torch.Tensor] = (),
    **extras: Any,
) -> torch.Tensor:
    """(B, T, H) hidden states that predict each completion token (the output head's inputs,
    with grad when enabled), running each run of identical prompts once.

    Equal to ``output_head_inputs(module, **plain_forward_inputs(...))[:, :-1]``, which it
    falls back to when sharing could not be exact or would gain nothing: the reasons of
    ``why_not_shared``, ``extras`` given (model inputs such as pixels, which may belong to the
    prompt or the whole sequence), or no run longer than one row.

    Args:
        module: a causal LM, or the DDP wrapper the trainer routes the update through.
        prompt_ids: (B, P) long, left-padded.
        prompt_mask: (B, P), 1 on real prompt tokens.
        completion_ids: (B, T) long, right-padded.
        completion_mask: (B, T), 1 on real completion tokens.
        position_ids: (B, P + T) or (3, B, P + T) positions of the whole sequence, as the
            plain forward would use them (a vision-language model's 3-D rope positions);
            None: ``sequence_positions`` of the attention mask. Given, they are what the
            model would derive from the whole sequence, so a multimodal model may share
            (``why_not_shared(multimodal=True)``).
        prompt_inputs: given the (N,) first row of each run, the further inputs of the
            prompt pass (a vision-language model's pixels and image grids of those rows); the
            plain fallback calls it with ``arange(B)``.
        run_keys: (B, ...) tensors whose rows must also be equal within a run (the pixels).
        extras: further model inputs of the plain forward.
    """
    model = bare_module(module)
    runs = prompt_runs(prompt_ids, prompt_mask, *run_keys)  # (N,)
    B, P = prompt_ids.shape
    T = completion_ids.shape[1]
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    multimodal = position_ids is not None
    if position_ids is None:
        position_ids = sequence_positions(attention_mask)  # (B, P+T)
    more_prompt_inputs = prompt_inputs or (lambda rows: {})
    if extras or len(runs) == B or why_not_shared(model, multimodal) is not None:
        inputs = plain_forward_inputs(
            prompt_ids, prompt_mask, completion_ids, completion_mask, **extras
        )
        inputs["position_ids"] = position_ids
        inputs.update(more_prompt_inputs(torch.arange(B, device=prompt_ids.device)))
        return output_head_inputs(module, **inputs)[:, :-1]  # (B, T, H)
    first = torch.cumsum(runs, dim=0) - runs  # (N,) first row of each run
    cache = DynamicCache(config=model.config)
    cache_kw = cache_argument(model)
    # The prompts go through the bare model, the completions through `module`: a DDP wrapper
    # expects one forward per backward. The prompt pass's gradients reach the parameters
    # through the autograd graph all the same, and DDP reduces each parameter's total.
    last = output_head_inputs(
        model,
        input_ids=prompt_ids[first],
        attention_mask=prompt_mask[first],
        position_ids=position_ids[..., first, :P],
        logits_to_keep=1,
        use_cache=True,
        **{cache_kw: cache},
        **more_prompt_inputs(first),
    )  # (N, 1, H): the last prompt position predicts completion token 0
    for layer in cache.layers:
        layer.keys = layer.keys.repeat_interleave(runs, dim=0, output_size=B)  # (B, KV, P, D)
        layer.values = layer.values.repeat_interleave(runs, dim=0, output_size=B)
    hidden = last.repeat_interleave(runs, dim=0, output_size=B)  # (B, 1, H)
    if T == 1:
        return hidden
    rest = output_head_inputs(
        module,
        input_ids=completion_ids[:, :-1],  # the last token predicts past the completion
        attention_mask=attention_mask[:, :-1],  # (B, P+T-1): the cache's columns, then these
        position_ids=position_ids[..., P:-1],
        logits_to_keep=T - 1,
        use_cache=True,
        **{cache_kw: cache},
    )  # (B, T-1, H): completion tokens 0..T-2 predict tokens 1..T-1
    return torch.cat([hidden, rest], dim=1)  # (B, T, H)
