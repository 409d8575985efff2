"""Strategies and rewards named by import path or entry point (``config.plugins``,
``training.strategies.plugins``, ``rewards.plugins``): found, wrapped, called as documented,
and refused with the key and the fix when they cannot work."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch

from creditflow import api
from creditflow.errors import ConfigError
from creditflow.rewards.plugins import check_reward_name, plugin_reward
from creditflow.testing import ToyPolicy, toy_batch
from creditflow.training import GRPOConfig
from creditflow.training.grpo_runs import _plugin_sources, build_grpo_config
from creditflow.training.rewards import BoundRewards
from creditflow.training.strategies import (
    TokenWeightStrategy,
    WeightContext,
    advantage_strategy,
    token_weight_strategy,
    validate_strategies,
)

MODULE = """
import torch
from creditflow.training.strategies import TokenWeightStrategy
from creditflow.training.strategies.base import no_options


def half(spec, batch, policy, context):
    return batch.completion_mask * spec.get("weight", 0.5)


def signed_length(spec, rewards, batch, policy, config):
    return rewards["reasoning"][:, None] * batch.completion_mask, {"mine/x": 1.0}


def two_arguments(spec, batch):
    return batch.completion_mask


def brevity(completions, **kwargs):
    return [-len(c) / 100 for c in completions]


def needs_ids(completions, completion_ids, **kwargs):
    return [0.0] * len(completions)


def by_answer(completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer)]


def positional_only(completions, /):
    return [0.0] * len(completions)


def first_message(completions, prompts):
    return [float(len(c[0]["content"])) for c in completions]


def half_pair(spec, batch, policy, context):
    return half(spec, batch, policy, context), {}


