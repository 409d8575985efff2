"""run_data_parallel: real gloo process groups on CPU against the one-process loop.

The worker functions are module-level: the spawned processes import them by name.
"""

import copy
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from creditflow.algorithms import group_zscore
from creditflow.errors import DataParallelError
from creditflow.training.launch import _first_failure, accelerator_arguments, run_data_parallel
from tests.training.helpers import make_trainer

# B = 4 prompts x G = 2 = 8 rows per global batch; 4 rows per process with 2 processes.
SETTINGS = {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 8, "learning_rate": 1e-2}
SPAWN_TIMEOUT_S = 120


def train_on_fixed_batches(accelerator, model, tokenizer, prompts, batches, advantages):
    """Two GRPO optimizer steps of ``GRPOTrainer`` on fixed global batches; each process
    takes its contiguous share of the rows. Returns the global loss of each step, this
    process's rank and world size, and the final weights."""
    trainer = make_trainer(model, tokenizer, prompts, accelerator=accelerator, **SETTINGS)
    world, rank = trainer.num_processes, trainer.process_index
    losses, grad_norms = [], []
    for batch, batch_advantages in zip(batches, advantages, strict=True):
        share = batch.batch_size // world
        rows = torch.arange(rank * share, (rank + 1) * share)
        metrics = trainer.optimizer_step(
            batch.select(rows), batch_advantages[rows], batch.completion_mask[rows], None
        )
        losses.append(metrics["actor/loss"])
        grad_norms.append(metrics["actor/grad_norm"])
    loss = torch.tensor(losses, dtype=torch.float64)
    if accelerator is not None:
        # seq-mean-token-mean over equal numbers of sequences per process: the global loss
        # is the mean of the processes' losses.
        loss = accelerator.reduce(loss, reduction="mean")
    return {
        "loss": loss.tolist(),
        "grad_norm": grad_norms,
        "rank": rank,
        "world": world,
        "params": {k: p.detach().clone() for k, p in model.named_parameters()},
    }


def fail_on_rank_one(accelerator):
    if accelerator.process_index == 1:
        raise RuntimeError("rank one gives up")
    accelerator.wait_for_everyone()  # rank 0 would wait here forever without the clean-up
    return "unreachable"


def sum_of_ranks(accelerator):
    """This process's rank and world size and the all-reduced sum of the ranks."""
    total = accelerator.reduce(torch.tensor([float(accelerator.process_index)]), reduction="sum")
    return accelerator.process_index, accelerator.num_processes, total.item()


