"""Data parallelism through accelerate: two CPU processes (gloo) against one.

The two-process runs are real: ``torch.multiprocessing.spawn`` starts two workers that join a
gloo process group through ``Accelerator(cpu=True)``. The comparison with one process is made
at the optimizer-step level on a fixed global batch split in two halves, so sampling
randomness plays no part.
"""

import copy
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from creditflow.training import CheckpointStore
from creditflow.training.seeding import step_seed
from tests.training.helpers import (
    TWO_PROCESS_UPDATE,
    fixed_global_update,
    length_reward,
    make_trainer,
)

WORLD_SIZE = 2
TIMEOUT_S = 120
# Shared by the 1- and 2-process trainers: B = 4 prompts x 2 = 8 rows for the fixed update.
UPDATE = TWO_PROCESS_UPDATE
# The 2-step run: 2 prompts x 4 per step (one prompt per process), 2 optimizer steps each.
RUN = {
    "steps": 2,
    "prompts_per_step": 2,
    "group_size": 4,
    "minibatch_size": 4,
    "checkpoint_every": 1,
    "log_samples_every": 1,
    "samples_per_log": 2,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, workdir: str) -> None:
    """One process of the 2-process run: the fixed update, then 2 GRPO steps."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(WORLD_SIZE),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(WORLD_SIZE),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    from accelerate import Accelerator  # noqa: PLC0415 - after the environment is set

    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == WORLD_SIZE and accelerator.process_index == rank
    workdir = Path(workdir)
    inputs = torch.load(workdir / "inputs.pt", weights_only=False)
    tokenizer, prompts = inputs["tokenizer"], inputs["prompts"]
    out = {}

    # 1. One optimizer step on this process's half of the fixed global batch.
    model = copy.deepcopy(inputs["model"]).train()
    trainer = make_trainer(model, tokenizer, prompts, accelerator=accelerator, **UPDATE)
    half = torch.arange(rank * 4, rank * 4 + 4)
    batch = inputs["batch"]
    metrics = trainer.optimizer_step(
        batch.select(half), inputs["advantages"][half], batch.completion_mask[half], None
    )
    out["update"] = {
        "loss": metrics["actor/loss"],
        "grad_norm": metrics["actor/grad_norm"],
        "grads": {k: p.grad.clone() for k, p in model.named_parameters()},
        "params": {k: p.detach().clone() for k, p in model.named_parameters()},
    }

    # 1b. The same step in micro-batches of 2 rows (gradient accumulation under DDP's no_sync,
    # all-reduced in the last micro-batch's backward).
    model = copy.deepcopy(inputs["model"]).train()
    trainer = make_trainer(
        model, tokenizer, prompts, accelerator=accelerator, micro_batch_size=2, **UPDATE
    )
    metrics = trainer.optimizer_step(
        batch.select(half), inputs["advantages"][half], batch.completion_mask[half], None
    )
    out["micro_update"] = {
        "loss": metrics["actor/loss"],
        "grads": {k: p.grad.clone() for k, p in model.named_parameters()},
    }

    # 2. Two GRPO steps with checkpoints, from the same initial weights on both processes.
    model = copy.deepcopy(inputs["model"])
    store = CheckpointStore(workdir / "checkpoints")
    saved, save = [], store.save

    def recording_save(step, *args, **kwargs):
        saved.append(step)
        return save(step, *args, **kwargs)

    store.save = recording_save
    rewards = []

    def recording_reward(texts, prompt_index):
        rewards.append((prompt_index, length_reward(texts, prompt_index)))
        return rewards[-1][1]

    trainer = make_trainer(
        model, tokenizer, prompts, recording_reward, store, accelerator=accelerator, **RUN
    )
    result = trainer.train()
    out["run"] = {
        "params": {k: p.detach().clone() for k, p in model.named_parameters()},
        "history": result.history,
        "samples": result.samples,
        "saved": saved,
        "rewards": rewards,
    }
    torch.save(out, workdir / f"rank{rank}.pt")
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


def _spawn(workdir: Path) -> None:
    context = mp.spawn(_worker, args=(_free_port(), str(workdir)), nprocs=WORLD_SIZE, join=False)
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {WORLD_SIZE}-process run did not finish in {TIMEOUT_S} s")


@pytest.mark.slow
def test_two_processes_train_in_lockstep_and_match_one(
    make_model, tapo_tokenizer, tapo_prompts, tmp_path
):
    # The fixed global batch and advantages that both runs update on, and the 1-process step
    # on the whole of it.
    inputs, single_model, single_metrics = fixed_global_update(
        make_model(), tapo_tokenizer, tapo_prompts[:10]
    )
    model, prompts = inputs["model"], inputs["prompts"]
    torch.save(inputs, tmp_path / "inputs.pt")

    _spawn(tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]

    # -- one update: DDP's averaged gradient is the 1-process gradient of the global batch
    # (seq-mean-token-mean, 4 sequences per process), so is the step it takes.
    u0, u1 = ranks[0]["update"], ranks[1]["update"]
    assert (u0["loss"] + u1["loss"]) / 2 == pytest.approx(single_metrics["actor/loss"], abs=1e-6)
    assert u0["grad_norm"] == u1["grad_norm"]
    assert u0["grad_norm"] == pytest.approx(single_metrics["actor/grad_norm"], rel=1e-5)
    assert single_metrics["actor/grad_norm"] > UPDATE["max_grad_norm"], "clipping is exercised"
    for name, p in single_model.named_parameters():
        assert torch.equal(u0["grads"][name], u1["grads"][name]), name
        torch.testing.assert_close(u0["grads"][name], p.grad, atol=1e-6, rtol=1e-5, msg=name)
        assert torch.equal(u0["params"][name], u1["params"][name]), name
        # Adam's first step is ~lr * sign(grad): float noise on a gradient element near eps
        # (1e-8) moves it by far more than the noise, so the weights get a looser tolerance
        # (1% of lr) than the gradients.
        torch.testing.assert_close(u0["params"][name], p.detach(), atol=1e-4, rtol=0)

    # -- the same update in micro-batches: the same loss and the same averaged gradient.
    m0, m1 = ranks[0]["micro_update"], ranks[1]["micro_update"]
    assert m0["loss"] == pytest.approx(u0["loss"], abs=1e-6)
    assert m1["loss"] == pytest.approx(u1["loss"], abs=1e-6)
    for name, p in single_model.named_parameters():
        assert torch.equal(m0["grads"][name], m1["grads"][name]), name
        torch.testing.assert_close(m0["grads"][name], p.grad, atol=1e-6, rtol=1e-5, msg=name)

    # -- two GRPO steps: identical weights and (averaged) metrics on both processes.
    r0, r1 = ranks[0]["run"], ranks[1]["run"]
    for name in r0["params"]:
        assert torch.equal(r0["params"][name], r1["params"][name]), name
    initial = dict(model.named_parameters())
    assert all(not torch.equal(r0["params"][k], initial[k]) for k in r0["params"]), "it trained"
    assert r0["history"] == r1["history"]
    assert [row["step"] for row in r0["history"]] == [1.0, 2.0]
    # Each process drew its own share of the step's global prompts.
    for step in range(2):
        generator = torch.Generator().manual_seed(step_seed(0, step, 2))
        picked = torch.randperm(len(prompts), generator=generator)[:2]
        for rank, run in enumerate((r0, r1)):
            index, _ = run["rewards"][step]
            assert index.tolist() == [picked[rank].item()] * 4
        # Reward metrics cover the whole rollout batch (both processes' rewards).
        lengths = torch.cat([run["rewards"][step][1]["length"] for run in (r0, r1)])
        assert r0["history"][step]["reward/length"] == pytest.approx(lengths.mean().item())
    # Only the main process records samples and writes checkpoints.
    assert r0["saved"] == [1, 2] and r1["saved"] == []
    assert len(r0["samples"]) == 4 and r1["samples"] == []
    saved = copy.deepcopy(model)
    store = CheckpointStore(tmp_path / "checkpoints")
    assert store.load(store.latest(), saved)["step"] == 2
    for name, p in saved.named_parameters():
        assert torch.equal(p, r0["params"][name]), name


@pytest.fixture
def single_process_accelerator():
    from accelerate import Accelerator  # noqa: PLC0415
    from accelerate.state import AcceleratorState, GradientState  # noqa: PLC0415

    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_a_one_process_accelerator_changes_nothing(
    make_model, tapo_tokenizer, tapo_prompts, single_process_accelerator
):
    """With an accelerator of one process the run is bit-identical to the plain one."""
    settings = {"minibatch_size": 4, "beta": 0.05, "log_samples_every": 1}
    plain_model, accelerated_model = make_model(), make_model()
    plain = make_trainer(plain_model, tapo_tokenizer, tapo_prompts, **settings).train()
    accelerated = make_trainer(
        accelerated_model,
        tapo_tokenizer,
        tapo_prompts,
        accelerator=single_process_accelerator,
        **settings,
    ).train()
    for (name, a), b in zip(
        plain_model.named_parameters(), accelerated_model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name

    def no_time(history):
        return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in history]

    assert no_time(accelerated.history) == no_time(plain.history)
    assert accelerated.samples == plain.samples
