"""An absurd group size fails before training, naming the key, instead of as an allocator
error in the middle of sampling."""

import pytest
import torch

from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError
from creditflow.training.memory import (
    check_rollout_fits,
    device_memory_bytes,
    rollout_floor_bytes,
)
from tests.training.helpers import make_trainer


def test_the_floor_counts_tokens_and_one_steps_logits():
    config = GRPOConfig(prompts_per_step=2, group_size=4, max_new_tokens=10)
    # 8 sequences x (16 bytes x 10 tokens + 4 bytes x 100 logits) = 8 x 560
    assert rollout_floor_bytes(config, vocab=100) == 4480
    check_rollout_fits(config, 100, memory=4480)
    with pytest.raises(ConfigError, match=r"group_size \(4\) x prompts_per_step \(2\) = 8"):
        check_rollout_fits(config, 100, memory=4479)
    check_rollout_fits(config, None, memory=1)  # nothing known: nothing checked


def test_a_billion_completions_a_prompt_fail_before_the_first_step(
    make_model, tapo_tokenizer, tapo_prompts
):
    assert device_memory_bytes(torch.device("cpu")) > 2**30
    with pytest.raises(ConfigError, match=r"lower group_size or prompts_per_step"):
        make_trainer(make_model(), tapo_tokenizer, tapo_prompts, group_size=1_000_000_000)


def test_the_parameter_check_refuses_it_before_the_warm_start_trains(project_root):
    from kedro.config import OmegaConfigLoader  # noqa: PLC0415

    from creditflow.training.grpo_runs import check_comparison_params  # noqa: PLC0415

    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="base")
    params = dict(loader["parameters"]["tapo"])
    params["grpo"] = {**params["grpo"], "group_size": 1_000_000_000}
    with pytest.raises(ConfigError, match=r"tapo.strategies.grpo_sum .*group_size \(1000000000\)"):
        check_comparison_params("tapo", params)
