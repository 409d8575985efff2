"""A broken configuration fails before any model is built or sampled, naming the key to fix."""

import types

import pytest
import torch

from creditflow.errors import ConfigError
from creditflow.training import GRPOConfig, GRPOTrainer
from creditflow.training.grpo_runs import build_grpo_config

REWARDS = ["format", "translation", "reasoning"]
VALID = {
    "steps": 2,
    "prompts_per_step": 4,
    "group_size": 4,
    "rewards": {"reasoning": 1.0},
}


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"group_size": 1}, "group_size"),
        ({"minibatch_size": 5}, "minibatch_size"),  # B = 4 * 4 = 16
        ({"advantage": {"name": "tapo", "alpha": 1.5}}, "advantage.alpha"),
        ({"advantage": {"name": "ppo"}}, "advantage"),
        ({"token_weights": {"name": "tor_v2"}}, "token_weights"),
        ({"advantage": "grpo"}, "advantage"),
        ({"agg": "token-sum"}, "agg"),
        ({"kl": "k2"}, "kl"),
        ({"beta": -0.1}, "beta"),
        ({"clip_low": 1.0}, "clip_low"),
        ({"top_p": 0.0}, "top_p"),
        ({"steps": 0}, "steps"),
        ({"rewards": {}}, "rewards"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"lr": 1e-3}, "lr"),  # unknown key
        ({"advantage": {"name": "grpo", "scale_by_std": "no"}}, "scale_by_std"),
        ({"advantage": {"name": "tapo", "scale_by_std": 0}}, "scale_by_std"),
        ({"advantage": {"name": "grpo", "alpha": 0.5}}, "alpha"),  # grpo has no alpha
    ],
)
def test_bad_grpo_parameters_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        build_grpo_config({**VALID, **overrides}, REWARDS)


def test_messages_say_how_to_fix_it():
    with pytest.raises(ConfigError) as error:
        build_grpo_config({**VALID, "minibatch_size": 5}, REWARDS)
    assert "pick a divisor of 16" in str(error.value)
    with pytest.raises(ConfigError) as error:
        build_grpo_config({**VALID, "advantage": {"name": "ppo"}}, REWARDS)
    assert "['gdpo', 'grpo', 'hicra', 'shuffled_advantages', 'tapo']" in str(error.value)
    with pytest.raises(ConfigError) as error:
        build_grpo_config({**VALID, "lr": 1e-3}, REWARDS)
    assert "learning_rate" in str(error.value), "lists the valid keys"


def test_unknown_reward_name_fails_in_build_grpo_config():
    with pytest.raises(ConfigError, match=r"\['chrf'\].*reward_functions"):
        build_grpo_config({**VALID, "rewards": {"chrf": 1.0}}, REWARDS)


def test_rewards_read_by_the_advantage_must_be_computed():
    params = {
        **VALID,
        "advantage": {"name": "tapo", "translation_reward": "comet"},
        "rewards": {"reasoning": 1.0},
    }
    with pytest.raises(ConfigError, match=r"\['comet'\].*translation_reward|reward_functions"):
        build_grpo_config(params, REWARDS)
    # The defaults (translation, reasoning) must be computed too.
    with pytest.raises(ConfigError, match="translation"):
        build_grpo_config({**VALID, "advantage": {"name": "tapo"}}, ["reasoning"])
    assert build_grpo_config({**VALID, "advantage": {"name": "tapo"}}, REWARDS).advantage == {
        "name": "tapo"
    }


class _NeverSamples:
    """A policy that fails the test if the trainer ever gets as far as sampling."""

    module = torch.nn.Linear(2, 2)

    def sample(self, *args, **kwargs):
        raise AssertionError("sampled before the config was checked")

    completion_logprobs = sample


@pytest.mark.parametrize(
    ("overrides", "key"),
    [({"group_size": 1}, "group_size"), ({"minibatch_size": 3}, "minibatch_size")],
)
def test_an_invalid_config_cannot_be_built_so_no_trainer_gets_one(overrides, key):
    """Building a GRPOConfig checks it whole: built directly too, not only from parameters."""
    with pytest.raises(ConfigError, match=key):
        GRPOTrainer(_NeverSamples(), ["p"], lambda c, i: {}, GRPOConfig(**{**VALID, **overrides}))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [({"prompts_per_step": 3}, "prompts_per_step"), ({"minibatch_size": 3}, "minibatch_size")],
)
def test_global_batch_must_split_evenly_across_processes(overrides, key):
    """prompts_per_step and minibatch_size are global counts, split across processes."""
    config = GRPOConfig(**{**VALID, "group_size": 3, **overrides})  # B = 9 or 12
    config.validate()  # fine for one process
    two_processes = types.SimpleNamespace(num_processes=2, process_index=0, is_main_process=True)
    with pytest.raises(ConfigError, match=f"{key}.*number of processes \\(2\\)"):
        GRPOTrainer(
            _NeverSamples(),
            ["p"],
            lambda c, i: {},
            config,
            progress=False,
            accelerator=two_processes,
        )


def test_a_comparison_config_is_checked_once_from_the_hook_to_the_trainer(monkeypatch):
    # The parameter hook checks each strategy's config before the first node; the node parses
    # the same parameters again (Kedro hands it a dict) and api.train_grpo checks what it gets:
    # neither repeats the check of a config of the same content and rewards.
    from creditflow.training import grpo_runs  # noqa: PLC0415

    monkeypatch.setattr(grpo_runs, "_CHECKED", type(grpo_runs._CHECKED)())
    checks = []
    real = grpo_runs.validate_strategies
    monkeypatch.setattr(grpo_runs, "validate_strategies", lambda c: checks.append(c) or real(c))
    params = {
        "sft": {"steps": 0},
        "reward_functions": REWARDS,
        "grpo": {**VALID, "steps": 3},
        "strategies": {"a": {"advantage": {"name": "grpo"}}, "b": {"advantage": {"name": "gdpo"}}},
    }
    grpo_runs.check_comparison_params("g", params)  # the hook
    assert len(checks) == 2
    for name in ("a", "b"):
        config, _ = grpo_runs.strategy_config(params, {**params["strategies"][name], "seed": 0})
        grpo_runs.check_grpo_config(config, REWARDS)  # api.train_grpo
    assert len(checks) == 2
    # Other content is checked: another seed, or a config changed after its check.
    config, _ = grpo_runs.strategy_config(params, {"advantage": {"name": "grpo"}, "seed": 1})
    assert len(checks) == 3
    config.advantage = {"name": "tapo", "alpha": 2.0}
    with pytest.raises(ConfigError, match="alpha"):
        grpo_runs.check_grpo_config(config, REWARDS)
