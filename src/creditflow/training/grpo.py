"""The GRPO training loop: rollouts -> rewards -> advantages -> token weights -> clipped updates.

Reads top to bottom: ``setup`` (optimizer, schedule, resume), ``train`` (one ``step`` per
rollout batch), ``save``. Credit assignment is chosen by name in ``training.strategies``; the
loop names no method: it calls the advantage and token-weight strategies through their
protocols and asks them (and the caller) for per-step reward diagnostics. The loss is
``algorithms.policy_loss`` (docs/methods/grpo.md), its variants chosen by ``GRPOConfig.loss_options``
(``config.loss_types``); DAPO's dynamic sampling and reward shaping are ``training.dapo``.

Memory: an optimizer step's minibatch may run as several micro-batches (gradient
accumulation, ``micro_batch_size``), each loss weighted by ``algorithms.micro_batch_share`` so
the step's loss and gradient are the minibatch's; the policies score a chunk of positions at a
time (``logprob_chunk_size``); ``gradient_checkpointing`` and ``bf16`` autocast are optional.

Data parallelism (optional, through ``accelerate``): every process draws its own share of the
step's prompts, samples and scores them, and computes its loss on its own rows; DDP averages
the gradients, so all processes take the same optimizer step. Metrics are averaged across
processes (reward metrics are computed on the gathered rewards) and only the main process
records samples, writes checkpoints and calls the step callback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from creditflow.algorithms import (
    micro_batch_share,
    policy_loss,
    sampler_mismatch,
    truncated_importance_weights,
)
from creditflow.config.grpo import (
    GRPOConfig,
    check_importance_sampling,
    check_process_layout,
)
from creditflow.errors import ConfigError
from creditflow.models.lora import is_lora_model
from creditflow.rollout.batch import Policy, RolloutBatch
from creditflow.tracking import StepCallback, active_step_logger
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.credit import credit_recorder
from creditflow.training.dapo import fill_batch, shape_batch
from creditflow.training.finite import (
    NonFiniteValue,
    check_finite_weights,
    check_update,
    checkpoint_due,
    non_finite_error,
)
from creditflow.training.fsdp import (
    FULL_OPTIMIZER_LAYOUT,
    full_state_dicts,
    load_full_optimizer_state,
)
from creditflow.training.memory import prepare_memory
from creditflow.training.offpolicy import (
    Rollout,
    RolloutAhead,
    check_off_policy,
    lag_corrected,
    sampling_ahead,
)
from creditflow.training.papo import perception_term, with_perception
from creditflow.training.reference import frozen_reference
from creditflow.training.rewards import RewardFn
from creditflow.training.seeding import RANK_SALT, step_seed
from creditflow.training.strategies import (
    RewardMetric,
    WeightContext,
    advantage_strategy,
    check_image_pass,
    token_weight_strategy,
    validate_strategies,
    weighted_reward,
)

if TYPE_CHECKING:
    from accelerate import Accelerator

logger = logging.getLogger(__name__)


@dataclass
class GRPOResult:
    """What a run produced: one metrics row per step, a few sample completions and the
    credit inspector's token rows (``training.credit``; empty when it is off)."""

    history: list[dict[str, float]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    credit: list[dict[str, Any]] = field(default_factory=list)


# How a micro-batch's metrics add up to its minibatch's: these are aggregated losses, weighted
# by the micro-batch's share of the loss (micro_batch_share); every other actor/ metric is a
# mean over valid tokens, weighted by the micro-batch's share of those tokens.
LOSS_METRICS = ("actor/loss", "actor/pg_loss")


class GRPOTrainer:
    """Trains ``policy`` with GRPO on ``prompts`` using ``reward_fn``.

    Args:
        policy: satisfies ``rollout.Policy`` (sample + completion_logprobs + module).
        prompts: the prompt objects ``policy.sample`` accepts (strings for language policies).
        reward_fn: maps the completions of a rollout batch to named (B,) rewards.
        config: validated ``GRPOConfig``.
        checkpoints: where resumable checkpoints go; None disables them.
        reference: a frozen copy of the policy for the KL term; built from ``policy`` when
            ``config.beta > 0`` and none is given (``reference.frozen_reference``: a LoRA
            policy's is its base, adapters disabled), never loaded when ``beta == 0``.
        progress: show a progress bar (main process only).
        accelerator: an ``accelerate.Accelerator`` for multi-process data parallelism (DDP,
            or FSDP2 sharding when it was made with an ``fsdp`` plugin: see
            ``_check_fsdp`` for what that does not support yet); None runs in this process
            alone. ``config.prompts_per_step`` and ``config.minibatch_size`` stay global
            counts, split evenly across processes.
        reward_metrics: per-step diagnostics of the rewards to report beside the ones the
            advantage strategy reports itself (e.g. ``strategies.SignConflictRate`` for every
            strategy a comparison runs).
        step_callback: ``callback(step, metrics)`` after every step with the step's history
            row (main process only), and at the start for the rows a resumed run already has;
            None: ``tracking.active_step_logger()``, the MLflow run of the Kedro node this
            trainer runs in, if it is tracked.
        desc: the progress bar's label, followed by ``[advantage/token weights]``; an entry
            point names its own loop ("page GRPO").
    """

    def __init__(
        self,
        policy: Policy,
        prompts: Sequence[Any],
        reward_fn: RewardFn,
        config: GRPOConfig,
        checkpoints: CheckpointStore | None = None,
        reference: Policy | None = None,
        progress: bool = True,
        accelerator: Accelerator | None = None,
        reward_metrics: Sequence[RewardMetric] = (),
        step_callback: StepCallback | None = None,
        desc: str = "GRPO",
    ):
        # The config checked itself when built; its strategies are checked beside the policy.
        validate_strategies(config)
        check_image_pass(config, hasattr(policy, "no_image_logprobs"), type(policy).__name__)
        if len(prompts) < 1:
            raise ValueError("no prompts to train on")
        self.accelerator = accelerator
        self.num_processes = 1 if accelerator is None else accelerator.num_processes
        self.process_index = 0 if accelerator is None else accelerator.process_index
        check_process_layout(config, self.num_processes)
        check_importance_sampling(config, policy.samples_module)
        self.policy = policy
        self.prompts = list(prompts)
        self.reward_fn = reward_fn
        self.config = config
        self.checkpoints = checkpoints
        self.progress = progress
        self.desc = desc
        self.step_callback = step_callback if step_callback is not None else active_step_logger()
        self.reference = reference
        if config.beta > 0 and reference is None:
            self.reference = frozen_reference(policy)
        self.advantage = advantage_strategy(config)
        self.dynamic_sampling = config.dynamic_sampling_spec()
        self.token_weights = token_weight_strategy(config)
        wants_entropy = self.advantage.needs_entropy(config.advantage)  # HICRA's, ToR's
        self.needs_entropy = self.token_weights.needs_entropy or wants_entropy
        self.credit = credit_recorder(config, self.token_weights, reward_fn)  # None: off
        # The caller's first, then the strategy's own: a key both report keeps the strategy's.
        self.reward_metrics = [*reward_metrics, *self.advantage.reward_metrics(config.advantage)]
        self.result = GRPOResult()
        self.start_step = 0
        self.ahead: RolloutAhead | None = None  # the sampling process, with max_staleness
        self._pending_rollout: dict[str, Any] | None = None  # a resumed run's next batch
        check_off_policy(self)
        self._sharded_optimizer_state: dict[str, Any] | None = None  # loaded after sharding
        self._setup_memory()
        self._setup_optimizer()
        self._resume()
        self._prepare_distributed()

    @property
    def _fsdp(self) -> bool:
        return self.accelerator is not None and self.accelerator.is_fsdp2

    @property
    def is_main_process(self) -> bool:
        return self.accelerator is None or self.accelerator.is_main_process

    # ------------------------------------------------------------------ setup
    def needs_rollout_logprobs(self) -> bool:
        """Whether the rollout must score its own samples (a no-grad forward). With one
        optimizer step per rollout batch the update's policy is the sampling one, so old_logp =
        logp.detach() (ratio 1, as TRL does); ToR reads the rollout log-probs for its visual
        sensitivity; an engine that is not the trained module (vLLM) always needs them, its
        sampler's log-probs not being the trainer's (TRL does the same)."""
        return (
            self.optimizer_steps_per_rollout() > 1
            or self.token_weights.needs_rollout_logprobs
            or not self.policy.samples_module
        )

    def optimizer_steps_per_rollout(self) -> int:
        B = self.config.rollout_batch_size
        minibatch = self.config.minibatch_size or B
        return self.config.num_iterations * (B // minibatch)

    def _setup_memory(self) -> None:
        self._device_type = prepare_memory(self.policy.module, self.config)

    def _autocast(self) -> AbstractContextManager:
        """bfloat16 autocast for the model's forward passes when ``config.bf16``; backward
        passes run outside it (PyTorch's advice), in the dtypes the forward chose."""
        if not self.config.bf16:
            return nullcontext()
        return torch.autocast(self._device_type, dtype=torch.bfloat16)

    def _setup_optimizer(self) -> None:
        c = self.config
        params = [p for p in self.policy.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=c.learning_rate, weight_decay=c.weight_decay)
        total = c.steps * self.optimizer_steps_per_rollout()
        self.scheduler = get_cosine_schedule_with_warmup(
            self.optimizer, num_warmup_steps=min(c.warmup_steps, total), num_training_steps=total
        )

    def _resume(self) -> None:
        if self.checkpoints is None:
            return
        state = self.checkpoints.load_latest(self.policy.module)
        if state is None:
            return
        saved_layout = state.get("optimizer_layout", "torch")
        layout = FULL_OPTIMIZER_LAYOUT if self._fsdp else "torch"
        if saved_layout != layout:
            raise ConfigError(
                f"the checkpoint's optimizer state is in the {saved_layout!r} layout, this run "
                f"needs {layout!r} (written with and without FSDP); resume it as it was "
                f"written, or start in another checkpoint folder"
            )
        if self._fsdp:
            # The whole (unsharded) state, keyed by parameter name: shards exist only after
            # prepare, so _prepare_distributed loads it then.
            self._sharded_optimizer_state = state["optimizer"]
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.result = GRPOResult(state["history"], state["samples"], state.get("credit", []))
        self.start_step = state["step"]
        self._pending_rollout = state.get("pending_rollout")

    def _prepare_distributed(self) -> None:
        """Wrap the model in DDP and the optimizer for the accelerator (after resuming, so every
        process starts from the same loaded state). ``policy.module`` stays the bare model:
        ``generate`` and saving need it; only the update's forward runs through the wrapper.
        FSDP2 shards ``policy.module`` in place instead (the wrapper is the module itself)."""
        self._train_module = self.policy.module
        if self.accelerator is None:
            return
        if self.accelerator.is_fsdp2:
            self._check_fsdp()
        # The scheduler stays unprepared: accelerate's scheduler wrapper steps once per process
        # per call (it assumes a sharded dataloader), which would compress the schedule.
        self._train_module, self.optimizer = self.accelerator.prepare(
            self.policy.module, self.optimizer
        )
        if self._sharded_optimizer_state is not None:
            load_full_optimizer_state(
                self._train_module, self.optimizer, self._sharded_optimizer_state
            )
            self._sharded_optimizer_state = None
        if self.reference is not None:
            self.reference.module.to(self.accelerator.device)

    def _check_fsdp(self) -> None:
        """What FSDP2 sharding (``prepare`` shards ``policy.module`` in place) cannot run yet.
        Generation works: the model's own forward gathers each group's parameters."""
        backend = getattr(self.policy, "backend", None)
        if backend is not None and backend.name == "lean":
            raise ConfigError(
                "rollout 'lean' reads the module's parameters directly, which FSDP holds as "
                "shards; set rollout: {name: hf} with fsdp"
            )
        if is_lora_model(self.policy.module):
            raise ConfigError(
                "lora with fsdp is not supported yet (its checkpoints and the adapter-disabled "
                "KL reference are written for a whole model): drop one of policy.lora and "
                "distributed.accelerate.fsdp"
            )

    # ------------------------------------------------------------------ train
    def train(self) -> GRPOResult:
        c = self.config
        self._report(self.result.history)  # a resumed run's earlier steps
        if self.start_step >= c.steps:
            logger.info(
                "checkpoint already at step %d of %d: nothing to train", self.start_step, c.steps
            )
            return self.result
        run = f"{self.desc}[{c.advantage['name']}/{c.token_weights['name']}]"
        bar = tqdm(
            range(self.start_step, c.steps),
            initial=self.start_step,
            total=c.steps,
            desc=run,
            disable=not (self.progress and self.is_main_process),
        )
        with sampling_ahead(self, self._pending_rollout):  # max_staleness: sets self.ahead
            for step in bar:
                done = step + 1
                saves = checkpoint_due(done, c.steps, c.checkpoint_every)
                try:
                    metrics = self.step(step)
                    # Every step: the next one samples from these weights, and a sampler fed
                    # NaN fails without saying why (or asserts on a GPU).
                    check_finite_weights(self.policy.module, self.accelerator)
                except NonFiniteValue as problem:
                    raise non_finite_error(problem, done, run, self.checkpoints) from problem
                self.result.history.append(metrics)
                self._report([metrics])
                bar.set_postfix(
                    reward=f"{metrics['reward/total']:.3f}", kl=f"{metrics['actor/kl']:.3g}"
                )
                if self.checkpoints is not None and saves:
                    self.save(done)
        return self.result

    def step(self, step: int) -> dict[str, float]:
        """One rollout batch and its updates; returns the step's namespaced metrics."""
        c = self.config
        torch.manual_seed(step_seed(c.seed, step, RANK_SALT * self.process_index))
        t0 = time.perf_counter()
        batch, rewards, sampling_metrics, t_rollout = self.next_rollout(step)  # name -> (B,)
        lengths = batch.completion_mask.sum(dim=1)  # (B,), before truncated ones are masked
        shaped, shaping_metrics = shape_batch(batch, rewards, c)
        # The strategies may score the batch with the policy (ToR's no-image pass).
        with self._autocast():
            advantages, adv_metrics = self.advantage.compute(
                c.advantage, shaped, batch, self.policy, c
            )  # (B, T)
            # The generator is seeded alike on every process, so a strategy that gathers
            # batch-global statistics through the accelerator breaks ties identically everywhere.
            weight_context = WeightContext(
                generator=torch.Generator().manual_seed(step_seed(c.seed, step, 1)),
                accelerator=self.accelerator,
            )
            weights, weight_metrics = self.token_weights.compute(
                c.token_weights, batch, self.policy, weight_context
            )  # (B, T)
            rollout_metrics = sampler_mismatch(
                batch.old_logp, batch.sampler_logp, batch.completion_mask
            )
            cap = c.importance_cap()  # else loss() weighs by it, when old_logp is its forward's
            if cap is not None and batch.sampler_logp is not None and batch.old_logp.numel():
                weights = weights * truncated_importance_weights(
                    batch.old_logp, batch.sampler_logp, batch.completion_mask, cap
                )  # (B, T)
            ref_logp = None
            if c.beta > 0:
                with torch.no_grad():
                    ref_logp, _ = self.reference.completion_logprobs(batch)  # (B, T)
        recording = self.credit is not None and self.is_main_process and self.credit.records(step)
        if recording:  # the credit inspector keeps this step's first completions
            self.credit.begin(step, batch, rewards, advantages, weights, self.policy)
        t1 = time.perf_counter()
        update_metrics = self.update(step, batch, advantages, weights, ref_logp)
        t_update = time.perf_counter() - t1
        if recording:
            self.result.credit.extend(self.credit.finish())

        mask = batch.completion_mask
        metrics: dict[str, float] = {"step": step + 1}  # int: MLflow steps are integers
        # Reward metrics describe the whole rollout batch: every process's rewards, gathered
        # (groups stay intact: each process holds whole groups).
        all_rewards = self._gather(rewards)
        total = weighted_reward(all_rewards, c.rewards)
        metrics["reward/total"] = total.mean().item()
        metrics["reward/total_std"] = total.std().item() if total.numel() > 1 else 0.0
        for name, values in all_rewards.items():
            flag = "/" in name  # see rewards.RewardFn
            metrics[f"reward/{name}"] = values.sum().item() if flag else values.mean().item()
        for reward_metric in self.reward_metrics:
            metrics.update(reward_metric(all_rewards, batch.group_size))
        # These, and lr, are the same on every process; the rest are averaged across them.
        global_keys = {*metrics, "lr"}
        for part in (
            sampling_metrics,
            shaping_metrics,
            adv_metrics,
            weight_metrics,
            rollout_metrics,
            update_metrics,
        ):
            metrics.update(part)
        if batch.entropy is not None:
            metrics["actor/topp_entropy"] = (
                (batch.entropy * mask).sum() / mask.sum().clamp(min=1)
            ).item()
        metrics["completion/length"] = lengths.mean().item()
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics["time/rollout_s"] = t_rollout
        metrics["time/update_s"] = t_update
        metrics["time/step_s"] = time.perf_counter() - t0
        self._record_samples(step, batch, rewards)
        return self._mean_over_processes(metrics, skip=global_keys)

    def _report(self, rows: Sequence[dict[str, float]]) -> None:
        if self.step_callback is not None and self.is_main_process:
            for row in rows:
                self.step_callback(int(row["step"]), row)

    def next_rollout(self, step: int) -> Rollout:
        """``draw(step)``; with ``max_staleness``, the batch the sampling process drew
        (``training.offpolicy``), scored here with the current weights where needed."""
        if self.ahead is None:
            return self.draw(step)
        t0 = time.perf_counter()
        batch, rewards, metrics, seconds = self.ahead.take(step)
        metrics["time/rollout_wait_s"] = time.perf_counter() - t0
        self._score(batch)
        return batch, rewards, metrics, seconds

    def rollout(
        self, step: int, offset: int = 0, count: int | None = None, score: bool = True
    ) -> RolloutBatch:
        """Draw ``count`` prompts (default ``prompts_per_step``), positions ``offset`` on of the
        step's seeded prompt order, and G completions for each; with several processes, each
        samples its own contiguous share of them. ``score``: the rollout scores its samples
        when the update or the token weights need it (else the caller does)."""
        c = self.config
        count = c.prompts_per_step if count is None else count
        generator = torch.Generator().manual_seed(step_seed(c.seed, step, 2))
        picked = torch.randperm(len(self.prompts), generator=generator)[offset : offset + count]
        if len(picked) < count:  # the step's order is used up: draw with replacement
            if offset:  # a later draw of dynamic sampling: draws of its own
                generator.manual_seed(step_seed(c.seed, step, 2) + offset)
            picked = torch.randint(len(self.prompts), (count,), generator=generator)
        # Every process draws the same global `picked` (same seed), then keeps its share.
        share = count // self.num_processes
        picked = picked[self.process_index * share : (self.process_index + 1) * share]
        batch = self.policy.sample(
            [self.prompts[i] for i in picked.tolist()],
            c.group_size,
            with_entropy=score and self.needs_entropy,
            with_logprobs=score and self.needs_rollout_logprobs(),
        )
        batch.prompt_index = picked.repeat_interleave(c.group_size)
        return batch

    def draw(self, step: int, score: bool = True) -> Rollout:
        """The step's rollout batch, its rewards (name -> (B,)), the dynamic-sampling metrics
        and the seconds the sampling took (with dynamic sampling, the rewards of every draw
        too); ``score``: see ``rollout``."""
        t0 = time.perf_counter()
        if self.dynamic_sampling is not None:
            batch, rewards, metrics = self._dynamic_rollout(step, score)
            return batch, rewards, metrics, time.perf_counter() - t0
        with self._autocast():
            batch = self.rollout(step, score=score)
        t_rollout = time.perf_counter() - t0
        return batch, self._rewards(batch), {}, t_rollout

    def _rewards(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """name -> (B,) rewards of ``batch``. Reward functions score text on the CPU; the
        strategies combine the rewards with the batch's masks, which live where the policy
        does (a GPU)."""
        rewards = self.reward_fn(batch.completion_texts, batch.prompt_index)
        device = batch.completion_mask.device
        return {name: values.to(device) for name, values in rewards.items()}

    def _dynamic_rollout(
        self, step: int, score: bool
    ) -> tuple[RolloutBatch, dict[str, torch.Tensor], dict[str, float]]:
        """``dapo.fill_batch`` over this step's prompt order; the draws are not scored, the
        kept batch is, once, where the update or the token weights need it."""

        def draw(offset: int, count: int) -> tuple[RolloutBatch, dict[str, torch.Tensor]]:
            with self._autocast():
                batch = self.rollout(step, offset, count, score=False)
            return batch, self._rewards(batch)

        batch, rewards, metrics = fill_batch(
            draw, self.dynamic_sampling, self.config.prompts_per_step
        )
        if score:
            self._score(batch)
        return batch, rewards, metrics

    def _score(self, batch: RolloutBatch) -> None:
        """Set ``batch.old_logp`` (and the entropy) with the current weights where the update
        or the token weights need them."""
        with_entropy = self.needs_entropy
        if self.needs_rollout_logprobs() or with_entropy:
            with torch.no_grad(), self._autocast():
                batch.old_logp, batch.entropy = self.policy.completion_logprobs(batch, with_entropy)

    def update(
        self,
        step: int,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        weights: torch.Tensor,
        ref_logp: torch.Tensor | None,
    ) -> dict[str, float]:
        """``num_iterations`` passes of clipped-surrogate updates over shuffled minibatches
        (``minibatch_size / num_processes`` rows of this process's batch each).

        When that minibatch is a multiple of the group size G, the order of the groups is
        shuffled and each group's G rows stay consecutive, so every minibatch (and every
        micro-batch whose size is a multiple of G) holds whole groups and the shared-prefix
        forward scores each prompt once; otherwise the rows are shuffled one by one.
        """
        c = self.config
        B, G = batch.batch_size, batch.group_size
        minibatch = B if c.minibatch_size is None else c.minibatch_size // self.num_processes
        whole_groups = minibatch % G == 0 and B % G == 0
        generator = torch.Generator().manual_seed(step_seed(c.seed, step, 3))
        sums: dict[str, float] = {}
        n_updates = 0
        self.policy.module.train()
        for _ in range(c.num_iterations):
            if whole_groups:
                groups = torch.randperm(B // G, generator=generator)  # (B/G,)
                order = (groups.unsqueeze(1) * G + torch.arange(G)).flatten()  # (B,)
            else:
                order = torch.randperm(B, generator=generator)  # (B,)
            for start in range(0, B, minibatch):
                rows = order[start : start + minibatch]
                metrics = self.optimizer_step(
                    batch.select(rows),
                    advantages[rows],
                    weights[rows],
                    None if ref_logp is None else ref_logp[rows],
                )
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                n_updates += 1
        return {key: value / n_updates for key, value in sums.items()}

    def optimizer_step(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        weights: torch.Tensor,
        ref_logp: torch.Tensor | None,
    ) -> dict[str, float]:
        """One optimizer step on one minibatch (this process's rows): ``loss`` and backward on
        each micro-batch, gradients accumulated, then clip and step.

        Each micro-batch's loss is weighted by ``micro_batch_share``, so the accumulated
        gradient and the reported loss are those of the minibatch in one pass.

        With several processes DDP averages the per-process gradients. That equals the gradient
        of the loss over the global minibatch for ``seq-mean-token-mean`` and
        ``seq-mean-token-sum-norm`` (every process holds the same number of sequences), but not
        exactly for ``token-mean``: each process divides by its own token count, so the result
        weighs the processes' tokens by 1 / (num_processes * local_tokens) instead of
        1 / global_tokens.
        """
        c = self.config
        b = batch.batch_size
        micro = b if c.micro_batch_size is None else c.micro_batch_size
        mask = batch.completion_mask
        n_tokens = max(1, int(mask.bool().sum()))
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        for start in range(0, b, micro):
            rows = slice(start, start + micro)
            part = batch if micro == b else batch.select(torch.arange(b)[rows])
            loss_share = micro_batch_share(c.agg, mask[rows], mask)
            token_share = int(mask[rows].bool().sum()) / n_tokens
            last = start + micro >= b
            # DDP all-reduces the gradients in the last micro-batch's backward only.
            with self._no_sync(last):
                loss, part_metrics = self.loss(
                    part,
                    advantages[rows],
                    weights[rows],
                    None if ref_logp is None else ref_logp[rows],
                )
                self._backward(loss * loss_share if micro < b else loss)
            for key, value in part_metrics.items():
                share = loss_share if key in LOSS_METRICS else token_share
                metrics[key] = metrics.get(key, 0.0) + (value * share if micro < b else value)
        if self.accelerator is None:
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.policy.module.parameters(), c.max_grad_norm
            )
        else:
            self._reshard()
            grad_norm = self.accelerator.clip_grad_norm_(
                self.policy.module.parameters(), c.max_grad_norm
            )
            if isinstance(grad_norm, DTensor):  # FSDP2: the norm of every shard's gradients
                grad_norm = grad_norm.full_tensor()
        check_update(metrics["actor/loss"], grad_norm, self.accelerator)  # before the step
        self.optimizer.step()
        self.policy.weights_updated()  # an engine with its own weights reloads before sampling
        self.scheduler.step()
        # Loss and gradient norm first, then the entropy and policy_loss's metrics.
        loss_value = metrics.pop("actor/loss")
        return {"actor/loss": loss_value, "actor/grad_norm": float(grad_norm), **metrics}

    def loss(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        weights: torch.Tensor,
        ref_logp: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The forward and ``policy_loss`` of one micro-batch; ``(loss, metrics)``."""
        c = self.config
        with self._ddp_forward(), self._autocast():
            logp, _ = self.policy.completion_logprobs(batch)  # (b, T)
            perception = perception_term(self.policy, batch, logp, c)  # PAPO's; None: off
        old_logp = batch.old_logp if batch.old_logp.numel() else logp.detach()
        mismatch = {}
        if not batch.old_logp.numel():  # the sampler's lag, against this forward's log-probs
            weights, mismatch = lag_corrected(weights, old_logp, batch, c.importance_cap())
        if self.credit is not None:  # the ratios of the completions it records, if any
            self.credit.observe(batch, logp, old_logp, advantages)
        loss, metrics = policy_loss(
            logp,
            old_logp,
            advantages,
            batch.completion_mask,
            weights=weights,
            ref_logp=ref_logp,
            sampling_logp=batch.sampler_logp,
            **c.loss_options(),
        )
        loss, metrics = with_perception(loss, metrics, perception)
        mask = batch.completion_mask
        # Mean -log p of the sampled tokens: the sampling entropy's free Monte Carlo estimate.
        sampled_entropy = (-(logp.detach() * mask).sum() / mask.sum().clamp(min=1)).item()
        metrics = {"actor/loss": loss.item(), "actor/entropy": sampled_entropy, **metrics}
        return loss, {**metrics, **mismatch}

    def _backward(self, loss: torch.Tensor) -> None:
        if self.accelerator is None:
            loss.backward()
        else:
            self.accelerator.backward(loss)  # DDP all-reduces (averages) the gradients here

    def _no_sync(self, sync: bool) -> AbstractContextManager:
        """DDP's ``no_sync`` (gradients accumulate locally, no all-reduce) unless ``sync``."""
        if sync or self.accelerator is None:
            return nullcontext()
        return self.accelerator.no_sync(self._train_module)

    def _reshard(self) -> None:
        """Under FSDP2, register every module's DTensor shards again (the optimizer's
        parameters, which hold the reduced gradients): the root module keeps the unsharded
        parameters its forward gathered (``reshard_after_forward`` is False for the root, and
        for the head accelerate groups with it), so ``module.parameters()`` would otherwise
        be those full local copies with this process's unreduced gradients."""
        if self.accelerator is None or not self.accelerator.is_fsdp2:
            return
        for module in self.policy.module.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    @contextmanager
    def _ddp_forward(self) -> Iterator[None]:
        """Route the policy's forward through the DDP wrapper, whose backward hooks average the
        gradients across processes; a no-op in a single process."""
        bare = self.policy.module
        self.policy.module = self._train_module
        try:
            yield
        finally:
            self.policy.module = bare

    def _gather(self, rewards: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """name -> (B * num_processes,) rewards of every process, in process order."""
        if self.accelerator is None:
            return rewards
        device = self.accelerator.device
        return {k: self.accelerator.gather(v.to(device)).cpu() for k, v in rewards.items()}

    def _mean_over_processes(self, metrics: dict[str, float], skip: set[str]) -> dict[str, float]:
        """``metrics`` with every key not in ``skip`` averaged across processes."""
        if self.accelerator is None:
            return metrics
        keys = [k for k in metrics if k not in skip]  # same order on every process
        values = torch.tensor(
            [metrics[k] for k in keys], dtype=torch.float64, device=self.accelerator.device
        )
        means = self.accelerator.reduce(values, reduction="mean").tolist()
        return {**metrics, **dict(zip(keys, means, strict=True))}

    def _record_samples(
        self, step: int, batch: RolloutBatch, rewards: dict[str, torch.Tensor]
    ) -> None:
        c = self.config
        if not self.is_main_process or c.log_samples_every <= 0 or step % c.log_samples_every != 0:
            return
        for row in range(min(c.samples_per_log, batch.batch_size)):
            sample = {
                "step": step + 1,
                "prompt_index": int(batch.prompt_index[row]),
                "completion": batch.completion_texts[row],
            }
            sample.update({f"reward/{k}": float(v[row]) for k, v in rewards.items()})
            self.result.samples.append(sample)

    # ------------------------------------------------------------------ save
    def save(self, step: int) -> None:
        """Write a checkpoint from the main process (every process holds the same weights and
        optimizer state; under FSDP each holds shards, gathered whole onto the main process
        first, so the checkpoint loads into any number of processes); the others wait until
        it is complete."""
        weights, optimizer_state, layout = None, None, "torch"
        if self._fsdp:
            self._reshard()
            weights, optimizer_state = full_state_dicts(self._train_module, self.optimizer)
            layout = FULL_OPTIMIZER_LAYOUT
        if self.is_main_process:
            self.checkpoints.save(
                step,
                self.policy.module,
                {
                    "optimizer": self.optimizer.state_dict()
                    if optimizer_state is None
                    else optimizer_state,
                    "optimizer_layout": layout,
                    "scheduler": self.scheduler.state_dict(),
                    "history": self.result.history,
                    "samples": self.result.samples,
                    "credit": self.result.credit,
                    "config": self.config.to_dict(),
                    # max_staleness: the next step's batch, drawn with older weights.
                    "pending_rollout": self.ahead and self.ahead.pending_state(),
                },
                weights=weights,
            )
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()
