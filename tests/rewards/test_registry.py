"""The reward registry: one signature for the training engine; docstring examples run."""

import doctest

import pytest

from creditflow import rewards
from creditflow.rewards import (
    REWARD_FUNCTIONS,
    check_reward_options,
    format_reward,
    get_reward_function,
    reasoning_reward,
    translation_reward,
)
from creditflow.rewards import exact as exact_module
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
    assert sorted(REWARD_FUNCTIONS) == [
        "exact_match",
        "final_number",
        "format",
        "number_format",
        "reasoning",
        "translation",
    ]


def test_adapters_call_the_rewards_with_the_right_arguments():
    assert get_reward_function("format")(COMPLETIONS, REFERENCES, ANSWERS) == (
        format_reward(COMPLETIONS),
        {},
    )
    assert get_reward_function("translation")(COMPLETIONS, REFERENCES, ANSWERS) == (
        translation_reward(COMPLETIONS, REFERENCES),
        {},
    )
    rewards, flags = get_reward_function("reasoning")(COMPLETIONS, REFERENCES, ANSWERS)
    assert rewards == reasoning_reward(COMPLETIONS, ANSWERS)
    # Hand values: F = [1, 1, 0]; the first translation is exact; answers 9, 8, 9 vs gold 9.
    assert get_reward_function("format")(COMPLETIONS, REFERENCES, ANSWERS)[0] == [1.0, 1.0, 0.0]
    assert rewards == [1.0, 0.0, 1.0]
    assert flags == {"rejected": [0.0] * 3, "timed_out": [0.0] * 3, "over_budget": [0.0] * 3}
    translation, _ = get_reward_function("translation")(COMPLETIONS, REFERENCES, ANSWERS)
    assert translation[0] == 1.0 and 0.0 < translation[1] < 1.0 and translation[2] == 0.0


def test_reasoning_flags_mark_the_rejected_completions():
    completions = [*COMPLETIONS, "\\boxed{9^{9^{9^{9}}}}", "\\boxed{(10^{10})!}"]
    rewards, flags = get_reward_function("reasoning")(completions, ["Q"] * 5, ["9"] * 5)
    assert rewards == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert flags["rejected"] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert flags["timed_out"] == flags["over_budget"] == [0.0] * 5


def test_adapters_forward_keywords():
    with pytest.raises(ValueError, match="unknown translation metric"):
        get_reward_function("translation")(COMPLETIONS, REFERENCES, ANSWERS, metric="bleu")
    with pytest.raises(ValueError, match="timeout_s"):
        get_reward_function("reasoning")(COMPLETIONS, REFERENCES, ANSWERS, timeout_s=-1)
    rewards, flags = get_reward_function("reasoning")(
        ["\\boxed{12345}"], ["Q"], ["12345"], max_answer_chars=4
    )
    assert rewards == [0.0] and flags["rejected"] == [1.0]


def test_check_reward_options_names_the_valid_ones_and_checks_values():
    assert check_reward_options("reasoning", {"budget_s": 10.0, "timeout_s": 2}) == {
        "budget_s": 10.0,
        "timeout_s": 2,
    }
    assert check_reward_options("reasoning", {"budget_s": None}) == {"budget_s": None}
    assert check_reward_options("translation", {"metric": "chrf++"}) == {"metric": "chrf++"}
    assert check_reward_options("format", {}) == {}
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['budget'\].*'budget_s'"):
        check_reward_options("reasoning", {"budget": 10.0})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['metric'\] of reward 'format'"):
        check_reward_options("format", {"metric": "chrf++"})
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        check_reward_options("reasoning", {"budget_s": 0})
    with pytest.raises(ValueError, match="max_nesting must be an int >= 1"):
        check_reward_options("reasoning", {"max_nesting": 0.5})
    with pytest.raises(ValueError, match="unknown translation metric"):
        check_reward_options("translation", {"metric": "bleu"})
    with pytest.raises(ValueError, match="unknown reward 'bleu'"):
        check_reward_options("bleu", {})


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(
        ValueError, match=r"unknown reward 'accuracy'.*'format'.*'reasoning'.*'translation'"
    ):
        get_reward_function("accuracy")


@pytest.mark.parametrize(
    "module",
    [rewards, exact_module, format_module, reasoning_module, registry_module, translation_module],
)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    if module is not rewards:
        assert result.attempted > 0


def test_the_number_rewards_read_the_last_number_and_the_bare_format():
    completions = ["3 + 4 = 7.", "7", "It is -7, not 7", "seven", "1,007"]
    answers = ["7", "7", "7", "7", "1007"]
    assert get_reward_function("final_number")(completions, [""] * 5, answers) == (
        [1.0, 1.0, 1.0, 0.0, 1.0],
        {},
    )
    assert get_reward_function("number_format")(completions, [""] * 5, answers) == (
        [0.0, 1.0, 0.0, 0.0, 1.0],
        {},
    )
    # No gold answer: no credit, whatever the completion says.
    assert get_reward_function("final_number")(["7"], [""], [""])[0] == [0.0]
