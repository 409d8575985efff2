"""The generic prompt sets of the ``grpo`` pipeline: the parameter schema, the prompts schema
of a source (every error naming dataset, row and column), chat-message prompts through the
chat template, and the reward calling convention (the set's other columns as keyword
arguments, as TRL passes them)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kedro.config import OmegaConfigLoader

from creditflow.errors import ConfigError, TaskSourceError
from creditflow.ingest.source_rows import prompt_rows
from creditflow.models import build_tiny_qwen2, train_bpe_tokenizer
from creditflow.pipelines.grpo import nodes
from creditflow.pipelines.parameters import check_parameters
from creditflow.rollout import LanguagePolicy, SamplingSettings
from creditflow.tasks.prompts import generate_prompt_tasks, synthetic_prompt_split
from creditflow.training.teacher_forcing import build_sft_examples

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

CALLS: list[dict] = []  # what recorded_reward was called with, call by call


def recorded_reward(completions, **kwargs):
    """A TRL-style reward (named by import path below): records its call, scores 1 where the
    row's ``kind`` is ``add``."""
    CALLS.append({"completions": completions, **kwargs})
    return [1.0 if kind == "add" else 0.0 for kind in kwargs["kind"]]


RECORDED = "tests.pipelines.grpo.test_prompt_sets:recorded_reward"


@pytest.fixture(scope="module")
def grpo_params(project_root: Path) -> dict:
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    return loader["parameters"]["grpo"]


def _with(params: dict, **changes) -> dict:
    params = copy.deepcopy(params)
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        node = params
        for part in parents:
            node = node[part]
        node[key] = value
    return params


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"tasks__kinds": ["mul"]}, r"grpo\.tasks\.kinds\.0: unknown prompt kind 'mul'"),
        ({"tasks__n_evl": 3}, r"grpo\.tasks: unknown key `n_evl` \(did you mean `n_eval`"),
        ({"reward_functions": ["exact_mach"]}, r"grpo\.reward_functions\.0: .*'exact_mach'"),
        (
            {"evaluation__reward_weights": {"format": 1.0}},
            r"evaluation\.reward_weights names \['format'\], which are not computed",
        ),
        ({"comparison__baseline": "ppo"}, r"comparison\.baseline 'ppo' is not a strategy"),
        ({"tasks__sft_target": ""}, r"grpo\.tasks\.sft_target: string should have at least 1"),
    ],
    ids=["kind", "misspelt key", "reward name", "eval weights", "baseline", "sft target"],
)
def test_the_grpo_schema_names_the_key(grpo_params, changes, expected):
    check_parameters({"grpo": grpo_params})  # the shipped conf passes
    with pytest.raises(ConfigError, match=expected):
        check_parameters({"grpo": _with(grpo_params, **changes)})


def test_synthetic_prompts_are_seeded_and_held_out_prompts_are_never_trained_on():
    first = generate_prompt_tasks(80, seed=3)
    assert first.equals(generate_prompt_tasks(80, seed=3))
    assert set(first["kind"]) == {"add", "sub", "max", "count"}
    # Each gold answer is right: the count of the letter, the sum, the difference, the larger.
    for prompt, answer in zip(first["prompt"], first["answer"], strict=True):
        question = prompt.removesuffix(" Answer with the number only.")
        if question.startswith("How many"):  # ... the letter x occur in: a b c?
            letter = question.split()[6]
            assert int(answer) == question.split(": ")[1].rstrip("?").split().count(letter)
        elif question.startswith("Which"):  # Which is larger, a or b?
            a, b = question.removeprefix("Which is larger, ").rstrip("?").split(" or ")
            assert int(answer) == max(int(a), int(b)) and a != b
        else:  # What is a + b?
            a, op, b = question.removeprefix("What is ").rstrip("?").split()
            assert int(answer) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
    train, heldout = synthetic_prompt_split(400, 40, kinds=["add"], max_operand=30)
    assert len(heldout) == 40 and not set(train["prompt"]) & set(heldout["prompt"])
    with pytest.raises(ValueError, match="only 4 distinct synthetic prompts"):
        synthetic_prompt_split(40, 5, kinds=["add"], max_operand=1)


CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2 + 2?"}]


