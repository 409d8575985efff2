"""Typed, validated training configuration built from Kedro parameters.

Every field is documented once, here; ``conf/base/parameters_*.yml`` only sets values.
Validation runs before any model is built so a broken config fails in seconds.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from creditflow.config.values import typed_value
from creditflow.errors import ConfigError

AGG_MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")
# The rollout backend of GRPO and of the evaluations unless one is named: creditflow's decoder
# where it applies (Qwen2-family text models), else model.generate (creditflow.rollout.backends).
DEFAULT_ROLLOUT_BACKEND = "lean"
KL_KINDS = ("k1", "k3")


@dataclass
class GRPOConfig:
    """GRPO engine settings (SPEC section 0).

    steps: rollout/update rounds.
    prompts_per_step: distinct prompts per round; the rollout batch is B = prompts_per_step * group_size.
    group_size: G, completions per prompt.
    num_iterations: optimisation passes over each rollout batch (1 = strictly on-policy).
    minibatch_size: sequences per optimizer step (must divide B); None = the whole batch.
    micro_batch_size: sequences per forward + backward on each process: gradient accumulation
        inside one optimizer step, for memory; each micro-batch's loss is weighted by its share
        of the minibatch's (``algorithms.micro_batch_share``), so the loss and the gradient are
        the minibatch's, for every ``agg``. Must divide the minibatch (per process); None = the
        whole minibatch in one pass.
    learning_rate, weight_decay, max_grad_norm, warmup_steps: AdamW, clipping and a linear
        warm-up (in optimizer steps) followed by cosine decay to 0.
    clip_low, clip_high: PPO ratio clip range [1 - clip_low, 1 + clip_high].
    beta: KL coefficient to the frozen reference (the initial policy); 0 loads no reference.
    kl: KL estimator, one of KL_KINDS.
    agg: loss aggregation, one of AGG_MODES.
    max_new_tokens, temperature, top_p, top_k: sampling.
    rollout: {"name": backend, ...options}: the engine that draws the completions
        (``creditflow.rollout.backends.ROLLOUT_BACKENDS``): ``lean`` (the default:
        creditflow's decoder for Qwen2-family text models; others fall back to ``hf`` with a
        log line), ``hf`` (``model.generate``) or ``vllm`` (an optional extra).
        Vision-language policies always use ``hf``.
    importance_sampling_cap: when the rollout engine is not the trained module (vLLM), the
        per-token ratio pi_trainer(o_t) / pi_sampler(o_t) of the sampling-time log-probs,
        truncated at this cap, multiplies each token's policy-gradient loss (truncated
        importance sampling, TRL's ``vllm_importance_sampling_correction``); None = off.
    entropy_top_p: top-p for the per-token entropy (ToR reasoning tokens).
    logprob_chunk_size: completion positions whose logits are computed at once when scoring
        (``algorithms.token_logprobs``); the backward recomputes each chunk's logits, so no
        (B, T, V) logits tensor is held. None = as many as 2**24 logits hold (64 MiB float32:
        every position of a batch at a small vocabulary, ~110 at Qwen2.5's 151,936).
    gradient_checkpointing: recompute each decoder layer's activations in the backward pass
        instead of keeping them (``transformers``' ``activation_checkpointing_enable``; language
        and vision-language policies only): less memory for about one more forward.
    bf16: run every forward (sampling, scoring, the update) under ``torch.autocast`` in
        bfloat16; weights, gradients and optimizer state stay float32, log-probs are taken in
        float32. Fails before training on a device without bfloat16.
    shared_prefix: score the G completions of a prompt with one forward of the prompt whose KV
        cache is expanded to them (``rollout.shared_prefix``; exact, gradients included),
        instead of G forwards over ``[prompt, completion]``; language policies only, and the
        plain forward still runs where the cache cannot be shared (e.g. under
        ``gradient_checkpointing`` in the update).
    advantage: {"name": strategy, ...strategy options} (training.strategies.ADVANTAGE_STRATEGIES).
    token_weights: {"name": strategy, ...options} (training.strategies.TOKEN_WEIGHT_STRATEGIES).
    rewards: reward name -> weight; the weighted sum is the scalar reward of ``grpo``.
    reward_options: reward name -> keyword options of that reward function, e.g.
        ``{"reasoning": {"budget_s": 30.0}}`` (``creditflow.rewards.check_reward_options``;
        checked against the computed rewards by ``grpo_runs.build_grpo_config``).
    seed: seeds prompt order, sampling and tie-breaking.
    checkpoint_every: save a resumable checkpoint every N steps (0 = only at the end).
    keep_checkpoints: how many checkpoints to keep on disk.
    log_samples_every: record sample completions every N steps; samples_per_log: how many.
    """

    steps: int = 20
    prompts_per_step: int = 8
    group_size: int = 8
    num_iterations: int = 1
    minibatch_size: int | None = None
    micro_batch_size: int | None = None
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 2
    clip_low: float = 0.2
    clip_high: float = 0.2
    beta: float = 0.0
    kl: str = "k3"
    agg: str = "seq-mean-token-mean"
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    rollout: dict[str, Any] = field(default_factory=lambda: {"name": DEFAULT_ROLLOUT_BACKEND})
    importance_sampling_cap: float | None = None
    entropy_top_p: float = 0.95
    logprob_chunk_size: int | None = None
    gradient_checkpointing: bool = False
    bf16: bool = False
    shared_prefix: bool = True
    advantage: dict[str, Any] = field(default_factory=lambda: {"name": "grpo"})
    token_weights: dict[str, Any] = field(default_factory=lambda: {"name": "uniform"})
    rewards: dict[str, float] = field(default_factory=lambda: {"reasoning": 1.0})
    reward_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed: int = 0
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    log_samples_every: int = 5
    samples_per_log: int = 4

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> GRPOConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ConfigError(
                f"unknown GRPO parameter(s) {unknown}; valid keys are {sorted(known)}"
            )
        hints = typing.get_type_hints(cls)
        config = cls(**{key: typed_value(key, value, hints[key]) for key, value in params.items()})
        config.validate()
        return config

    @property
    def rollout_batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def validate(self) -> None:
        """The engine's own fields; the strategy specs (``advantage``, ``token_weights``) are
        checked beside the strategies, by ``training.strategies.validate_strategies``."""

        def need(condition: bool, message: str) -> None:
            if not condition:
                raise ConfigError(message)

        for name in ("steps", "prompts_per_step", "group_size", "num_iterations", "max_new_tokens"):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        need(
            self.group_size >= 2,
            f"group_size must be >= 2 for group-relative advantages, got {self.group_size}",
        )
        B = self.rollout_batch_size
        if self.minibatch_size is not None:
            need(
                self.minibatch_size >= 1 and B % self.minibatch_size == 0,
                f"minibatch_size ({self.minibatch_size}) must divide the rollout batch "
                f"prompts_per_step * group_size = {B}; pick a divisor of {B} or null",
            )
        minibatch = self.minibatch_size or B
        if self.micro_batch_size is not None:
            need(
                self.micro_batch_size >= 1 and minibatch % self.micro_batch_size == 0,
                f"micro_batch_size ({self.micro_batch_size}) must divide the minibatch "
                f"({'minibatch_size' if self.minibatch_size else 'the rollout batch'} = "
                f"{minibatch}); pick a divisor of {minibatch} or null",
            )
        if self.logprob_chunk_size is not None:
            need(
                self.logprob_chunk_size >= 1,
                f"logprob_chunk_size must be >= 1 or null, got {self.logprob_chunk_size}",
            )
        need(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        need(0 <= self.clip_low < 1, f"clip_low must be in [0, 1), got {self.clip_low}")
        need(self.clip_high >= 0, f"clip_high must be >= 0, got {self.clip_high}")
        need(self.beta >= 0, f"beta must be >= 0, got {self.beta}")
        need(self.kl in KL_KINDS, f"kl must be one of {list(KL_KINDS)}, got {self.kl!r}")
        need(self.agg in AGG_MODES, f"agg must be one of {list(AGG_MODES)}, got {self.agg!r}")
        need(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        need(
            0 < self.entropy_top_p <= 1,
            f"entropy_top_p must be in (0, 1], got {self.entropy_top_p}",
        )
        need(bool(self.rewards), "rewards must name at least one reward with a weight")
        need(
            self.importance_sampling_cap is None or self.importance_sampling_cap >= 1,
            f"importance_sampling_cap must be >= 1 or null, got {self.importance_sampling_cap}",
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_importance_sampling(cap: float | None, samples_module: bool, rollout: str) -> None:
    """ConfigError when truncated importance sampling (``importance_sampling_cap``) is asked
    of a rollout backend that samples the trained module itself: there is no sampler /
    trainer mismatch to correct."""
    if cap is not None and samples_module:
        raise ConfigError(
            "importance_sampling_cap corrects a rollout engine whose sampler is not the "
            f"trained module (e.g. rollout: {{name: vllm}}); rollout {rollout!r} samples the "
            "module itself: set importance_sampling_cap to null"
        )
