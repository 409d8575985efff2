"""Typed, validated training configuration built from Kedro parameters.

``GRPOConfig`` is a pydantic model: every field has its type, default, group and one-line
description here, and nowhere else (the parameter reference is generated from them;
``conf/base/parameters_*.yml`` only sets values). Building one checks it whole (types,
ranges, the loss type's presets, the cross-field rules), so an object of this type is a
valid config and the code below the parameters takes it as it is. Validation runs before any
model is built, so a broken config fails in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from creditflow.config.grpo_options import (
    CovarianceControl,
    DynamicSampling,
    GRPOOption,
    OverlongShaping,
    PerceptionLoss,
    parse_option,
)
from creditflow.config.loss_types import DEFAULTED, DEFINING, resolve_loss_knobs
from creditflow.config.schema import unknown_keys_message, validation_message
from creditflow.errors import ConfigError

AGG_MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum")
# The names of algorithms.IMPORTANCE_LEVELS and algorithms.SURROGATES (this module stays
# torch-free; a test holds them equal).
IMPORTANCE_LEVEL_NAMES = ("token", "sequence")
SURROGATE_NAMES = ("clip", "cispo", "sapo", "unclipped")
COVARIANCE_NAMES = ("clip_cov", "kl_cov")
# The rollout backend of GRPO and of the evaluations unless one is named: creditflow's decoder
# where it applies (Qwen2-family text models), else model.generate (creditflow.rollout.backends).
DEFAULT_ROLLOUT_BACKEND = "lean"
KL_KINDS = ("k1", "k3")
# The truncation of the importance weight that corrects a sampler one update behind when
# importance_sampling_cap is null: TRL's vllm_importance_sampling_clip_max.
DEFAULT_STALENESS_CAP = 3.0


# The groups of GRPOConfig's fields, in the order the parameter reference lists them (TRL
# groups its GRPOConfig the same way).
FIELD_GROUPS = {
    "batch": "the rollout batch and its split into optimizer steps",
    "optimizer": "AdamW, clipping and the learning-rate schedule",
    "loss": "the policy loss, its clipping, KL and aggregation",
    "dapo": "DAPO's reward shaping and sampling",
    "generation": "sampling the completions",
    "rollout": "the engine that samples, and scoring speed",
    "memory": "memory and precision of the update",
    "credit": "credit assignment: the advantage and token-weight strategies",
    "rewards": "which rewards count, and how much",
    "logging": "checkpoints, samples and the credit inspector",
}


def knob(default: Any = ..., *, group: str, description: str, **field_options: Any) -> Any:
    """A GRPOConfig field: its default (or ``default_factory``), its group of
    ``FIELD_GROUPS`` and its one description."""
    if group not in FIELD_GROUPS:
        raise ValueError(f"unknown field group {group!r}; valid: {sorted(FIELD_GROUPS)}")
    return Field(
        default, description=description, json_schema_extra={"group": group}, **field_options
    )


def _factory(value: dict[str, Any]) -> Any:
    """A fresh copy of the flat mapping ``value`` per config (no two configs share one)."""
    return lambda: dict(value)


class GRPOConfig(BaseModel):
    """GRPO engine settings (docs/methods/grpo.md); each field is described where it is
    declared (``GRPOConfig.model_fields[name].description``), grouped by ``FIELD_GROUPS``.

    Strict as the parameter blocks are: YAML's ``true`` is no number, ``2.5`` no int, ``.inf``
    no finite float; an int is taken for a float (as a float, so ``1`` and ``1.0`` are the
    same run). A wrong value is a ConfigError naming its key.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    steps: int = knob(20, group="batch", description="rollout/update rounds")
    prompts_per_step: int = knob(
        8,
        group="batch",
        description="distinct prompts per round; the rollout batch is B = prompts_per_step * "
        "group_size",
    )
    group_size: int = knob(8, group="batch", description="G, completions per prompt")
    num_iterations: int = knob(
        1,
        group="batch",
        description="optimisation passes over each rollout batch (1 = strictly on-policy)",
    )
    minibatch_size: int | None = knob(
        None,
        group="batch",
        description="sequences per optimizer step (must divide B); null = the whole batch",
    )
    micro_batch_size: int | None = knob(
        None,
        group="batch",
        description="sequences per forward + backward on each process: gradient accumulation "
        "inside one optimizer step, for memory; each micro-batch's loss is weighted by its "
        "share of the minibatch's (algorithms.micro_batch_share), so the loss and the gradient "
        "are the minibatch's, for every agg. Must divide the minibatch (per process); null = "
        "the whole minibatch in one pass",
    )
    learning_rate: float = knob(1e-4, group="optimizer", description="AdamW's learning rate")
    weight_decay: float = knob(0.0, group="optimizer", description="AdamW's weight decay")
    max_grad_norm: float = knob(
        1.0, group="optimizer", description="gradient-norm clipping before each optimizer step"
    )
    warmup_steps: int = knob(
        2,
        group="optimizer",
        description="linear warm-up (in optimizer steps), followed by cosine decay to 0",
    )
    loss_type: str | None = knob(
        None,
        group="loss",
        description="a preset of the loss knobs by TRL's name (config.loss_types.LOSS_TYPES, "
        "docs/methods/loss_types.md): grpo, bnpo, dr_grpo, dapo, cispo, sapo, gspo, luspo, "
        "clip_cov or kl_cov. It sets agg, importance_level, surrogate (for dr_grpo "
        "advantage.scale_by_std: false, for clip_cov / kl_cov covariance.name): an "
        "explicit knob that contradicts it is an error naming the key to drop; its clip ranges "
        "are defaults an explicit value overrides. null: the knobs alone (null knobs take "
        "their defaults)",
    )
    clip_low: float | None = knob(
        None,
        group="loss",
        description="PPO ratio clip range [1 - clip_low, 1 + clip_high]; null: the loss "
        "type's, else 0.2. Not read by surrogate cispo: set with it, it is an error",
    )
    clip_high: float | None = knob(
        None, group="loss", description="the upper side of the clip range (see clip_low)"
    )
    beta: float = knob(
        0.0,
        group="loss",
        description="KL coefficient to the frozen reference (the initial policy); 0 loads no "
        "reference",
    )
    kl: str = knob("k3", group="loss", description=f"KL estimator, one of {list(KL_KINDS)}")
    agg: str | None = knob(
        None,
        group="loss",
        description=f"loss aggregation, one of {list(AGG_MODES)}; null: the loss type's, "
        "else seq-mean-token-mean",
    )
    importance_level: str | None = knob(
        None,
        group="loss",
        description="token (one ratio per token) or sequence (GSPO: every token's ratio has "
        "its completion's value exp(mean over its tokens of logp - old_logp), clipped as one, "
        "and the gradient of the token's own ratio); null: the loss type's, else token",
    )
    surrogate: str | None = knob(
        None,
        group="loss",
        description="clip (PPO's clipped surrogate), cispo (the clipped, detached importance "
        "weight times the log-probability), sapo (a smooth temperature gate instead of the "
        "clip) or unclipped (-ratio * advantage, KL-Cov's); null: the loss type's, else clip",
    )
    cispo_max_ratio: float | None = knob(
        None,
        group="loss",
        description="CISPO's cap on the importance weight (an absolute ratio, TRL's "
        "epsilon_high under cispo); null: 5.0. Read by surrogate cispo only",
    )
    sapo_temperature_pos: float | None = knob(
        None,
        group="loss",
        description="SAPO's gate temperature on tokens with a positive advantage (TRL's "
        "sapo_temperature_pos); null: 1.0. Read by surrogate sapo only",
    )
    sapo_temperature_neg: float | None = knob(
        None,
        group="loss",
        description="SAPO's gate temperature on tokens with a zero or negative advantage; "
        "null: 1.05. Read by surrogate sapo only",
    )
    off_policy_mask_threshold: float | None = knob(
        None,
        group="loss",
        description="the off-policy sequence mask of DeepSeek-V3.2 (TRL's option of the same "
        "name): a completion with a negative advantage whose mean KL from the sampler's "
        "log-probs (or the sampling-time forward's) to the current policy's exceeds this is "
        "left out of the policy-gradient term; null: off",
    )
    covariance: dict[str, Any] | None = knob(
        None,
        group="loss",
        description="Clip-Cov or KL-Cov (arXiv 2505.22617, verl's clip_cov / kl_cov; "
        "CovarianceControl, docs/methods/covariance.md): the tokens whose log-probability "
        "and advantage covary most are held back. {name: clip_cov, ratio: 0.0002, lower: "
        "1.0, upper: 5.0}: a random ratio share of the valid tokens whose covariance lies in "
        "(lower, upper), not already clipped, leave the policy gradient; {name: kl_cov, "
        "ratio: 0.0002, coef: 1.0}: the top ratio share by covariance get coef * |logp - "
        "old_logp| added. Over each micro-batch's tokens, as verl. null: off (loss_type "
        "clip_cov / kl_cov set the name)",
    )
    perception: dict[str, Any] | None = knob(
        None,
        group="loss",
        description="PAPO's implicit perception loss (arXiv 2507.06448; PerceptionLoss, "
        "docs/methods/papo.md), for a vision-language policy: {weight: 0.1, mask_ratio: 0.3, "
        "clip: 0.2} subtracts weight times the mean over the completion's tokens of the k3 "
        "divergence between the policy with its picture and with each pixel value zeroed "
        "with probability mask_ratio, clipped to [0, clip] (one more forward per update). "
        "null: off",
    )
    mask_truncated_completions: bool = knob(
        False,
        group="dapo",
        description="completions that reach max_new_tokens without a stop token count nowhere "
        "in the loss or the token weights (their mask is zeroed after the rewards; their "
        "rewards still enter their group's advantages), as TRL's option of the same name "
        "(DAPO section 3.4)",
    )
    overlong: dict[str, Any] | None = knob(
        None,
        group="dapo",
        description="DAPO's soft overlong punishment (eq. 13), {buffer: L, penalty_factor: "
        "1.0, reward: reasoning}: a completion longer than max_new_tokens - L tokens gets a "
        "penalty falling linearly to -penalty_factor at max_new_tokens, added to the reward "
        "named reward before any strategy reads the rewards (reported as reward/overlong; the "
        "reward/* metrics stay unshaped). null: off",
    )
    dynamic_sampling: dict[str, Any] | None = knob(
        None,
        group="dapo",
        description="DAPO's dynamic sampling, {reward: reasoning, success: 1.0, "
        "max_extra_rollouts: null}: a group whose completions all succeed or all fail "
        "(reward >= success) is dropped and more prompts are drawn, as many as groups are "
        "missing, until the batch is full or max_extra_rollouts more completions have been "
        "sampled this step (null: one more rollout batch); a batch still short is filled with "
        "dropped groups. Metrics dynamic_sampling/*. Single process only. null: off",
    )
    max_new_tokens: int = knob(64, group="generation", description="completion length limit")
    temperature: float = knob(1.0, group="generation", description="sampling temperature")
    top_p: float = knob(1.0, group="generation", description="nucleus sampling's top-p")
    top_k: int = knob(0, group="generation", description="top-k sampling (0: off)")
    rollout: dict[str, Any] = knob(
        default_factory=_factory({"name": DEFAULT_ROLLOUT_BACKEND}),
        group="rollout",
        description="{name: backend, ...options}: the engine that draws the completions "
        "(creditflow.rollout.backends.ROLLOUT_BACKENDS): lean (the default: creditflow's "
        "decoder for Qwen2-family text models and Qwen2.5-VL, whose old log-probs and entropy "
        "it reads off its sampling logits; others fall back to hf with a log line), hf "
        "(model.generate) or vllm (an optional extra, text only)",
    )
    importance_sampling_cap: float | None = knob(
        None,
        group="rollout",
        description="when the rollout engine is not the trained module (vLLM) or samples with "
        "older weights (max_staleness), the per-token ratio pi_trainer / pi_sampler, truncated "
        "at this cap, multiplies each token's policy-gradient loss (truncated importance "
        "sampling, TRL's vllm_importance_sampling_correction); null = off, or 3.0 (TRL's cap) "
        "when max_staleness > 0",
    )
    max_staleness: int = knob(
        0,
        group="rollout",
        description="0 samples every batch with the weights it trains (on-policy); 1 draws the "
        "next step's batch in a second process while this step's update runs, with the "
        "weights before that update (one-step off-policy, docs/concepts/off_policy.md); single "
        "CPU process, rollout lean or hf",
    )
    entropy_top_p: float = knob(
        0.95,
        group="generation",
        description="top-p of the distribution whose per-token entropy the strategies read "
        "(ToR's reasoning tokens)",
    )
    logprob_chunk_size: int | None = knob(
        None,
        group="rollout",
        description="completion positions whose logits are computed at once when scoring "
        "(algorithms.token_logprobs); the backward recomputes each chunk's logits, so no "
        "(B, T, V) logits tensor is held. null = as many as 2**24 logits hold (64 MiB float32)",
    )
    gradient_checkpointing: bool = knob(
        False,
        group="memory",
        description="recompute each decoder layer's activations in the backward pass instead "
        "of keeping them (language and vision-language policies): less memory for about one "
        "more forward",
    )
    bf16: bool = knob(
        False,
        group="memory",
        description="every forward under torch.autocast in bfloat16; weights, gradients and "
        "optimizer state stay float32, log-probs are taken in float32. Fails before training "
        "on a device without bfloat16",
    )
    shared_prefix: bool = knob(
        True,
        group="rollout",
        description="score the G completions of a prompt with one forward of the prompt whose "
        "KV cache is expanded to them (rollout.shared_prefix; exact, gradients included) "
        "instead of G forwards over [prompt, completion]; the plain forward still runs where "
        "the cache cannot be shared (e.g. under gradient_checkpointing in the update)",
    )
    advantage: dict[str, Any] = knob(
        default_factory=_factory({"name": "grpo"}),
        group="credit",
        description="{name: strategy, ...options} (training.strategies.ADVANTAGE_STRATEGIES; "
        "one's own by import path package.module:function or entry point, docs/extending.md)",
    )
    token_weights: dict[str, Any] = knob(
        default_factory=_factory({"name": "uniform"}),
        group="credit",
        description="{name: strategy, ...options} (training.strategies."
        "TOKEN_WEIGHT_STRATEGIES, or one's own, as advantage)",
    )
    rewards: dict[str, float] = knob(
        default_factory=_factory({"reasoning": 1.0}),
        group="rewards",
        description="reward name -> weight; the weighted sum is the scalar reward of grpo. A "
        "reward of one's own goes by its import path ({my_credit.rewards:brevity: 0.1})",
    )
    reward_options: dict[str, dict[str, Any]] = knob(
        default_factory=dict,
        group="rewards",
        description="reward name -> keyword options of that reward function, e.g. "
        "{reasoning: {budget_s: 30.0}} (creditflow.rewards.check_reward_options)",
    )
    seed: int = knob(0, group="batch", description="seeds prompt order, sampling and tie-breaking")
    checkpoint_every: int = knob(
        10,
        group="logging",
        description="save a resumable checkpoint every N steps (0 = only at the end)",
    )
    keep_checkpoints: int = knob(
        2, group="logging", description="how many checkpoints to keep on disk"
    )
    log_samples_every: int = knob(
        5, group="logging", description="record sample completions every N steps"
    )
    samples_per_log: int = knob(
        4, group="logging", description="how many sample completions each record keeps"
    )
    credit_inspector: dict[str, Any] | None = knob(
        None,
        group="logging",
        description="record the credit of a few completions token by token "
        "(training.credit), {steps: null, rollouts: 4}: at the listed steps (1-based; null: "
        "the first, a middle and the last step) one row per completion token of the first "
        "rollouts completions of the batch; deserved: {continuations: K, every: n or "
        "segments} adds the Monte Carlo deserved credit of those tokens (CreditInspection; "
        "docs/concepts/credit_inspector.md). Observes only, so it is not part of a run's "
        "checkpoint key (run_key). null: off",
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise ConfigError(validation_message(error, type(self))) from None

    @model_validator(mode="after")
    def _resolve_and_check(self) -> GRPOConfig:
        """Sets the loss knobs left null from ``loss_type`` (else the engine's defaults), then
        checks the whole config; ConfigError where an explicit knob contradicts the loss type."""
        knobs = {key: getattr(self, key) for key in (*DEFINING, *DEFAULTED, "covariance")}
        resolved, spec = resolve_loss_knobs(self.loss_type, knobs, self.advantage)
        self.advantage = spec
        for key, value in resolved.items():
            setattr(self, key, value)
        self.validate()
        return self

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of field ``name`` (a fresh copy of a mapping)."""
        return cls.model_fields[name].get_default(call_default_factory=True)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> GRPOConfig:
        """The config of the ``grpo`` parameters ``params``; ConfigError naming each unknown
        key with the closest valid one, or the first bad value."""
        known = set(cls.model_fields)
        unknown = sorted(set(params) - known)
        if unknown:
            raise ConfigError("GRPO: " + unknown_keys_message(unknown, known, noun="parameter"))
        return cls(**params)

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
        if self.clip_low is not None:  # None: surrogate cispo, which reads no clip range
            need(0 <= self.clip_low < 1, f"clip_low must be in [0, 1), got {self.clip_low}")
            need(self.clip_high >= 0, f"clip_high must be >= 0, got {self.clip_high}")
        if self.cispo_max_ratio is not None:
            need(
                self.cispo_max_ratio > 0, f"cispo_max_ratio must be > 0, got {self.cispo_max_ratio}"
            )
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            value = getattr(self, name)
            need(value is None or value > 0, f"{name} must be > 0, got {value}")
        threshold = self.off_policy_mask_threshold
        need(
            threshold is None or threshold >= 0,
            f"off_policy_mask_threshold must be >= 0 or null, got {threshold}",
        )
        need(
            self.importance_level in IMPORTANCE_LEVEL_NAMES,
            f"importance_level must be one of {list(IMPORTANCE_LEVEL_NAMES)}, "
            f"got {self.importance_level!r}",
        )
        need(
            self.surrogate in SURROGATE_NAMES,
            f"surrogate must be one of {list(SURROGATE_NAMES)}, got {self.surrogate!r}",
        )
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
        need(
            self.max_staleness in (0, 1),
            f"max_staleness must be 0 (on-policy) or 1 (sample one step ahead), got "
            f"{self.max_staleness}: one sampling process runs at most one batch ahead",
        )
        self.overlong_shaping()
        self.covariance_control()
        self.perception_loss()
        self.dynamic_sampling_spec()
        self.credit_inspection()

    def importance_cap(self) -> float | None:
        """The truncated importance weight's cap in force: ``importance_sampling_cap``, else
        ``DEFAULT_STALENESS_CAP`` when the sampler may lag (``max_staleness``), else None."""
        if self.importance_sampling_cap is None and self.max_staleness:
            return DEFAULT_STALENESS_CAP
        return self.importance_sampling_cap

    def loss_options(self) -> dict[str, Any]:
        """The keyword arguments of ``algorithms.policy_loss`` this config sets (a knob its
        surrogate does not read is left out)."""
        options = {
            "clip_low": self.clip_low,
            "clip_high": self.clip_high,
            "agg": self.agg,
            "beta": self.beta,
            "kl": self.kl,
            "max_len": self.max_new_tokens,
            "importance_level": self.importance_level,
            "surrogate": self.surrogate,
            "max_ratio": self.cispo_max_ratio,
            "sapo_temperature_pos": self.sapo_temperature_pos,
            "sapo_temperature_neg": self.sapo_temperature_neg,
            "off_policy_threshold": self.off_policy_mask_threshold,
        }
        control = self.covariance_control()
        if control is not None:
            options.update(
                covariance=control.name,
                covariance_ratio=control.ratio,
                clip_cov_lower=control.lower,
                clip_cov_upper=control.upper,
                kl_cov_coef=control.coef,
            )
        return {key: value for key, value in options.items() if value is not None}

    def perception_loss(self) -> PerceptionLoss | None:
        """``perception`` checked, or None when it is off."""
        if self.perception is None:
            return None
        return parse_option(PerceptionLoss, "perception", self.perception)

    def covariance_control(self) -> CovarianceControl | None:
        """``covariance`` checked, or None when it is off."""
        if self.covariance is None:
            return None
        spec = parse_option(CovarianceControl, "covariance", self.covariance)
        if spec.name not in COVARIANCE_NAMES:
            raise ConfigError(
                f"covariance.name must be one of {list(COVARIANCE_NAMES)}, got {spec.name!r}"
            )
        if not 0 < spec.ratio <= 1:
            raise ConfigError(f"covariance.ratio must be in (0, 1], got {spec.ratio}")
        unread = {"clip_cov": {"coef"}, "kl_cov": {"lower", "upper"}}[spec.name]
        if unread & spec.model_fields_set:
            raise ConfigError(
                f"covariance {sorted(unread & spec.model_fields_set)} not read by {spec.name}: "
                f"drop it"
            )
        if spec.name == "clip_cov" and not spec.lower < spec.upper:
            raise ConfigError(
                f"covariance.lower ({spec.lower}) must be below covariance.upper ({spec.upper})"
            )
        if spec.name == "kl_cov" and spec.coef < 0:
            raise ConfigError(f"covariance.coef must be >= 0, got {spec.coef}")
        return spec

    def overlong_shaping(self) -> OverlongShaping | None:
        """``overlong`` checked, or None when it is off."""
        if self.overlong is None:
            return None
        spec = parse_option(OverlongShaping, "overlong", self.overlong)
        if not 1 <= spec.buffer <= self.max_new_tokens:
            raise ConfigError(
                f"overlong.buffer must be in [1, max_new_tokens = {self.max_new_tokens}], "
                f"got {spec.buffer}"
            )
        if spec.penalty_factor < 0:
            raise ConfigError(f"overlong.penalty_factor must be >= 0, got {spec.penalty_factor}")
        return spec

    def dynamic_sampling_spec(self) -> DynamicSampling | None:
        """``dynamic_sampling`` checked, its ``max_extra_rollouts`` set, or None when off."""
        if self.dynamic_sampling is None:
            return None
        spec = parse_option(DynamicSampling, "dynamic_sampling", self.dynamic_sampling)
        if spec.max_extra_rollouts is None:
            return spec.model_copy(update={"max_extra_rollouts": self.rollout_batch_size})
        if spec.max_extra_rollouts < 0:
            raise ConfigError(
                f"dynamic_sampling.max_extra_rollouts must be >= 0, got {spec.max_extra_rollouts}"
            )
        return spec

    def credit_inspection(self) -> CreditInspection | None:
        """``credit_inspector`` checked, or None when it is off."""
        if self.credit_inspector is None:
            return None
        spec = parse_option(CreditInspection, "credit_inspector", self.credit_inspector)
        if isinstance(spec.rollouts, bool) or spec.rollouts < 1:
            raise ConfigError(f"credit_inspector.rollouts must be >= 1, got {spec.rollouts}")
        steps = spec.steps
        if steps is not None and not all(
            isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= self.steps for s in steps
        ):
            raise ConfigError(
                f"credit_inspector.steps must list steps in [1, steps = {self.steps}] (1-based) "
                f"or be null (the first, a middle and the last), got {steps!r}"
            )
        return spec

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def run_key(self) -> dict[str, Any]:
        """``to_dict`` without the settings that only observe a run (``credit_inspector``):
        what a run's checkpoints are keyed on, so turning the inspector on or off resumes."""
        return {k: v for k, v in self.to_dict().items() if k != "credit_inspector"}


class CreditInspection(GRPOOption):
    """``GRPOConfig.credit_inspector``: the 1-based steps recorded (None: the first, a middle
    and the last) and how many completions of each recorded batch."""

    steps: list[int] | None = Field(
        None, description="the 1-based steps recorded; null: the first, a middle and the last"
    )
    rollouts: int = Field(4, description="completions of each recorded batch")
    deserved: CreditInspection.Deserved | None = Field(
        None,
        description="the deserved credit of the recorded tokens, estimated by Monte Carlo "
        "(training.deserved_credit): {continuations: K, every: n or segments}, the value of "
        "each prefix that starts a span (every n tokens, or at TAPO's segment border) from K "
        "continuations the policy samples from it, a span's credit the change in value across "
        "it. It samples K continuations per span of each recorded completion: at the test "
        "suite's tiny policy (4 recorded completions of 8 tokens, 2 CPU cores) a recorded step "
        "took 0.29 s with {} (K 8, every token) and 0.12 s with every: segments, against "
        "0.08 s without. null: off",
    )

    class Deserved(GRPOOption):
        """``credit_inspector.deserved``: K continuations per prefix and the span spacing."""

        continuations: int = Field(
            8,
            description="K: continuations sampled from each prefix (the estimate's error ~ 1/sqrt(K))",
        )
        every: int | str = Field(
            1,
            description="a prefix value every n completion tokens (1: every token), or 'segments'",
        )

    @model_validator(mode="before")
    @classmethod
    def _parse_deserved(cls, data: Any) -> Any:
        """``deserved`` checked on its own, so a wrong key is named with its valid ones."""
        if not isinstance(data, dict) or not isinstance(data.get("deserved"), dict):
            return data
        d = parse_option(cls.Deserved, "credit_inspector.deserved", data["deserved"])
        if isinstance(d.continuations, bool) or d.continuations < 1:
            raise ConfigError(
                f"credit_inspector.deserved.continuations (K) must be >= 1, got {d.continuations}"
            )
        if d.every != "segments" and (isinstance(d.every, bool | str) or d.every < 1):
            raise ConfigError(
                f"credit_inspector.deserved.every must be an int >= 1 (a value every n tokens) "
                f"or 'segments', got {d.every!r}"
            )
        return {**data, "deserved": d}

    def recorded_steps(self, total: int) -> set[int]:
        """The 1-based steps recorded in a run of ``total`` steps.

        >>> (
        ...     sorted(CreditInspection().recorded_steps(25)),
        ...     sorted(CreditInspection(steps=[2]).recorded_steps(5)),
        ... )
        ([1, 13, 25], [2])
        """
        if self.steps is not None:
            return set(self.steps)
        return {1, (total + 1) // 2, total}


def check_importance_sampling(config: GRPOConfig, samples_module: bool) -> None:
    """ConfigError when truncated importance sampling (``importance_sampling_cap``) is asked
    of a rollout backend that samples the trained module itself, on-policy: there is no
    sampler / trainer mismatch to correct."""
    rollout = config.rollout.get("name")
    if config.importance_sampling_cap is not None and samples_module and not config.max_staleness:
        raise ConfigError(
            "importance_sampling_cap corrects a rollout engine whose sampler is not the "
            f"trained module (e.g. rollout: {{name: vllm}}) or lags it (max_staleness: 1); "
            f"rollout {rollout!r} samples the module itself: set importance_sampling_cap to null"
        )


def check_process_layout(config: GRPOConfig, num_processes: int) -> None:
    """Fail before training when the global batch cannot be split evenly across processes,
    or when an option that runs in one process only is set."""
    if config.dynamic_sampling is not None and num_processes > 1:
        raise ConfigError(
            f"dynamic_sampling runs in a single process (each process would draw a different "
            f"number of times); set dynamic_sampling to null or num_processes to 1, not "
            f"{num_processes}"
        )
    if config.prompts_per_step % num_processes:
        raise ConfigError(
            f"prompts_per_step ({config.prompts_per_step}) is the global number of prompts per "
            f"step and must be divisible by the number of processes ({num_processes}); "
            f"use a multiple of {num_processes}"
        )
    if config.minibatch_size is not None and config.minibatch_size % num_processes:
        raise ConfigError(
            f"minibatch_size ({config.minibatch_size}) is global and must be divisible by the "
            f"number of processes ({num_processes}); use a multiple of {num_processes} or null"
        )
    local = (config.minibatch_size or config.rollout_batch_size) // num_processes
    if config.micro_batch_size is not None and local % config.micro_batch_size:
        raise ConfigError(
            f"micro_batch_size ({config.micro_batch_size}) counts one process's sequences and "
            f"must divide its share of the minibatch ({local} with {num_processes} processes); "
            f"pick a divisor of {local} or null"
        )
