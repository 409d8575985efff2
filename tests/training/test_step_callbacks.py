"""The GRPO loop's step callback: called after every step with the step's history row (what
makes curves live in MLflow), replayed for a resumed run, and by default the MLflow step
logger of the Kedro node the trainer is built in (creditflow.tracking.logging_steps), also in
the processes ``run_data_parallel`` spawns, where only the main one logs.

The data-parallel worker function is module-level: the spawned processes import it by name.
"""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from creditflow import tracking
from creditflow.training import GRPOConfig, GRPOTrainer
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.grpo_runs import grpo_policy
from creditflow.training.launch import run_data_parallel
from tests.training.helpers import length_reward, make_trainer

SMALL = {
    "steps": 2,
    "prompts_per_step": 2,
    "group_size": 2,
    "max_new_tokens": 4,
    "rewards": {"length": 1.0},
    "learning_rate": 1e-2,
    "warmup_steps": 0,
    "checkpoint_every": 1,
    "log_samples_every": 0,
}


def test_grpo_calls_back_after_every_step_with_its_row(
    make_model, tapo_tokenizer, tapo_prompts, tmp_path: Path
) -> None:
    calls: list[tuple[int, dict, int]] = []
    config = GRPOConfig.from_params(SMALL)
    trainer = GRPOTrainer(
        grpo_policy(make_model(), tapo_tokenizer, config),
        tapo_prompts,
        length_reward,
        config,
        checkpoints=CheckpointStore(tmp_path / "checkpoints"),
        progress=False,
        step_callback=lambda step, row: calls.append((step, row, len(trainer.result.history))),
    )
    result = trainer.train()
    # After each step, not at the end: the history held exactly that step's row by then.
    assert [(step, seen) for step, _, seen in calls] == [(1, 1), (2, 2)]
    assert [row for _, row, _ in calls] == result.history

    # A later run resuming the finished checkpoint trains nothing but reports both rows again.
    replayed: list[int] = []
    resumed = GRPOTrainer(
        grpo_policy(make_model(), tapo_tokenizer, config),
        tapo_prompts,
        length_reward,
        config,
        checkpoints=CheckpointStore(tmp_path / "checkpoints"),
        progress=False,
        step_callback=lambda step, row: replayed.append(step),
    )
    assert resumed.train().history == result.history
    assert replayed == [1, 2]


def test_grpo_logs_live_to_the_nodes_mlflow_run_by_default(
    make_model, tapo_tokenizer, tapo_prompts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the SQLite store's default artifact root
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("grpo")).info.run_id
    step_logger = tracking.StepLogger(uri, run_id, "tapo_grpo_sum", flush_every_s=0)
    with tracking.logging_steps(step_logger):  # as the Kedro hook does around a node
        trainer = make_trainer(make_model(), tapo_tokenizer, tapo_prompts, steps=2)
        assert trainer.step_callback is step_logger
        result = trainer.train()
        # Written as each step ended, not when the block closed.
        assert len(client.get_metric_history(run_id, "tapo_grpo_sum/reward/total")) == 2
    history = client.get_metric_history(run_id, "tapo_grpo_sum/reward/total")
    expected = [(int(row["step"]), row["reward/total"]) for row in result.history]
    assert sorted((m.step, m.value) for m in history) == expected
    # Outside a tracked node there is nothing to log to.
    assert make_trainer(make_model(), tapo_tokenizer, tapo_prompts).step_callback is None


def train_two_steps(accelerator, model, tokenizer, prompts) -> list[dict[str, float]]:
    """Two GRPO steps of 4 prompts x 2 in this process's share; its history."""
    trainer = make_trainer(
        model, tokenizer, prompts, accelerator=accelerator, prompts_per_step=4, group_size=2
    )
    return trainer.train().history


@pytest.mark.slow  # two spawned processes (~20 s on 2 CPU cores)
def test_data_parallel_workers_log_once_from_the_main_process(
    make_model, tapo_tokenizer, tapo_prompts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("dp")).info.run_id
    args = (make_model(), tapo_tokenizer, tapo_prompts)
    # At the default FLUSH_EVERY_S: the workers write what is left when they exit.
    with tracking.logging_steps(tracking.StepLogger(uri, run_id, "tapo_grpo_sum")):
        history = run_data_parallel(train_two_steps, 2, args=args, timeout_s=300)
    logged = client.get_metric_history(run_id, "tapo_grpo_sum/reward/total")
    # Rank 0's two steps, once each (rank 1 logs nothing); rewards are gathered over both.
    expected = [(int(row["step"]), row["reward/total"]) for row in history]
    assert sorted((m.step, m.value) for m in logged) == expected
