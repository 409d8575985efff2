"""Rollouts that overlap the update: one-step off-policy GRPO (``GRPOConfig.max_staleness``).

While the trainer updates on step k's batch, a second process draws step k+1's batch with
the weights the trainer had before that update (step k's), as verl's one-step-off-policy
trainer and the asynchronous trainers of AReaL and prime-rl do. So every batch but the first
is one update behind the weights it trains (staleness 1), and the sampling and the update run
at the same time, on two cores.

How the lag is corrected: the sampler reports the log-probs of the tokens it drew
(``RolloutBatch.sampler_logp``: the ``lean`` decoder returns them; otherwise the sampling
process scores its own samples). The loss's ratio is taken against the trainer's log-probs
before its update (the "proximal" policy of decoupled PPO; with one optimizer step per
rollout they are the update's own forward, detached, so no extra forward runs), and each
token's policy-gradient loss is weighed by the truncated importance weight
``min(pi_trainer / pi_sampler, cap)`` (``algorithms.truncated_importance_weights``, TRL's
``vllm_importance_sampling_correction`` in its ``token_truncate`` mode).

Weights travel through shared memory: the sampling process's module reads its parameters
from one shared copy, which the trainer overwrites after every update, only while that
process waits for its next request (never while it samples). Each batch carries the step of
the weights it was drawn with, and a batch more than ``max_staleness`` steps behind the
trainer raises ``StaleWeightsError``.

The sampling process is a fork of the trainer's (as a ``DataLoader`` worker is): it inherits
the policy, the prompts, the reward function and the seeds, and draws step k's batch exactly
as the trainer itself would (same prompts, same random stream), with older weights. It runs
one intra-op thread. CPU only: CUDA cannot be used in a forked process.

Resuming: a checkpoint written while the next batch is being drawn waits for it and stores
it (``pending_state``), so a resumed run trains on the batch an uninterrupted run would have.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import torch

from creditflow.algorithms import sampler_mismatch, truncated_importance_weights
from creditflow.errors import ConfigError, StaleWeightsError, WorkerError
from creditflow.rollout.batch import RolloutBatch
from creditflow.training.seeding import RANK_SALT, step_seed

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from creditflow.training.grpo import GRPOTrainer

logger = logging.getLogger(__name__)

# Seconds the trainer waits for the sampling process to leave at the end of a run.
CLOSE_TIMEOUT_S = 10.0

# What the sampling process returns for one step: (batch, rewards name -> (B,), sampling
# metrics, seconds it took).
Rollout = tuple[RolloutBatch, dict[str, torch.Tensor], dict[str, float], float]


def check_off_policy(trainer: GRPOTrainer) -> None:
    """ConfigError, naming the key, when ``max_staleness > 0`` cannot run with this trainer."""
    if not trainer.config.max_staleness:
        return
    fix = "set max_staleness to 0"
    if trainer.accelerator is not None:
        raise ConfigError(
            f"max_staleness > 0 runs in a single process (the sampling process is a fork of "
            f"it), not with {trainer.num_processes} data-parallel processes; {fix}"
        )
    if not trainer.policy.samples_module:
        raise ConfigError(
            "max_staleness > 0 samples with the trained module's weights in a second process "
            f"(rollout hf or lean); rollout {trainer.config.rollout.get('name')!r} has its own "
            f"engine: {fix} or choose rollout: {{name: lean}}"
        )
    device = next(trainer.policy.module.parameters()).device
    if device.type != "cpu":
        raise ConfigError(
            f"max_staleness > 0 samples in a forked CPU process; the policy is on {device}, "
            f"where a forked process cannot run: {fix}"
        )


def lag_corrected(
    weights: torch.Tensor, trainer_logp: torch.Tensor, batch: RolloutBatch, cap: float | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """``weights`` (b, T) times the truncated importance weight of each token,
    ``min(exp(trainer_logp - sampler_logp), cap)``, and the mismatch metrics; unchanged when
    ``cap`` is None or the sampler reported no log-probs. With one optimizer step per rollout
    ``trainer_logp`` (b, T) is the update's own forward, detached: the trainer's log-probs
    before its update, while the sampler's may be an older step's weights'."""
    if cap is None or batch.sampler_logp is None:
        return weights, {}
    mask = batch.completion_mask
    correction = truncated_importance_weights(trainer_logp, batch.sampler_logp, mask, cap)
    return weights * correction, sampler_mismatch(trainer_logp, batch.sampler_logp, mask)


