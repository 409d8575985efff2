"""A GRPO policy around any ``transformers`` causal LM and its tokenizer.

Shape symbols: N prompts, G completions per prompt, B = N * G sequences, P prompt tokens
(left-padded), T completion tokens (right-padded), H hidden size, V vocabulary. Sampling goes
through a rollout backend (``creditflow.rollout.backends``: ``hf``'s ``model.generate`` by
default, the ``lean`` decoder, vLLM). Log-probs are recomputed by a forward over
``[prompt, completion]`` that stops before the output head; with ``shared_prefix`` each run of
rows with one prompt runs that prompt once and shares its KV cache (``rollout.shared_prefix``,
exact, gradients included), else one forward per batch (``output_head_inputs``). The head is
then applied a chunk of positions at a time (``algorithms.token_logprobs``), so no
``(B, T, V)`` logits tensor is ever held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from creditflow.algorithms import token_logprobs
from creditflow.models.tokenizer import Prompt, chat_messages
from creditflow.rollout.backends import (
    FINISH_LENGTH,
    GenerationRequest,
    RolloutBackend,
    StaleWeightsError,
    completion_mask_from_eos,
)
from creditflow.rollout.backends.hf import HFBackend
from creditflow.rollout.batch import RolloutBatch
from creditflow.rollout.modules import output_head, output_head_inputs
from creditflow.rollout.shared_prefix import shared_prefix_hidden


@dataclass(frozen=True)
class SamplingSettings:
    """How completions are drawn. ``temperature`` also divides the logits when log-probs are
    recomputed, so old and new log-probs describe the distribution that was sampled from."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    entropy_top_p: float = 0.95  # ToR's top-p for the reasoning-token entropy (docs/methods/tor.md)
    # Positions whose logits are computed at once when scoring (algorithms.token_logprobs);
    # None: as many as 2**24 logits hold (every position at a small vocabulary).
    logprob_chunk_size: int | None = None
    # Score each run of rows with the same prompt with one forward of that prompt and its KV
    # cache expanded to the rows (rollout.shared_prefix); exact, language policies only.
    shared_prefix: bool = True

    def request(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        group_size: int,
        stop_ids: list[int],
        pad_id: int,
        do_sample: bool = True,
        suppressed_ids: tuple[int, ...] = (),
        weights_version: int = 0,
    ) -> GenerationRequest:
        """The rollout backend's request for ``(N, P)`` prompts under these settings."""
        return GenerationRequest(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            group_size=group_size,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop_ids=tuple(stop_ids),
            pad_id=pad_id,
            suppressed_ids=tuple(suppressed_ids),
            do_sample=do_sample,
            weights_version=weights_version,
        )

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.logprob_chunk_size is not None and self.logprob_chunk_size < 1:
            raise ValueError(
                f"logprob_chunk_size must be >= 1 or None, got {self.logprob_chunk_size}"
            )


def stop_token_ids(model, tokenizer) -> list[int]:
    """The ids that end a completion: the model's generation config, else the tokenizer's EOS.
    Also checks the tokenizer can pad a batch, which every policy needs."""
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token before training")
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos)


