"""FSDP2 sharding through accelerate: two CPU processes (gloo) against one.

``run_data_parallel`` starts two real workers with ``accelerate_config={"fsdp": ...}``; each
holds half of every parameter (a ``DTensor`` shard) and ``GRPOTrainer`` takes one optimizer
step on its half of a fixed global batch, as in the DDP test (test_distributed.py). The
workers return the full (all-gathered) parameters and gradients for the comparison.
"""

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from creditflow.training import CheckpointStore
from creditflow.training.config import ConfigError
from creditflow.training.grpo_runs import run_grpo
from creditflow.training.launch import run_data_parallel
from tests.training.helpers import (
    TWO_PROCESS_UPDATE,
    fixed_global_update,
    length_reward,
    make_trainer,
)

WORLD_SIZE = 2
TIMEOUT_S = 180
FSDP = {"fsdp": {"fsdp_version": 2}}
# B = 8 rows for the fixed update, 4 per process.
UPDATE = TWO_PROCESS_UPDATE


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (a collective: every process calls it in the same order)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def _refusals(accelerator, model, tokenizer, prompts, workdir) -> list[str]:
    """The ConfigError of each setting FSDP does not support yet."""
    errors = []
    for settings, checkpoints in (
        ({"rollout": {"name": "lean"}}, None),
        ({"rollout": {"name": "hf"}}, CheckpointStore(workdir)),
    ):
        try:
            make_trainer(
                model, tokenizer, prompts, length_reward, checkpoints, accelerator, **settings
            )
        except ConfigError as error:
            errors.append(str(error))
    return errors


def _sharded_run(accelerator, model, tokenizer, prompts, workdir) -> dict:
    """Two GRPO steps (generation with hf on the sharded model, scoring, update) under FSDP2."""
    errors = _refusals(accelerator, model, tokenizer, prompts, workdir)
    initial = {k: p.detach().clone() for k, p in model.named_parameters()}
    settings = {"rollout": {"name": "hf"}, "log_samples_every": 1, "samples_per_log": 2}
    trainer = make_trainer(model, tokenizer, prompts, accelerator=accelerator, **settings)
    result = trainer.train()
    return {
        "errors": errors,
        "initial": initial,
        "params": {k: _full(p) for k, p in model.named_parameters()},
        "history": result.history,
        "samples": result.samples,
    }


def _sharded_update(accelerator, inputs: dict, settings: dict) -> dict:
    """One optimizer step of this process's half of the fixed global batch, under FSDP2."""
    model = inputs["model"].train()  # this process's own copy (run_data_parallel loads one)
    trainer = make_trainer(
        model, inputs["tokenizer"], inputs["prompts"], accelerator=accelerator, **settings
    )
    rank = accelerator.process_index
    half = torch.arange(rank * 4, rank * 4 + 4)
    batch = inputs["batch"]
    metrics = trainer.optimizer_step(
        batch.select(half), inputs["advantages"][half], batch.completion_mask[half], None
    )
    for module in model.modules():  # the shards back in place of the unsharded parameters
        if isinstance(module, FSDPModule):
            module.reshard()
    loss = accelerator.reduce(torch.tensor(metrics["actor/loss"]), reduction="mean").item()
    return {
        "sharded": all(isinstance(p, DTensor) for p in model.parameters()),
        "loss": loss,
        "grad_norm": metrics["actor/grad_norm"],
        "grads": {k: _full(p.grad) for k, p in model.named_parameters()},
        "params": {k: _full(p) for k, p in model.named_parameters()},
    }


@pytest.fixture
def fixed_update(make_model, tapo_tokenizer, tapo_prompts):
    """The model, the fixed global batch and advantages, and the 1-process step on them."""
    return fixed_global_update(make_model(), tapo_tokenizer, tapo_prompts[:10])


def _assert_matches_one_process(sharded: dict, single_model, single_metrics) -> None:
    assert sharded["sharded"], "the parameters are FSDP shards, not DDP replicas"
    assert sharded["loss"] == pytest.approx(single_metrics["actor/loss"], abs=1e-6)
    assert sharded["grad_norm"] == pytest.approx(single_metrics["actor/grad_norm"], rel=1e-5)
    assert single_metrics["actor/grad_norm"] > UPDATE["max_grad_norm"], "clipping is exercised"
    for name, p in single_model.named_parameters():
        torch.testing.assert_close(sharded["grads"][name], p.grad, atol=1e-6, rtol=1e-5, msg=name)
        # Adam's first step is ~lr * sign(grad): the same looser tolerance as the DDP test.
        torch.testing.assert_close(sharded["params"][name], p.detach(), atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("shared_prefix", [True, False], ids=["shared_prefix", "plain_forward"])
def test_fsdp_update_on_two_processes_matches_one(fixed_update, shared_prefix):
    """Loss, gradient norm, gradients and updated weights of one sharded step equal the
    1-process step on the same global batch, with either scoring forward."""
    inputs, single_model, single_metrics = fixed_update
    settings = {**UPDATE, "shared_prefix": shared_prefix, "rollout": {"name": "hf"}}
    sharded = run_data_parallel(
        _sharded_update,
        WORLD_SIZE,
        args=(inputs, settings),
        accelerate_config=FSDP,
        timeout_s=TIMEOUT_S,
    )
    _assert_matches_one_process(sharded, single_model, single_metrics)


@pytest.mark.slow
def test_fsdp_trains_two_grpo_steps_and_refuses_what_it_cannot_do(
    make_model, tapo_tokenizer, tapo_prompts, tmp_path
):
    """hf generation runs on the sharded model (its forward gathers the parameters); lean
    rollouts and checkpoints raise a ConfigError before anything is sharded."""
    run = run_data_parallel(
        _sharded_run,
        WORLD_SIZE,
        args=(make_model(), tapo_tokenizer, tapo_prompts[:10], str(tmp_path)),
        accelerate_config=FSDP,
        timeout_s=TIMEOUT_S,
    )
    lean, checkpoints = run["errors"]
    assert "set rollout: {name: hf}" in lean
    assert "checkpoints are not written under FSDP" in checkpoints
    assert [row["step"] for row in run["history"]] == [1.0, 2.0]
    assert all(row["actor/grad_norm"] > 0 for row in run["history"])
    assert len(run["samples"]) == 4
    assert all(not torch.equal(run["params"][k], run["initial"][k]) for k in run["initial"])


def test_run_grpo_refuses_fsdp_before_starting_processes():
    """The node's entry point returns rank 0's model, which FSDP would hand back as shards."""
    distributed = {"num_processes": 2, "accelerate": FSDP}
    with pytest.raises(ConfigError, match="FSDP holds as shards"):
        run_grpo(None, None, [], [], [], None, [], None, distributed=distributed)