@contextmanager
def sampling_ahead(trainer: GRPOTrainer, pending: dict[str, Any] | None) -> Iterator[None]:
    """With ``max_staleness``, ``trainer.ahead`` is a started ``RolloutAhead`` for the block
    (from ``trainer.start_step``, ``pending`` a resumed run's stored batch) and is closed
    after it, however the block ends; without, a no-op."""
    if not trainer.config.max_staleness:
        yield
        return
    trainer.ahead = RolloutAhead(trainer, pending)
    try:
        trainer.ahead.start(trainer.start_step)
        yield
    finally:
        trainer.ahead.close()
        trainer.ahead = None


def batch_state(batch: RolloutBatch) -> dict[str, Any]:
    """``batch`` as plain containers and tensors (what a checkpoint's trainer state holds)."""
    return {f.name: getattr(batch, f.name) for f in fields(batch)}


def _parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    # remove_duplicate (the default): a tied embedding and output head are one entry.
    return dict(module.named_parameters())


class RolloutAhead:
    """The sampling process of a one-step off-policy run and the trainer's end of it.

    ``start(step)`` forks the process and asks for ``step``'s batch with the current
    weights; ``take(step)`` returns that batch, then pushes the current weights and asks for
    the next step's batch, which is drawn while the trainer updates; ``close`` ends it.
    """

    def __init__(self, trainer: GRPOTrainer, pending: dict[str, Any] | None = None):
        self.trainer = trainer
        self.max_staleness = trainer.config.max_staleness
        self._process: multiprocessing.Process | None = None
        self._conn: Connection | None = None
        self._shared: dict[str, torch.Tensor] = {}
        self._requested: int | None = None  # the step whose batch is being drawn
        # (step, weights step, rollout) received and not yet taken: a resumed run's stored
        # batch, or one a checkpoint waited for.
        self._ready: tuple[int, int, Rollout] | None = None
        if pending is not None:
            batch = RolloutBatch(**pending["batch"])
            rollout = (batch, pending["rewards"], pending["metrics"], pending["seconds"])
            self._ready = (pending["step"], pending["weights_step"], rollout)

    # ------------------------------------------------------------------ trainer side
    def start(self, step: int) -> None:
        """Fork the sampling process; unless a stored batch is ready, draw ``step``'s."""
        module = self.trainer.policy.module
        self._shared = {
            name: p.detach().clone().share_memory_() for name, p in _parameters(module).items()
        }
        context = multiprocessing.get_context("fork")
        parent, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(self.trainer, child, self._shared), daemon=True
        )
        self._process.start()
        child.close()  # the child's end lives in the child: a dead child then reads as EOF
        self._conn = parent
        if self._ready is None:
            self._request(step, weights_step=step)

    def take(self, step: int) -> Rollout:
        """``step``'s rollout; the next step's is requested with the current weights before
        this returns. Raises ``StaleWeightsError`` when it was drawn more than
        ``max_staleness`` steps behind."""
        drawn, weights_step, rollout = self._wait(step)
        lag = step - weights_step
        if lag > self.max_staleness:
            raise StaleWeightsError(
                f"step {step + 1}'s batch was sampled with the weights after {weights_step} "
                f"steps, {lag} behind the trainer's; max_staleness allows {self.max_staleness}"
            )
        if step + 1 < self.trainer.config.steps:
            self._request(step + 1, weights_step=step)
        batch, rewards, metrics, seconds = rollout
        return batch, rewards, {**metrics, "rollout/staleness": float(lag)}, seconds

    def pending_state(self) -> dict[str, Any] | None:
        """The batch being drawn, waited for and kept for ``take``, as plain containers for
        a checkpoint; None when none is being drawn (the last step)."""
        if self._ready is None and self._requested is None:
            return None
        step, weights_step, (batch, rewards, metrics, seconds) = self._wait(None)
        self._ready = (step, weights_step, (batch, rewards, metrics, seconds))
        return {
            "step": step,
            "weights_step": weights_step,
            "batch": batch_state(batch),
            "rewards": rewards,
            "metrics": metrics,
            "seconds": seconds,
        }

    def close(self) -> None:
        """Stop the sampling process (a batch still being drawn is dropped)."""
        if self._process is None:
            return
        try:
            # A batch still being drawn is read off the pipe, so the process is not left
            # blocked on sending it and can read the stop request.
            if self._requested is not None and self._conn.poll(CLOSE_TIMEOUT_S):
                self._conn.recv()
            self._conn.send(None)
        except (OSError, EOFError):  # it is gone already
            pass
        self._process.join(CLOSE_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()
        self._process = None

    def _request(self, step: int, weights_step: int) -> None:
        """Copy the trainer's weights into the shared copy (the sampling process is idle: it
        has answered every request) and ask for ``step``'s batch."""
        for name, p in _parameters(self.trainer.policy.module).items():
            self._shared[name].copy_(p.detach())
        self._conn.send((step, weights_step))
        self._requested = step

    def _wait(self, step: int | None) -> tuple[int, int, Rollout]:
        """The ready rollout, else the one being drawn (blocking); ``step`` must match it."""
        if self._ready is not None:
            ready, self._ready = self._ready, None
        else:
            try:
                reply = self._conn.recv()
            except EOFError as error:
                raise WorkerError("the sampling process died (see its output above)") from error
            self._requested = None
            if reply[0] == "error":
                raise WorkerError(f"the sampling process raised:\n{reply[1]}")
            ready = reply[1:]
        if step is not None and ready[0] != step:
            raise RuntimeError(f"the sampling process drew step {ready[0] + 1}, not {step + 1}")
        return ready


# ---------------------------------------------------------------------- sampling process
def _serve(trainer: GRPOTrainer, conn: Connection, shared: dict[str, torch.Tensor]) -> None:
    """The sampling process: read the trained module's weights from ``shared``, then answer
    ``(step, weights_step)`` requests with ``("ok", step, weights_step, rollout)`` until
    ``None`` or a closed pipe."""
    torch.set_num_threads(1)
    policy = trainer.policy
    for name, p in _parameters(policy.module).items():
        p.data = shared[name]  # the trainer's pushes land here
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the trainer is gone
            return
        if request is None:
            return
        step, weights_step = request
        try:
            rollout = _draw(trainer, step, weights_step)
            conn.send(("ok", step, weights_step, rollout))
        except Exception:  # the trainer raises it: one report, then this process ends
            conn.send(("error", traceback.format_exc()))
            return


def _draw(trainer: GRPOTrainer, step: int, weights_step: int) -> Rollout:
    """``step``'s rollout as the trainer would draw it, with the weights of ``weights_step``,
    unscored (the trainer scores with its own weights where it needs to) but for the sampler's
    log-probs, which the correction needs."""
    policy = trainer.policy
    # The weights changed without an optimizer step here: a backend's cached copy of them
    # (the lean decoder's fused weights) is rebuilt for this version.
    policy.weights_version = weights_step
    backend = getattr(policy, "backend", None)
    if backend is not None:
        backend.load_weights(policy.module, weights_step)
    torch.manual_seed(step_seed(trainer.config.seed, step, RANK_SALT * trainer.process_index))
    t0 = time.perf_counter()
    batch, rewards, metrics, _ = trainer.draw(step, score=False)
    if batch.sampler_logp is None:  # the backend reports none (hf): score the samples here
        with torch.no_grad(), trainer._autocast():
            batch.sampler_logp, _ = policy.completion_logprobs(batch)
    return batch, rewards, metrics, time.perf_counter() - t0