def _launched_process(rank: int, port: int, workdir: str) -> None:
    """What ``accelerate launch --num_processes 2`` starts: the environment, then the code."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
    )
    torch.set_num_threads(1)
    result = run_data_parallel(sum_of_ranks, 2, timeout_s=SPAWN_TIMEOUT_S)
    torch.save(result, Path(workdir) / f"launched{rank}.pt")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fixed_batches(make_model, tapo_tokenizer, tapo_prompts):
    """The initial model, prompts, and two sampled global batches with GRPO advantages of a
    length reward (z-scored per group, docs/methods/grpo.md) on every completion token."""
    model = make_model()
    prompts = tapo_prompts[:8]
    sampler = make_trainer(model, tapo_tokenizer, prompts, **SETTINGS)
    batches, advantages = [], []
    for seed, start in ((0, 0), (1, 4)):
        torch.manual_seed(seed)
        batch = sampler.policy.sample(prompts[start : start + 4], group_size=2)
        lengths = torch.tensor([float(len(t)) for t in batch.completion_texts])  # (B,)
        per_sequence = group_zscore(lengths, group_size=2)  # (B,)
        assert per_sequence.abs().sum() > 0, "every group tied: no gradient to compare"
        batches.append(batch)
        advantages.append(per_sequence[:, None] * batch.completion_mask)  # (B, T)
    return model, tapo_tokenizer, prompts, batches, advantages


@pytest.mark.slow
def test_two_processes_match_one_on_the_same_global_batches(fixed_batches):
    model, tokenizer, prompts, batches, advantages = fixed_batches
    initial = {k: p.detach().clone() for k, p in model.named_parameters()}
    args = (model, tokenizer, prompts, batches, advantages)

    two = run_data_parallel(train_on_fixed_batches, 2, args=args, timeout_s=SPAWN_TIMEOUT_S)
    # The workers trained copies: the caller's model is untouched.
    assert all(torch.equal(p, initial[k]) for k, p in model.named_parameters())

    single_model = copy.deepcopy(model)
    one = run_data_parallel(train_on_fixed_batches, 1, args=(single_model, *args[1:]))
    # In process, fn trains the caller's object itself.
    assert all(torch.equal(p, one["params"][k]) for k, p in single_model.named_parameters())

    assert (one["rank"], one["world"]) == (0, 1)
    assert (two["rank"], two["world"]) == (0, 2), "rank 0's return value, of a 2-process group"
    # Same loss at both steps: the first at the shared starting weights, the last after one
    # data-parallel update (DDP averaged the per-process gradients into the global one).
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert one["loss"][0] != one["loss"][1], "the first step changed the model"
    for name, value in one["params"].items():
        assert not torch.equal(value, initial[name]), name
        # Adam's early steps are ~lr * sign(grad): float noise on a gradient element near
        # zero moves a weight by far more than the noise, hence 1% of lr.
        torch.testing.assert_close(two["params"][name], value, atol=1e-4, rtol=0, msg=name)


@pytest.mark.slow
def test_a_failing_worker_stops_the_group_and_raises_its_error():
    # Rank 0 then fails too (its peer closed the connection); the cause is reported.
    with pytest.raises(
        DataParallelError, match=r"(?s)rank 1 of 2 failed first:.*rank one gives up"
    ):
        run_data_parallel(fail_on_rank_one, 2, timeout_s=SPAWN_TIMEOUT_S)


@pytest.mark.slow
def test_under_a_launcher_it_joins_the_group_instead_of_spawning(tmp_path):
    context = mp.spawn(_launched_process, args=(_free_port(), str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the launched processes did not finish in {SPAWN_TIMEOUT_S} s")
    # Each launched process is its own rank of one 2-process group (a nested spawn would
    # have made each of them rank 0 of a group of its own): 0 + 1 = 1.
    results = [torch.load(tmp_path / f"launched{r}.pt") for r in range(2)]
    assert results == [(0, 2, 1.0), (1, 2, 1.0)]


def test_one_process_without_settings_runs_in_place_without_an_accelerator():
    calls = []

    def record(accelerator, *args):
        calls.append((accelerator, args))
        return "done"

    # In process, so even a local function works.
    assert run_data_parallel(record, 1, args=(1, "two")) == "done"
    assert calls == [(None, (1, "two"))]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_num_processes_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="num_processes must be an integer >= 1"):
        run_data_parallel(sum_of_ranks, bad)


def test_unknown_accelerate_keys_are_rejected_with_the_valid_ones():
    with pytest.raises(
        ValueError, match=r"unknown accelerate_config key\(s\) \['mixed_precison'\]"
    ):
        run_data_parallel(sum_of_ranks, 2, accelerate_config={"mixed_precison": "bf16"})
    valid = accelerator_arguments()
    # The YAML-able plugin key replaces the plugin object argument.
    assert {"mixed_precision", "cpu", "fsdp"} <= set(valid) and "fsdp_plugin" not in valid


def test_a_local_function_cannot_reach_the_workers():
    def local(accelerator):
        return accelerator

    with pytest.raises(ValueError, match="module-level function"):
        run_data_parallel(local, 2)


def test_num_processes_must_match_the_launchers_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"WORLD_SIZE=4 processes but num_processes=2"):
        run_data_parallel(sum_of_ranks, 2)


def test_the_first_recorded_failure_is_reported(tmp_path):
    # Rank 0 recorded later (it lost its connection to rank 1), rank 1 first: rank 1 is the cause.
    (tmp_path / "error-rank0").write_text("1700000002.5\nRuntimeError: connection closed\n")
    (tmp_path / "error-rank1").write_text("1700000001.25\nValueError: the cause\n")
    assert _first_failure(tmp_path, 2) == "rank 1 of 2 failed first:\nValueError: the cause\n"
    for path in tmp_path.iterdir():
        path.unlink()
    assert "died without a Python traceback" in _first_failure(tmp_path, 4)
