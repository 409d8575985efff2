"""The reward registry: one signature for the training engine; docstring examples run."""

import doctest

import pytest

from creditflow import rewards
from creditflow.rewards import (
    REWARD_FUNCTIONS,
    format_reward,
    get_reward_function,
    reasoning_reward,
    translation_reward,
)
from creditflow.rewards import format as format_module
from creditflow.rewards import reasoning as reasoning_module
from creditflow.rewards import registry as registry_module
from creditflow.rewards import translation as translation_module

COMPLETIONS = [
    "<translation>How many eggs are left?</translation> 16 - 7 = \\boxed{9}",
    "<translation>How many eggs?</translation> \\boxed{8}",
    "How many eggs are left? \\boxed{9}",
]
REFERENCES = ["How many eggs are left?"] * 3
ANSWERS = ["9"] * 3


def test_registry_names():
    assert sorted(REWARD_FUNCTIONS) == ["format", "reasoning", "translation"]


def test_adapters_call_the_rewards_with_the_right_arguments():
    assert get_reward_function("format")(COMPLETIONS, REFERENCES, ANSWERS) == format_reward(
        COMPLETIONS
    )
    assert get_reward_function("translation")(COMPLETIONS, REFERENCES, ANSWERS) == (
        translation_reward(COMPLETIONS, REFERENCES)
    )
    assert get_reward_function("reasoning")(COMPLETIONS, REFERENCES, ANSWERS) == (
        reasoning_reward(COMPLETIONS, ANSWERS)
    )
    # Hand values: F = [1, 1, 0]; the first translation is exact; answers 9, 8, 9 vs gold 9.
    assert get_reward_function("format")(COMPLETIONS, REFERENCES, ANSWERS) == [1.0, 1.0, 0.0]
    assert get_reward_function("reasoning")(COMPLETIONS, REFERENCES, ANSWERS) == [1.0, 0.0, 1.0]
    translation = get_reward_function("translation")(COMPLETIONS, REFERENCES, ANSWERS)
    assert translation[0] == 1.0 and 0.0 < translation[1] < 1.0 and translation[2] == 0.0


def test_adapters_forward_keywords():
    with pytest.raises(ValueError, match="unknown translation metric"):
        get_reward_function("translation")(COMPLETIONS, REFERENCES, ANSWERS, metric="bleu")
    with pytest.raises(ValueError, match="timeout_s"):
        get_reward_function("reasoning")(COMPLETIONS, REFERENCES, ANSWERS, timeout_s=-1)


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(
        ValueError, match=r"unknown reward 'accuracy'.*'format'.*'reasoning'.*'translation'"
    ):
        get_reward_function("accuracy")


@pytest.mark.parametrize(
    "module", [rewards, format_module, reasoning_module, registry_module, translation_module]
)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    if module is not rewards:
        assert result.attempted > 0
