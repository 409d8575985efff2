"""One supervised trainer for every next-token or pairwise loss: text SFT, VL SFT, ExpModel SFT
and PFT, reranker pre-training.

A caller supplies two functions, ``batch_fn(rows) -> batch`` (row indices of its examples ->
whatever its loss reads) and ``loss_fn(batch) -> (loss, metrics)`` (a scalar tensor and
namespaced floats such as ``{"sft/loss": ...}``); ``SupervisedTrainer`` owns the rest: AdamW and
the learning-rate schedule, the seeded epoch sampler, gradient clipping, the per-step history
(``step`` and ``lr`` added to the caller's metrics), a progress bar, and resumable checkpoints in
a ``CheckpointStore`` (the same store and layout as GRPO's).

One step, in this order (a run's results depend on it, so resumed and fresh runs agree bit
for bit): ``batch_fn`` -> ``loss_fn`` -> ``zero_grad(set_to_none=True)`` -> ``backward``
-> ``clip_grad_norm_`` (unless ``max_grad_norm`` is None) -> ``optimizer.step`` ->
``scheduler.step``. After it, the step's history row goes to the step callback (by default the
MLflow run of the Kedro node, ``tracking.active_step_logger``), so curves show while it trains.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from creditflow.config.supervised import SupervisedConfig
from creditflow.tracking import StepCallback, active_step_logger
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.finite import (
    NonFiniteValue,
    check_finite_scalar,
    check_finite_weights,
    checkpoint_due,
    non_finite_error,
)

logger = logging.getLogger(__name__)

BatchFn = Callable[[list[int]], Any]
LossFn = Callable[[Any], tuple[torch.Tensor, dict[str, float]]]


# Schedule name -> (optimizer, warm-up steps, total steps) -> LambdaLR. With 0 warm-up steps
# "constant" multiplies the lr by exactly 1.0, i.e. AdamW at a fixed lr.
SCHEDULES = {
    "cosine": get_cosine_schedule_with_warmup,
    "constant": lambda optimizer, warmup, total: get_constant_schedule_with_warmup(
        optimizer, warmup
    ),
}


class EpochSampler:
    """Endless ``batch_size`` lists of row indices ``0..n-1``: each epoch a fresh ``randperm``
    from one generator seeded with ``seed``, taken from the front; a batch may straddle two
    epochs (so every batch is full and no example is skipped).

    >>> sampler = EpochSampler(3, batch_size=2, seed=0)
    >>> rows = [sampler.next_batch() for _ in range(3)]
    >>> sorted(rows[0] + rows[1][:1]) == [0, 1, 2]  # the first epoch, then the second
    True
    """

    def __init__(self, n: int, batch_size: int, seed: int):
        if n < 1 or batch_size < 1:
            raise ValueError(f"need n >= 1 and batch_size >= 1, got {n} and {batch_size}")
        self.n, self.batch_size = n, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(n, generator=self.generator).tolist()
        self.cursor = 0

    def next_batch(self) -> list[int]:
        rows = []
        while len(rows) < self.batch_size:
            if self.cursor == len(self.order):  # next epoch, reshuffled
                self.order = torch.randperm(self.n, generator=self.generator).tolist()
                self.cursor = 0
            rows.append(self.order[self.cursor])
            self.cursor += 1
        return rows

    def state_dict(self) -> dict[str, Any]:
        # get_state() is a uint8 tensor: torch.save/load keeps it as is.
        return {
            "n": self.n,
            "generator": self.generator.get_state(),
            "order": list(self.order),
            "cursor": self.cursor,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["n"] != self.n:
            raise ValueError(f"sampler state is for {state['n']} examples, not {self.n}")
        self.generator.set_state(state["generator"])
        self.order, self.cursor = list(state["order"]), int(state["cursor"])


class SupervisedTrainer:
    """Trains ``module`` in place on ``n_examples`` examples with ``loss_fn``.

    Args:
        module: what is trained and checkpointed (its weights).
        n_examples: the examples ``batch_fn`` indexes (``EpochSampler`` rows).
        batch_fn: ``rows -> batch``; ``loss_fn``: ``batch -> (scalar loss, metrics)``.
        config: ``SupervisedConfig``.
        checkpoints: a store for this run only (see ``run_store``); None saves nothing. A store
            with a checkpoint resumes from it; one at ``config.steps`` is not trained again.
        parameters: what AdamW updates and clipping measures (default: ``module``'s that
            require grad: a LoRA model's adapters, every weight of a plain model).
        desc, progress: the progress bar's label, and whether to show it.
        step_callback: ``callback(step, row)`` with each step's history row, after the step,
            and at the start for the rows a resumed run already has; None:
            ``tracking.active_step_logger()`` (the tracked Kedro node's MLflow run, if any).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        n_examples: int,
        batch_fn: BatchFn,
        loss_fn: LossFn,
        config: SupervisedConfig,
        checkpoints: CheckpointStore | None = None,
        parameters: Iterable[torch.nn.Parameter] | None = None,
        desc: str = "supervised",
        progress: bool = True,
        step_callback: StepCallback | None = None,
    ):
        self.module = module
        self.batch_fn, self.loss_fn = batch_fn, loss_fn
        self.config = config
        self.checkpoints = checkpoints
        if parameters is None:
            parameters = (p for p in module.parameters() if p.requires_grad)
        self.parameters = list(parameters)
        self.desc, self.progress = desc, progress
        self.step_callback = step_callback if step_callback is not None else active_step_logger()
        self.sampler = EpochSampler(n_examples, config.batch_size, config.seed)
        self.optimizer = torch.optim.AdamW(
            self.parameters, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self.scheduler = SCHEDULES[config.schedule](
            self.optimizer, min(config.warmup_steps, config.steps), config.steps
        )
        self.history: list[dict[str, float]] = []
        self.start_step = 0
        self._resume()

    def _resume(self) -> None:
        if self.checkpoints is None:
            return
        state = self.checkpoints.load_latest(self.module)
        if state is None:
            return
        saved = {k: v for k, v in state["config"].items() if k != "checkpoint_every"}
        if saved != self.config.run_key():
            raise ValueError(
                f"the checkpoint in {self.checkpoints.directory} was written with {saved}, not "
                f"{self.config.run_key()}: "
                "resume with the same config or use another store"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        # Dropout draws from the global generator: an interrupted run continues its stream.
        torch.set_rng_state(state["rng"])
        if torch.cuda.is_available() and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.history = list(state["history"])
        self.start_step = state["step"]

    def train(self) -> list[dict[str, float]]:
        """Run the remaining steps; returns one metrics row per step (resumed ones included)."""
        c = self.config
        self._report(self.history)  # a resumed run's earlier steps
        if self.start_step >= c.steps:
            logger.info(
                "%s: checkpoint at step %d of %d, nothing to train",
                self.desc,
                self.start_step,
                c.steps,
            )
            return self.history
        self.module.train()
        bar = tqdm(
            range(self.start_step, c.steps),
            initial=self.start_step,
            total=c.steps,
            desc=self.desc,
            disable=not self.progress,
        )
        for step in bar:
            done = step + 1
            saves = checkpoint_due(done, c.steps, c.checkpoint_every)
            try:
                metrics = self.step()
                if saves:  # the last step included: the module handed on must be finite
                    check_finite_weights(self.module)
            except NonFiniteValue as problem:
                raise non_finite_error(problem, done, self.desc, self.checkpoints) from problem
            self.history.append({"step": done, **metrics, "lr": self.scheduler.get_last_lr()[0]})
            self._report(self.history[-1:])
            bar.set_postfix({k: f"{v:.4g}" for k, v in metrics.items()}, refresh=False)
            if self.checkpoints is not None and saves:
                self.save(done)
        return self.history

    def _report(self, rows: list[dict[str, float]]) -> None:
        if self.step_callback is not None:
            for row in rows:
                self.step_callback(int(row["step"]), row)

    def step(self) -> dict[str, float]:
        """One optimizer step on the sampler's next batch; returns the caller's metrics."""
        loss, metrics = self.loss_fn(self.batch_fn(self.sampler.next_batch()))
        self.optimizer.zero_grad(set_to_none=True)
        check_finite_scalar("loss", loss)
        loss.backward()
        if self.config.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.config.max_grad_norm)
            # Before the step: a non-finite gradient would write NaN into every weight.
            check_finite_scalar("grad_norm", grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        return metrics

    def save(self, step: int) -> None:
        self.checkpoints.save(
            step,
            self.module,
            {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "sampler": self.sampler.state_dict(),
                "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "history": self.history,
                "config": self.config.to_dict(),
            },
        )