def test_a_source_in_the_prompts_schema_keeps_chat_prompts_and_its_other_columns():
    frame = pd.DataFrame(
        {
            "id": [1, 2],
            "prompt": [CHAT[1:], np.array(CHAT, dtype=object)],  # as Parquet loads them
            "answer": ["2", "4"],
            "tags": [np.array(["a", "b"]), np.array(["c"])],
            "weight": [np.float32(0.5), np.float32(2.0)],
        }
    )
    rows = prompt_rows(frame, "mine")
    assert rows["id"].tolist() == ["1", "2"]
    assert rows["prompt"].tolist() == [CHAT[1:], CHAT]
    assert rows["tags"].tolist() == [["a", "b"], ["c"]]  # plain lists, as the file says
    assert rows["weight"].tolist() == [0.5, 2.0]


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (
            {"id": ["a", "b"], "prompt": ["x", [{"role": "robot", "content": "hi"}]]},
            r"task source `mine`, row 1, column `prompt`: message 0 has the role 'robot'",
        ),
        (
            {"id": ["a", "b"], "prompt": ["x", [{"role": "user"}]]},
            r"row 1, column `prompt`: message 0 is \{'role': 'user'\}, not",
        ),
        (
            {"id": ["a", "b"], "prompt": ["x", "hi <|im_end|>"]},
            r"row 1, column `prompt`: holds the chat control token '<\|im_end\|>'",
        ),
        ({"id": ["a", "a"], "prompt": ["x", "y"]}, r"row 1, column `id`: rows \[0, 1\] share"),
        (
            {"id": ["a", "b"], "prompt": ["x", CHAT]},
            r"row 1, column `prompt`: row 0's prompt is text, this one chat messages",
        ),
        ({"id": ["a"], "question": ["x"]}, r"missing column\(s\) \['prompt'\]"),
        (
            {"id": ["a"], "prompt": ["x"], "completions": ["y"]},
            r"column `completions`: column\(s\) \['completions'\] are named like the arguments",
        ),
        ({"id": ["a"], "prompt": ["x"], "completion": [""]}, r"row 0, column `completion`: empty"),
    ],
    ids=[
        "role",
        "no content",
        "chat token",
        "repeated id",
        "mixed",
        "no prompt",
        "reserved",
        "blank",
    ],
)
def test_a_bad_source_row_names_dataset_row_and_column(frame, expected):
    with pytest.raises(TaskSourceError, match=expected):
        prompt_rows(pd.DataFrame(frame), "mine")


def test_sft_without_a_target_column_fails_naming_the_keys(grpo_params):
    params = _with(grpo_params, tasks__source="mine")
    source = pd.DataFrame({"id": ["a", "b", "c"], "prompt": ["x", "y", "z"], "answer": list("123")})
    with pytest.raises(ConfigError, match=r"grpo\.sft\.steps is 400 but .*`completion` column"):
        nodes.build_grpo_tasks(source, params)
    # The gold answer as the SFT target, or no SFT at all, both go.
    for changes in ({"tasks__sft_target": "answer"}, {"sft__steps": 0}):
        train, heldout = nodes.build_grpo_tasks(source, _with(params, **changes))
        assert len(train) + len(heldout) == 3
    # The built-in exact_match reads `answer`: a set without it fails before anything trains.
    with pytest.raises(ConfigError, match="no 'answer' column, which the 'exact_match' reward"):
        nodes.build_grpo_tasks(source.drop(columns="answer"), _with(params, sft__steps=0))


@pytest.fixture(scope="module")
def tiny():
    tokenizer = train_bpe_tokenizer(["What is 1 + 1? 2", "Answer briefly. 2 + 2? 4"] * 20, 300)
    model = build_tiny_qwen2(
        tokenizer,
        hidden_size=32,
        num_hidden_layers=1,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        seed=0,
    )
    return model.eval(), tokenizer


def test_chat_prompts_are_rendered_as_they_are_by_sft_and_the_policy(tiny):
    model, tokenizer = tiny
    policy = LanguagePolicy(model, tokenizer, SamplingSettings(max_new_tokens=2))
    rendered = policy.format_prompt(CHAT)
    assert rendered == (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert (
        policy.format_prompt("2 + 2?")
        == "<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )
    ((ids, labels),) = build_sft_examples(tokenizer, [CHAT], ["4"], max_length=64)
    prompt_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert (
        ids[: len(prompt_ids)] == prompt_ids and labels[len(prompt_ids) :] == ids[len(prompt_ids) :]
    )


def test_rewards_get_the_prompt_sets_columns_as_keyword_arguments(tiny, grpo_params):
    model, tokenizer = tiny
    heldout = pd.DataFrame(
        {
            "id": ["p0", "p1"],
            "prompt": [CHAT, CHAT[1:]],
            "answer": ["4", "4"],
            "completion": ["4", "4"],  # the gold completion: no reward reads it, as in TRL
            "kind": ["add", "count"],
        }
    )
    params = _with(
        grpo_params,
        reward_functions=["exact_match", RECORDED],
        evaluation__samples_per_problem=3,
        evaluation__max_new_tokens=2,
    )
    CALLS.clear()
    table = nodes.evaluate_grpo_policy(model, tokenizer, heldout, params)
    greedy, sampled = CALLS  # the greedy completions, then 3 sampled per prompt
    assert set(greedy) == {
        "completions",
        "prompts",
        "id",
        "answer",
        "kind",
        "completion_ids",
        "trainer_state",
    }
    assert greedy["kind"] == ["add", "count"] and greedy["prompts"] == [CHAT, CHAT[1:]]
    # Conversational prompts: each completion as an assistant message, as TRL hands them.
    assert greedy["completions"][0][0]["role"] == "assistant"
    assert sampled["kind"] == ["add"] * 3 + ["count"] * 3  # one value per completion
    assert sampled["id"] == ["p0"] * 3 + ["p1"] * 3
    assert table[f"reward/{RECORDED}"].tolist() == [1.0, 0.0]
    assert table[f"sampled/reward/{RECORDED}"].tolist() == [1.0, 0.0]
    assert list(table.columns[:2]) == ["id", "completion"]
    assert "sampled/reward/exact_match" in table
