"""Typed, validated training configuration built from Kedro parameters.

Every field is documented once, here; ``conf/base/parameters_*.yml`` only sets values.
Validation runs before any model is built so a broken config fails in seconds.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from creditflow.config.loss_types import DEFAULTED, DEFINING, resolve_loss_knobs
from creditflow.config.values import typed_value
from creditflow.errors import ConfigError

AGG_MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")
# The names of algorithms.IMPORTANCE_LEVELS and algorithms.SURROGATES (this module stays
# torch-free; a test holds them equal).
IMPORTANCE_LEVEL_NAMES = ("token", "sequence")
SURROGATE_NAMES = ("clip", "cispo")
# The rollout backend of GRPO and of the evaluations unless one is named: creditflow's decoder
# where it applies (Qwen2-family text models), else model.generate (creditflow.rollout.backends).
DEFAULT_ROLLOUT_BACKEND = "lean"
KL_KINDS = ("k1", "k3")
# The truncation of the importance weight that corrects a sampler one update behind when
# importance_sampling_cap is null: TRL's vllm_importance_sampling_clip_max.
DEFAULT_STALENESS_CAP = 3.0


@dataclass
class GRPOConfig:
    """GRPO engine settings (docs/methods/grpo.md).

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
    loss_type: a preset of the loss knobs by TRL's name (``config.loss_types.LOSS_TYPES``,
        docs/methods/loss_types.md): ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``cispo`` or
        ``gspo``. It sets agg, importance_level, surrogate (and, for dr_grpo,
        ``advantage.scale_by_std: false``): an explicit knob that contradicts it is an error
        naming the key to drop. Its clip ranges are defaults an explicit value overrides.
        null: the knobs alone (null knobs take the defaults below).
    clip_low, clip_high: PPO ratio clip range [1 - clip_low, 1 + clip_high]; null: the loss
        type's, else 0.2. Not read by surrogate cispo: set with it, they are an error.
    beta: KL coefficient to the frozen reference (the initial policy); 0 loads no reference.
    kl: KL estimator, one of KL_KINDS.
    agg: loss aggregation, one of AGG_MODES; null: the loss type's, else seq-mean-token-mean.
    importance_level: ``token`` (one ratio per token) or ``sequence`` (GSPO: every token's
        ratio has its completion's value exp(mean over its tokens of logp - old_logp),
        clipped as one, and the gradient of the token's own ratio); null: the loss type's,
        else token.
    surrogate: ``clip`` (PPO's clipped surrogate) or ``cispo`` (the clipped, detached
        importance weight times the log-probability); null: the loss type's, else clip.
    cispo_max_ratio: CISPO's cap on the importance weight (an absolute ratio, TRL's
        ``epsilon_high`` under cispo); null: 5.0. Read by surrogate cispo only.
    mask_truncated_completions: completions that reach ``max_new_tokens`` without a stop token
        count nowhere in the loss or the token weights (their mask is zeroed after the
        rewards; their rewards still enter their group's advantages), as TRL's option of the
        same name (DAPO section 3.4).
    overlong: DAPO's soft overlong punishment (eq. 13), ``{buffer: L, penalty_factor: 1.0,
        reward: reasoning}``: a completion longer than ``max_new_tokens - L`` tokens gets a
        penalty falling linearly to ``-penalty_factor`` at ``max_new_tokens``, added to the
        reward named ``reward`` before any strategy reads the rewards (reported as
        ``reward/overlong``; the ``reward/*`` metrics stay unshaped). null: off.
    dynamic_sampling: DAPO's dynamic sampling, ``{reward: reasoning, success: 1.0,
        max_extra_rollouts: null}``: a group whose completions all succeed or all fail
        (``reward >= success``) is dropped and more prompts are drawn, as many as groups are
        missing, until the batch is full or ``max_extra_rollouts`` more completions have been
        sampled this step (null: one more rollout batch); a batch still short is filled
        with dropped groups. Metrics ``dynamic_sampling/*``. Single process only. null: off.
    max_new_tokens, temperature, top_p, top_k: sampling.
    rollout: {"name": backend, ...options}: the engine that draws the completions
        (``creditflow.rollout.backends.ROLLOUT_BACKENDS``): ``lean`` (the default:
        creditflow's decoder for Qwen2-family text models and Qwen2.5-VL, whose old log-probs
        and entropy it reads off its sampling logits; others fall back to ``hf`` with a log
        line), ``hf`` (``model.generate``) or ``vllm`` (an optional extra, text only).
    importance_sampling_cap: when the rollout engine is not the trained module (vLLM) or
        samples with older weights (``max_staleness``), the per-token ratio
        pi_trainer(o_t) / pi_sampler(o_t) of the trainer's log-probs before its update over
        the sampler's, truncated at this cap, multiplies each token's policy-gradient loss
        (truncated importance sampling, TRL's ``vllm_importance_sampling_correction``);
        None = off, or 3.0 (TRL's cap) when ``max_staleness`` > 0.
    max_staleness: 0 samples every batch with the weights it trains (on-policy); 1 draws the
        next step's batch in a second process while this step's update runs, with the
        weights before that update, so sampling and update overlap (one-step off-policy:
        ``training.offpolicy``, docs/concepts/off_policy.md); a batch further behind fails
        the run. Single CPU process, rollout ``lean`` or ``hf``.
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
        instead of G forwards over ``[prompt, completion]`` (a vision-language policy's image
        and 3-D rope positions included, and its no-image pass); the plain forward still runs
        where the cache cannot be shared (e.g. under ``gradient_checkpointing`` in the update).
    advantage: {"name": strategy, ...strategy options} (training.strategies.ADVANTAGE_STRATEGIES;
        a strategy of one's own by import path ``"package.module:function"`` or entry point,
        docs/extending.md).
    token_weights: {"name": strategy, ...options} (training.strategies.TOKEN_WEIGHT_STRATEGIES,
        or one's own, as ``advantage``).
    rewards: reward name -> weight; the weighted sum is the scalar reward of ``grpo``. A reward
        of one's own goes by its import path (``{"my_credit.rewards:brevity": 0.1}``).
    reward_options: reward name -> keyword options of that reward function, e.g.
        ``{"reasoning": {"budget_s": 30.0}}`` (``creditflow.rewards.check_reward_options``;
        checked against the computed rewards by ``grpo_runs.build_grpo_config``).
    seed: seeds prompt order, sampling and tie-breaking.
    checkpoint_every: save a resumable checkpoint every N steps (0 = only at the end).
    keep_checkpoints: how many checkpoints to keep on disk.
    log_samples_every: record sample completions every N steps; samples_per_log: how many.
    credit_inspector: record the credit of a few completions token by token
        (``training.credit``), ``{steps: null, rollouts: 4}``: at the listed steps (1-based;
        null: the first, a middle and the last step) one row per completion token of the
        first ``rollouts`` completions of the batch (their tokens, segments, rewards,
        advantages, weights, entropies, ratios). Observes only, so it is not part of a run's
        checkpoint key (``run_key``). null: off.
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
    loss_type: str | None = None
    clip_low: float | None = None
    clip_high: float | None = None
    beta: float = 0.0
    kl: str = "k3"
    agg: str | None = None
    importance_level: str | None = None
    surrogate: str | None = None
    cispo_max_ratio: float | None = None
    mask_truncated_completions: bool = False
    overlong: dict[str, Any] | None = None
    dynamic_sampling: dict[str, Any] | None = None
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    rollout: dict[str, Any] = field(default_factory=lambda: {"name": DEFAULT_ROLLOUT_BACKEND})
    importance_sampling_cap: float | None = None
    max_staleness: int = 0
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
    credit_inspector: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        """Sets the loss knobs left null from ``loss_type`` (else the engine's defaults);
        ConfigError where an explicit knob contradicts the loss type."""
        knobs = {key: getattr(self, key) for key in (*DEFINING, *DEFAULTED)}
        # A malformed advantage spec is left as it is: validate_strategies says what is wrong.
        spec = self.advantage if isinstance(self.advantage, dict) else {}
        resolved, spec = resolve_loss_knobs(self.loss_type, knobs, spec)
        if isinstance(self.advantage, dict):
            self.advantage = spec
        for key, value in resolved.items():
            setattr(self, key, value)

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
        if self.clip_low is not None:  # None: surrogate cispo, which reads no clip range
            need(0 <= self.clip_low < 1, f"clip_low must be in [0, 1), got {self.clip_low}")
            need(self.clip_high >= 0, f"clip_high must be >= 0, got {self.clip_high}")
        if self.cispo_max_ratio is not None:
            need(
                self.cispo_max_ratio > 0, f"cispo_max_ratio must be > 0, got {self.cispo_max_ratio}"
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
        }
        return {key: value for key, value in options.items() if value is not None}

    def overlong_shaping(self) -> OverlongShaping | None:
        """``overlong`` checked, or None when it is off."""
        if self.overlong is None:
            return None
        spec = _spec(OverlongShaping, "overlong", self.overlong)
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
        spec = _spec(DynamicSampling, "dynamic_sampling", self.dynamic_sampling)
        if spec.max_extra_rollouts is None:
            return DynamicSampling(spec.reward, spec.success, self.rollout_batch_size)
        if spec.max_extra_rollouts < 0:
            raise ConfigError(
                f"dynamic_sampling.max_extra_rollouts must be >= 0, got {spec.max_extra_rollouts}"
            )
        return spec

    def credit_inspection(self) -> CreditInspection | None:
        """``credit_inspector`` checked, or None when it is off."""
        if self.credit_inspector is None:
            return None
        spec = _spec(CreditInspection, "credit_inspector", self.credit_inspector)
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
        return asdict(self)

    def run_key(self) -> dict[str, Any]:
        """``to_dict`` without the settings that only observe a run (``credit_inspector``):
        what a run's checkpoints are keyed on, so turning the inspector on or off resumes."""
        return {k: v for k, v in self.to_dict().items() if k != "credit_inspector"}


@dataclass(frozen=True)
class OverlongShaping:
    """``GRPOConfig.overlong``: DAPO's soft overlong punishment (``algorithms.overlong_penalty``)
    of the last ``buffer`` tokens before ``max_new_tokens``, added to reward ``reward``."""

    buffer: int
    penalty_factor: float = 1.0
    reward: str = "reasoning"


@dataclass(frozen=True)
class DynamicSampling:
    """``GRPOConfig.dynamic_sampling``: a completion succeeds when its ``reward`` is at least
    ``success``; groups of one success value are dropped; at most ``max_extra_rollouts`` more
    completions per step (None: one more rollout batch)."""

    reward: str = "reasoning"
    success: float = 1.0
    max_extra_rollouts: int | None = None


@dataclass(frozen=True)
class CreditInspection:
    """``GRPOConfig.credit_inspector``: the 1-based steps recorded (None: the first, a middle
    and the last) and how many completions of each recorded batch."""

    steps: list[int] | None = None
    rollouts: int = 4

    def recorded_steps(self, total: int) -> set[int]:
        """The 1-based steps recorded in a run of ``total`` steps.

        >>> (
        ...     sorted(CreditInspection().recorded_steps(25)),
        ...     sorted(CreditInspection([2]).recorded_steps(5)),
        ... )
        ([1, 13, 25], [2])
        """
        if self.steps is not None:
            return set(self.steps)
        return {1, (total + 1) // 2, total}


def _spec(cls: type, label: str, spec: Any) -> Any:
    """``cls`` built from the mapping ``spec``, each value checked against its field type."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{label} must be a mapping or null, got {spec!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(spec) - set(known))
    if unknown:
        raise ConfigError(f"unknown {label} option(s) {unknown}; valid: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    try:
        return cls(**{k: typed_value(f"{label}.{k}", v, hints[k]) for k, v in spec.items()})
    except TypeError as error:  # a field without a default is missing
        raise ConfigError(f"{label}: {error}") from error


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
