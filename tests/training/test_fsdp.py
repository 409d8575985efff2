"""FSDP2 sharding through accelerate: two CPU processes (gloo) against one.

``run_data_parallel`` starts two real workers with ``accelerate_config={"fsdp": ...}``; each
holds half of every parameter (a ``DTensor`` shard) and ``GRPOTrainer`` takes one optimizer
step on its half of a fixed global batch, as in the DDP test (test_distributed.py). The
workers return the full (all-gathered) parameters and gradients for the comparison.
"""

import copy
import shutil

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError
from creditflow.training import CheckpointStore
from creditflow.training.grpo_runs import check_distributed, run_grpo
from creditflow.training.launch import run_data_parallel
from tests.training.helpers import (
    TWO_PROCESS_UPDATE,
    fixed_global_update,
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


def _lean_refusal(accelerator, model, tokenizer, prompts) -> str:
    """The ConfigError of the lean rollout under FSDP (it reads whole parameters)."""
    try:
        make_trainer(model, tokenizer, prompts, accelerator=accelerator, rollout={"name": "lean"})
    except ConfigError as error:
        return str(error)
    return ""


def _sharded_run(accelerator, model, tokenizer, prompts) -> dict:
    """Two GRPO steps (generation with hf on the sharded model, scoring, update) under FSDP2."""
    lean = _lean_refusal(accelerator, model, tokenizer, prompts)
    initial = {k: p.detach().clone() for k, p in model.named_parameters()}
    settings = {"rollout": {"name": "hf"}, "log_samples_every": 1, "samples_per_log": 2}
    trainer = make_trainer(model, tokenizer, prompts, accelerator=accelerator, **settings)
    result = trainer.train()
    return {
        "lean": lean,
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
def test_fsdp_trains_two_grpo_steps_and_refuses_lean_rollouts(
    make_model, tapo_tokenizer, tapo_prompts
):
    """hf generation runs on the sharded model (its forward gathers the parameters); the
    lean rollout raises a ConfigError before anything is sharded."""
    run = run_data_parallel(
        _sharded_run,
        WORLD_SIZE,
        args=(make_model(), tapo_tokenizer, tapo_prompts[:10]),
        accelerate_config=FSDP,
        timeout_s=TIMEOUT_S,
    )
    assert "set rollout: {name: hf}" in run["lean"]
    assert [row["step"] for row in run["history"]] == [1.0, 2.0]
    assert all(row["actor/grad_norm"] > 0 for row in run["history"])
    assert len(run["samples"]) == 4
    assert all(not torch.equal(run["params"][k], run["initial"][k]) for k in run["initial"])


def _fsdp_grpo(model, tokenizer, prompts, store: CheckpointStore):
    """run_grpo (the Kedro nodes' entry point) on 2 FSDP processes, 2 steps, a checkpoint
    after each."""
    config = GRPOConfig.from_params(
        {
            "steps": 2,
            "prompts_per_step": 2,
            "group_size": 4,
            "max_new_tokens": 16,
            "rewards": {"translation": 1.0},
            "learning_rate": 1e-2,
            "warmup_steps": 0,
            "checkpoint_every": 1,
            "rollout": {"name": "hf"},
        }
    )
    return run_grpo(
        model,
        tokenizer,
        prompts,
        prompts,  # references: the format model closes the tag in about half its samples
        ["5", "5", "3", "8"],
        config,
        ["translation"],
        store,
        distributed={"num_processes": WORLD_SIZE, "accelerate": FSDP},
    )


@pytest.mark.slow
def test_run_grpo_under_fsdp_returns_a_whole_model_and_resumes_from_its_checkpoints(
    make_format_model, make_model, tapo_tokenizer, format_prompts, tmp_path
):
    """The node's entry point gathers the shards into a plain model (tied head tied again);
    each checkpoint holds the whole weights and the optimizer state by parameter name; a run
    killed after step 1 resumes from it and ends where the uninterrupted run ended, bit for bit."""
    model = make_format_model()
    initial = copy.deepcopy(model.state_dict())
    prompts = format_prompts[:4]
    trained, result = _fsdp_grpo(model, tapo_tokenizer, prompts, CheckpointStore(tmp_path))

    assert type(trained) is type(model) and not isinstance(trained, FSDPModule)
    assert not any(isinstance(p, DTensor) for p in trained.parameters())
    assert trained.lm_head.weight is trained.model.embed_tokens.weight
    assert all(torch.equal(v, initial[k]) for k, v in model.state_dict().items())
    assert all(not torch.equal(v, initial[k]) for k, v in trained.state_dict().items())
    assert [row["step"] for row in result.history] == [1.0, 2.0]
    assert result.history[0]["reward/total_std"] > 0
    trained.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False)

    (run_dir,) = tmp_path.iterdir()
    store = CheckpointStore(run_dir)
    assert [p.name for p in store.completed()] == ["step-000001", "step-000002"]
    reloaded = make_model()
    state = store.load(store.latest(), reloaded)  # whole weights into a plain 1-process model
    for name, p in trained.named_parameters():
        assert torch.equal(p, reloaded.get_parameter(name)), name
    assert state["optimizer_layout"] == "full_by_name"
    assert set(state["optimizer"]["state"]) == {n for n, _ in trained.named_parameters()}

    shutil.rmtree(store.latest())  # as if killed while step 2 ran
    resumed, resumed_result = _fsdp_grpo(model, tapo_tokenizer, prompts, CheckpointStore(tmp_path))
    assert resumed_result.history[0] == result.history[0]  # from the checkpoint
    assert store.latest().name == "step-000002"
    for name, p in trained.named_parameters():
        assert torch.equal(resumed.get_parameter(name), p), name


def test_fsdp_with_the_lean_rollout_fails_before_any_process_starts():
    """check_distributed (run_grpo, and check_comparison_params before the first node)."""
    config = GRPOConfig.from_params({"steps": 1, "rewards": {"translation": 1.0}})
    distributed = {"num_processes": 2, "accelerate": FSDP}
    with pytest.raises(ConfigError, match=r"set grpo.rollout: \{name: hf\} with fsdp"):
        run_grpo(None, None, [], [], [], config, [], None, distributed=distributed)
    with pytest.raises(ConfigError, match="num_processes must be an integer >= 1"):
        check_distributed({"num_processes": 0}, config)