HALF = TokenWeightStrategy(half_pair, no_options)
NOT_A_FUNCTION = 3
"""


@pytest.fixture
def mine(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """A module ``mine_pkg.mine`` outside the repository, on sys.path, and an installed
    distribution ``mine-pkg`` declaring entry points in both groups."""
    (tmp_path / "mine_pkg").mkdir()
    (tmp_path / "mine_pkg/__init__.py").write_text("")
    (tmp_path / "mine_pkg/mine.py").write_text(MODULE)
    (tmp_path / "mine_pkg/broken.py").write_text("x = 1 / 0\n")
    dist = tmp_path / "mine_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mine-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [creditflow.strategies]
            half_weights = mine_pkg.mine:HALF
            broken = mine_pkg.broken:anything
            [creditflow.rewards]
            short = mine_pkg.mine:brevity
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for module in [m for m in sys.modules if m.split(".")[0] == "mine_pkg"]:
        del sys.modules[module]


def _weights(spec: dict) -> torch.Tensor:
    config = GRPOConfig(token_weights=spec)
    validate_strategies(config)
    batch = toy_batch()
    context = WeightContext(torch.Generator().manual_seed(0))
    weights, _ = token_weight_strategy(config).compute(spec, batch, ToyPolicy(), context)
    return weights


def test_a_plain_function_by_path_is_wrapped_and_reads_its_options(mine):
    spec = {"name": "mine_pkg.mine:half", "weight": 0.25}
    torch.testing.assert_close(_weights(spec), toy_batch().completion_mask * 0.25)
    config = GRPOConfig(advantage={"name": "mine_pkg.mine:signed_length"})
    validate_strategies(config)
    strategy = advantage_strategy(config)
    batch = toy_batch()
    rewards = {"reasoning": torch.ones(batch.batch_size)}
    _, metrics = strategy.compute(config.advantage, rewards, batch, None, config)
    assert metrics == {"mine/x": 1.0}


def test_the_dataclass_and_entry_points_are_taken_as_they_are(mine):
    config = GRPOConfig(token_weights={"name": "half_weights"})  # an entry point
    assert token_weight_strategy(config).compute.__name__ == "half_pair"
    assert isinstance(token_weight_strategy(config), TokenWeightStrategy)
    torch.testing.assert_close(
        _weights({"name": "mine_pkg.mine:HALF"}), _weights(config.token_weights)
    )
    assert check_reward_name("short") == "short"
    out = BoundRewards(["short", "mine_pkg.mine:brevity"], ["Q"], ["1"])(
        ["abcd", "ab"], torch.tensor([0, 0])
    )
    assert torch.equal(out["short"], out["mine_pkg.mine:brevity"])
    torch.testing.assert_close(out["short"], torch.tensor([-0.04, -0.02]))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"name": "mine_pkg.nope:half"},
            r"token_weights\.name: 'mine_pkg\.nope:half': no module named 'mine_pkg\.nope' on the import path; put the folder",
        ),
        (
            {"name": "mine_pkg.mine:halve"},
            r"'mine_pkg\.mine' has no attribute 'halve' \(it has \[.*'half'",
        ),
        (
            {"name": "mine_pkg.broken:x"},
            r"module 'mine_pkg\.broken' does not import \(ZeroDivisionError: division by zero, .*broken\.py, line 1\)",
        ),
        (
            {"name": "broken"},
            r"'broken' is the entry point 'mine_pkg\.broken:anything' of group 'creditflow\.strategies', which does not load",
        ),
        (
            {"name": "mine_pkg.mine:two_arguments"},
            r"two_arguments'\(spec, batch\) does not fit .* def two_arguments\(spec, batch, policy, context\)",
        ),
        ({"name": "mine_pkg.mine:NOT_A_FUNCTION"}, r"is a value of type int"),
        ({"name": "mine_pkg.mine:"}, r"is no import path"),
        (
            {"name": "nothing"},
            r"unknown token_weights strategy 'nothing'; valid: \[.*'uniform', 'vppo'\] \(built in\), \['broken', 'half_weights'\] \(installed entry points\), or an import path",
        ),
    ],
)
def test_a_token_weight_strategy_that_cannot_work_fails_naming_the_key(mine, spec, expected):
    with pytest.raises(ConfigError, match=expected):
        validate_strategies(GRPOConfig(token_weights=spec))


def test_a_strategy_of_the_other_kind_is_refused(mine):
    with pytest.raises(
        ConfigError,
        match=r"advantage\.name: 'half_weights' is a TokenWeightStrategy, not an? AdvantageStrategy: name it under token_weights",
    ):
        validate_strategies(GRPOConfig(advantage={"name": "half_weights"}))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "mine_pkg.mine:needs_ids",
            r"requires \['completion_ids'\], which creditflow passes as None",
        ),
        ("mine_pkg.mine:positional_only", r"positional-only"),
        ("mine_pkg.mine:HALF", r"takes no 'completions'|not a function|does not fit"),
        (
            "bleu",
            r"unknown reward 'bleu'; valid: \['exact_match', 'final_number', 'format', 'number_format', 'reasoning', 'translation'\] \(built in\), \['short'\] \(installed entry points\)",
        ),
    ],
)
def test_a_reward_that_cannot_work_fails_before_training(mine, name, expected):
    with pytest.raises(ConfigError, match=expected):
        check_reward_name(name)


def test_a_reward_is_called_as_trl_calls_one(mine):
    by_answer = BoundRewards(
        ["mine_pkg.mine:by_answer"],
        ["Q0", "Q1"],
        ["7", "3"],
        columns={"prompts": ["p0", "p1"], "answer": ["7", "3"]},
    )
    assert by_answer(["7", "7", "3"], torch.tensor([0, 1, 1]))[
        "mine_pkg.mine:by_answer"
    ].tolist() == [1.0, 0.0, 1.0]
    # Chat-message prompts: the completions arrive as assistant messages, as TRL gives them.
    chat = [[{"role": "user", "content": "hi"}]]
    reward = plugin_reward("mine_pkg.mine:first_message")
    assert reward(["abc"], chat)[0] == [3.0]


def test_the_columns_a_reward_requires_are_checked_before_training(mine):
    data = pd.DataFrame({"prompt": ["a", "b"], "question_en": ["A", "B"]})
    with pytest.raises(
        ConfigError,
        match=r"no 'answer' column, which the 'mine_pkg\.mine:by_answer' reward reads",
    ):
        api.as_dataset(data, ["mine_pkg.mine:by_answer"])
    assert len(api.as_dataset(data.assign(answer=["1", "2"]), ["mine_pkg.mine:by_answer"])) == 2


def test_a_path_reward_is_weighted_under_its_path_and_takes_no_options(mine):
    path = "mine_pkg.mine:brevity"
    config = build_grpo_config({"rewards": {path: 0.1, "reasoning": 1.0}}, ["reasoning", path])
    assert config.rewards == {path: 0.1, "reasoning": 1.0}
    with pytest.raises(ConfigError, match=r"weighted but not computed"):
        build_grpo_config({"rewards": {path: 0.1}}, ["reasoning"])
    with pytest.raises(
        ConfigError, match=rf"reward_options\.{path}: a reward of your own takes no options"
    ):
        build_grpo_config({"reward_options": {path: {"x": 1}}}, ["reasoning", path])


def test_an_edited_strategy_or_reward_does_not_resume_the_old_run(mine):
    config = GRPOConfig(token_weights={"name": "mine_pkg.mine:half"})
    first = _plugin_sources(config, ["reasoning", "short"])["plugins"]
    assert set(first) == {"mine_pkg.mine:half", "short"}  # a path and an entry point
    (mine / "mine_pkg/mine.py").write_text(MODULE + "\n# edited\n")
    again = _plugin_sources(config, ["reasoning", "short"])["plugins"]
    assert again["mine_pkg.mine:half"] != first["mine_pkg.mine:half"]
    assert _plugin_sources(GRPOConfig(), ["reasoning"]) == {}  # built-ins keep their key
