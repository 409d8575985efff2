"""A loss, gradient or weight that goes NaN or infinite stops training with an error naming the
step, the run and the newest checkpoint, which stays the newest: no non-finite policy is saved.
The parameters that would cause it (an infinite beta or learning rate) are refused up front."""

import math

import pytest
import torch

from creditflow.config.grpo import GRPOConfig
from creditflow.config.supervised import SupervisedConfig
from creditflow.errors import ConfigError, NonFiniteTrainingError
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.finite import (
    NonFiniteValue,
    check_finite_weights,
    first_non_finite_parameter,
)
from creditflow.training.strategies import validate_strategies
from creditflow.training.supervised import SupervisedTrainer
from tests.training.helpers import length_reward, make_trainer


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_non_finite_float_parameter_is_refused(value):
    with pytest.raises(ConfigError, match="`beta` must be a finite number"):
        GRPOConfig.from_params({"beta": value})
    with pytest.raises(ConfigError, match="`learning_rate` must be a finite number"):
        SupervisedConfig(steps=1, batch_size=1, learning_rate=value)


@pytest.mark.parametrize("value", [math.inf, math.nan, True])
def test_a_strategy_option_must_be_a_finite_number(value):
    config = GRPOConfig(advantage={"name": "tapo", "alpha": value})
    with pytest.raises(ConfigError, match=r"advantage\.alpha must be in \[0, 1\]"):
        validate_strategies(config)


def test_the_first_non_finite_weight_is_named():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    assert first_non_finite_parameter(module.state_dict().items()) is None
    with torch.no_grad():
        module[1].bias.fill_(math.nan)
    assert first_non_finite_parameter(module.state_dict().items()) == "1.bias"


class _OneOfTwoProcesses:
    """What ``check_finite_weights`` asks of an accelerator, for this process of two whose
    peer holds ``peer_found`` (1: a non-finite weight in its shard); the reduction is the
    collective's sum over both."""

    num_processes, device = 2, torch.device("cpu")

    def __init__(self, peer_found: float):
        self.peer_found = peer_found
        self.reduced = 0

    def reduce(self, tensor, reduction):
        assert reduction == "sum"
        self.reduced += 1
        return tensor + self.peer_found


def test_every_process_stops_when_one_shard_holds_a_nan():
    # Under FSDP each process checks its own shards; one stopping alone would leave the others
    # waiting in the next collective, so all of them take part in the check and all raise.
    module = torch.nn.Linear(2, 2)
    clean = _OneOfTwoProcesses(peer_found=0.0)
    check_finite_weights(module, clean)
    assert clean.reduced == 1
    with pytest.raises(NonFiniteValue, match="a shard held by another process"):
        check_finite_weights(module, _OneOfTwoProcesses(peer_found=1.0))
    with torch.no_grad():
        module.bias.fill_(math.nan)
    with pytest.raises(NonFiniteValue, match="weight `bias`"):
        check_finite_weights(module, _OneOfTwoProcesses(peer_found=0.0))


def test_grpo_stops_at_the_first_nan_reward_and_keeps_the_last_finite_checkpoint(
    make_model, tapo_tokenizer, tapo_prompts, tmp_path
):
    calls = []

    def poisoned_from_step_2(completions, prompt_index):
        calls.append(1)
        rewards = length_reward(completions, prompt_index)
        if len(calls) >= 2:  # one reward call per step here: step 2 on is NaN
            rewards["length"][0] = math.nan
        return rewards

    store = CheckpointStore(tmp_path / "ckpt")
    model = make_model()
    trainer = make_trainer(
        model,
        tapo_tokenizer,
        tapo_prompts,
        reward_fn=poisoned_from_step_2,
        checkpoints=store,
        steps=3,
        checkpoint_every=1,
    )
    with pytest.raises(NonFiniteTrainingError) as error:
        trainer.train()
    message = str(error.value)
    assert "step 2" in message and "[grpo/uniform]" in message
    assert "actor/loss is nan" in message
    assert str(store.latest()) in message
    assert store.latest().name == "step-000001" and len(store.completed()) == 1
    assert first_non_finite_parameter(model.state_dict().items()) is None, "never stepped"


def test_an_infinite_update_is_caught_before_the_policy_is_handed_on(
    make_model, tapo_tokenizer, tapo_prompts
):
    # Finite loss and gradient, then a learning rate that sends the weights to infinity:
    # caught by the weight check after the last step, before train() returns the policy.
    trainer = make_trainer(make_model(), tapo_tokenizer, tapo_prompts, steps=1)
    for group in trainer.optimizer.param_groups:
        group["lr"] = 1e308
    trainer.scheduler.base_lrs = [1e308] * len(trainer.scheduler.base_lrs)
    with pytest.raises(NonFiniteTrainingError, match=r"step 1: weight `.*` holds NaN or inf"):
        trainer.train()


def test_supervised_training_stops_at_a_nan_loss(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    steps = []

    def loss_fn(rows):
        steps.append(1)
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        return (loss * math.nan if len(steps) == 3 else loss), {"fit/mse": loss.item()}

    store = CheckpointStore(tmp_path / "ckpt")
    config = SupervisedConfig(steps=4, batch_size=4, learning_rate=1e-2, checkpoint_every=1)
    trainer = SupervisedTrainer(
        model, len(x), torch.tensor, loss_fn, config, store, progress=False, desc="fit"
    )
    with pytest.raises(
        NonFiniteTrainingError, match="fit: training stopped at step 3: loss is nan"
    ):
        trainer.train()
    assert store.latest().name == "step-000002"
    assert first_non_finite_parameter(model.state_dict().items()) is None


def test_weights_blown_up_mid_run_stop_before_the_next_rollout(
    make_model, tapo_tokenizer, tapo_prompts
):
    # No checkpoint steps: the weight check after every step still catches it at step 2,
    # before step 3 would sample from infinite weights.
    trainer = make_trainer(make_model(), tapo_tokenizer, tapo_prompts, steps=3, checkpoint_every=0)
    real_step = trainer.optimizer.step

    def blow_up_on_the_second_step(*args, **kwargs):
        real_step(*args, **kwargs)
        if trainer.scheduler.last_epoch == 1:  # the second step (the scheduler follows it)
            with torch.no_grad():
                next(trainer.policy.module.parameters()).fill_(math.inf)

    trainer.optimizer.step = blow_up_on_the_second_step
    with pytest.raises(NonFiniteTrainingError, match=r"step 2: weight `.*` holds NaN or inf"):
        trainer.train()


def test_an_fp16_scaler_may_see_an_inf_gradient_norm():
    from types import SimpleNamespace  # noqa: PLC0415

    from creditflow.training.finite import NonFiniteValue, check_update  # noqa: PLC0415

    check_update(0.5, math.inf, SimpleNamespace(scaler=object()))  # the scaler skips the step
    with pytest.raises(NonFiniteValue, match="actor/grad_norm is inf"):
        check_update(0.5, math.inf, None)
    with pytest.raises(NonFiniteValue, match="actor/loss is nan"):
        check_update(math.nan, 1.0, SimpleNamespace(scaler=object()))