def score_completions(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    completion_ids: torch.Tensor,
    sampling: SamplingSettings,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, T) log-probs of ``completion_ids`` (with grad when enabled) from the hidden states
    that predict them, ``hidden`` (B, T, H), under ``head`` at the sampling temperature; on
    request the (B, T) top-p entropy of the same distributions (no grad)."""
    return token_logprobs(
        hidden,
        head.weight,
        completion_ids,
        bias=head.bias,
        temperature=sampling.temperature,
        chunk_size=sampling.logprob_chunk_size,
        entropy_top_p=sampling.entropy_top_p if with_entropy else None,
    )


class LanguagePolicy:
    """Samples and scores completions of a causal LM for chat-formatted prompts.

    Args:
        model: a ``transformers`` causal LM (``AutoModelForCausalLM``-like).
        tokenizer: its tokenizer; must have a pad token and a chat template (or ``use_chat_template=False``).
        sampling: generation settings.
        use_chat_template: wrap each prompt as a user turn with ``apply_chat_template``.
        backend: the engine that draws the completions (``rollout.backends.rollout_backend``);
            None: ``hf`` (``model.generate``).

    ``weights_version`` counts the optimizer steps taken on ``model`` (the trainer calls
    ``weights_updated`` after each); a backend with its own copy of the weights is reloaded
    before it samples whenever its copy is older.
    """

    def __init__(
        self,
        model,
        tokenizer,
        sampling: SamplingSettings,
        use_chat_template: bool = True,
        backend: RolloutBackend | None = None,
    ):
        self.module = model
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.use_chat_template = use_chat_template
        self.eos_ids = stop_token_ids(model, tokenizer)
        self.backend = backend if backend is not None else HFBackend()
        self.weights_version = 0
        self._backend_version: int | None = None  # the version last loaded into the backend

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def samples_module(self) -> bool:
        """Whether completions are sampled by ``module`` itself (else by an engine's copy)."""
        return self.backend.samples_module

    def weights_updated(self) -> None:
        """The trainer took an optimizer step on ``module``."""
        self.weights_version += 1

    def format_prompt(self, prompt: Prompt) -> str:
        """The text the model reads: ``prompt`` rendered by the chat template (text as one
        user turn, chat messages as they are: ``models.chat_messages``), or text as it is
        without the template."""
        if not self.use_chat_template:
            if not isinstance(prompt, str):
                raise ValueError("chat-message prompts need use_chat_template=True")
            return prompt
        return self.tokenizer.apply_chat_template(
            chat_messages(prompt), add_generation_prompt=True, tokenize=False
        )

    def encode_prompts(self, prompts: list[Prompt]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded (B, P) ids and mask for the chat-formatted prompts."""
        self.tokenizer.padding_side = "left"
        enc = self.tokenizer(
            [self.format_prompt(p) for p in prompts],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
        )
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    @torch.no_grad()
    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int, do_sample: bool
    ):
        """The backend's ``Generation`` for ``(N, P)`` prompts, G rows each; a backend with its
        own weights is brought up to ``weights_version`` first, and a sample drawn with other
        weights raises ``StaleWeightsError``."""
        if not self.backend.samples_module and self._backend_version != self.weights_version:
            self.backend.load_weights(self.module, self.weights_version)
            self._backend_version = self.weights_version
        request = self.sampling.request(
            prompt_ids,
            prompt_mask,
            group_size,
            self.eos_ids,
            self.tokenizer.pad_token_id,
            do_sample=do_sample,
            weights_version=self.weights_version,
        )
        was_training = self.module.training
        self.module.eval()
        try:
            generation = self.backend.generate(self.module, request)
        finally:
            self.module.train(was_training)
        if generation.weights_version != self.weights_version:
            raise StaleWeightsError(
                f"rollout backend {self.backend.name!r} sampled with weights version "
                f"{generation.weights_version}, the policy is at {self.weights_version}"
            )
        return generation

    @torch.no_grad()
    def sample(
        self,
        prompts: list[str],
        group_size: int,
        with_entropy: bool = False,
        with_logprobs: bool = True,
    ) -> RolloutBatch:
        """Draw ``group_size`` completions per prompt; rows of one prompt are consecutive.
        ``old_logp`` (and ``entropy`` when asked) come from one extra forward pass, as do the
        log-probs the loss compares the sampler's with (``sampler_logp``, when the backend
        reports them)."""
        prompt_ids, prompt_mask = self.encode_prompts(prompts)  # (N, P)
        generation = self.generate(prompt_ids, prompt_mask, group_size, do_sample=True)
        completion_ids = generation.completion_ids  # (B, T)
        completion_mask = completion_mask_from_eos(completion_ids, self.eos_ids)  # (B, T)
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        batch = RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(group_size, dim=0),  # (B, P)
            prompt_mask=prompt_mask.repeat_interleave(group_size, dim=0),  # (B, P)
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            old_logp=torch.empty(0),
            completion_texts=texts,
            prompt_index=torch.arange(len(prompts)).repeat_interleave(group_size),
            group_size=group_size,
            sampler_logp=generation.sampler_logp,
            truncated=torch.tensor(
                [r == FINISH_LENGTH for r in generation.finish_reasons],
                dtype=torch.bool,
                device=completion_ids.device,
            ),
            pad_id=self.tokenizer.pad_token_id,
        )
        # with_logprobs=False: the trainer will use the update's own log-probs (one optimizer
        # step per rollout), so the extra scoring forward is skipped.
        if with_logprobs or with_entropy:
            batch.old_logp, batch.entropy = self.completion_logprobs(batch, with_entropy)
        return batch

    @torch.no_grad()
    def greedy(self, prompts: list[Prompt]) -> list[str]:
        """Greedy decodes of ``prompts`` (one batch), special tokens removed."""
        prompt_ids, prompt_mask = self.encode_prompts(list(prompts))
        generation = self.generate(prompt_ids, prompt_mask, group_size=1, do_sample=False)
        return self.tokenizer.batch_decode(generation.completion_ids, skip_special_tokens=True)

    def _forward_inputs(self, batch: RolloutBatch) -> dict[str, Any]:
        """Inputs of one forward over ``[prompt, completion]`` that keeps the T + 1 last
        positions (the last one predicts past the completion and is dropped)."""
        input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (B, P+T)
        attention_mask = torch.cat([batch.prompt_mask, batch.completion_mask.long()], dim=1)
        # Positions count real tokens only, as generate() does for left-padded prompts;
        # without this the recomputed log-probs drift from the sampling ones.
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "logits_to_keep": batch.completion_ids.shape[1] + 1,
            "use_cache": False,  # a scoring pass needs no KV cache
            **batch.extras,
        }

    def completion_logits(self, batch: RolloutBatch) -> torch.Tensor:
        """(B, T, V) temperature-scaled logits that predict each completion token: the plain
        single-pass path ``completion_logprobs`` is checked against (it holds all of them)."""
        out = self.module(**self._forward_inputs(batch))
        return out.logits[:, :-1, :].float() / self.sampling.temperature  # (B, T, V)

    def completion_logprobs(
        self, batch: RolloutBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T) log-probs of the completion tokens (with grad when enabled), and on request the
        (B, T) top-p entropy of the next-token distribution (no grad); the logits are computed a
        chunk of positions at a time (``SamplingSettings.logprob_chunk_size``). With
        ``SamplingSettings.shared_prefix`` each prompt of a run of rows runs once
        (``rollout.shared_prefix``), else every row runs over ``[prompt, completion]``."""
        if self.sampling.shared_prefix:
            hidden = shared_prefix_hidden(
                self.module,
                batch.prompt_ids,
                batch.prompt_mask,
                batch.completion_ids,
                batch.completion_mask,
                **batch.extras,
            )  # (B, T, H)
        else:
            hidden = output_head_inputs(self.module, **self._forward_inputs(batch))[:, :-1]
        return score_completions(
            hidden, output_head(self.module), batch.completion_ids, self.sampling, with_entropy
        )
