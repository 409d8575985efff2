"""``creditflow.api``, the Python entry points outside Kedro: datasets, rewards by name or as
TRL-style callables, the policy builders, and the quickstart of docs/python_api.md run as
written."""

from __future__ import annotations

import re
import time
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
import torch

from creditflow import api
from creditflow.errors import ConfigError
from creditflow.rewards import REWARD_FUNCTIONS, REWARD_INPUTS
from creditflow.tasks.tapo import format_tapo_target, generate_tapo_problems, tapo_prompt
from creditflow.training.rewards import BoundRewards

DOC = Path(__file__).resolve().parents[1] / "docs" / "python_api.md"
TINY = {"source": "tiny", "tiny": {"hidden_size": 32, "num_hidden_layers": 1}}
SMALL_GRPO = {"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4}


def quickstart_code() -> str:
    """The one python block of docs/python_api.md: the quickstart."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, f"{DOC.name} should hold one python block, the quickstart"
    return blocks[0]


@pytest.mark.slow
def test_the_quickstart_in_the_docs_runs_as_written(capsys):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    namespace: dict = {"__name__": "quickstart"}
    started = time.process_time()
    try:
        exec(compile(quickstart_code(), str(DOC), "exec"), namespace)
    finally:
        torch.set_num_threads(previous)
    cpu_s = time.process_time() - started
    run, table, model = namespace["run"], namespace["table"], namespace["model"]
    assert run.metrics["step"].tolist() == [1, 2, 3]
    assert {"reward/translation", "reward/boxed_answer", "reward/total"} <= set(run.metrics)
    assert len(run.sft_metrics) == namespace["sft"]["steps"]
    # Warm start and GRPO trained a copy: the policy passed in keeps its weights.
    trained = run.model.state_dict()
    assert any(not torch.equal(w, trained[k]) for k, w in model.state_dict().items())
    assert len(table) == len(namespace["test_set"])
    for column in ("reward/translation", "reward/boxed_answer", "sampled/reward/boxed_answer"):
        assert table[column].between(0, 1).all(), column
    assert "reward/boxed_answer" in capsys.readouterr().out
    assert cpu_s < 60, f"the quickstart took {cpu_s:.0f} s of CPU time; keep it under a minute"


# ---------------------------------------------------------------- TRL-style rewards
# Written as TRL's GRPOTrainer expects a reward function (standard format: completions are
# strings; every dataset column but the prompt arrives as a keyword argument, the prompts as
# `prompts`), and used here unchanged.
def length_penalty(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def boxed_matches(prompts, completions, ground_truth, **kwargs):
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth, strict=True)]


def test_a_trl_style_reward_function_works_unchanged_next_to_a_builtin():
    rewards = BoundRewards(
        ["format", length_penalty, boxed_matches],
        references=["Q0", "Q1"],
        answers=["3", "7"],
        columns={"prompts": ["p0", "p1"], "ground_truth": ["3", "7"], "level": [1, 2]},
    )
    completions = ["<translation>Q1</translation> \\boxed{7}", "\\boxed{3}", "\\boxed{3}"]
    out = rewards(completions, torch.tensor([1, 1, 0]))
    assert [name for name in out if "/" not in name] == [
        "format",
        "length_penalty",
        "boxed_matches",
    ]
    assert out["boxed_matches/not_applicable"].tolist() == [0.0, 0.0, 0.0]  # no None returned
    assert out["format"].tolist() == [1.0, 0.0, 0.0]
    # 13 + 2 + 14 + 1 + 9 = 39 characters, then 9 and 9: -|20 - length|.
    assert out["length_penalty"].tolist() == [-19.0, -11.0, -11.0]
    # Row 0 and 1 answer prompt 1 (ground truth 7), row 2 prompt 0 (ground truth 3).
    assert out["boxed_matches"].tolist() == [1.0, 0.0, 1.0]


def test_bad_rewards_fail_before_training_and_say_why():
    with pytest.raises(ConfigError, match="given twice"):
        api.reward_names(["format", "format"])
    with pytest.raises(ValueError, match="unknown reward 'bleu'"):
        api.reward_names(["bleu"])
    with pytest.raises(ConfigError, match="__name__"):
        api.reward_names([partial(length_penalty)])
    assert api.reward_names(["reasoning", length_penalty]) == ["reasoning", "length_penalty"]
    with pytest.raises(ValueError, match="returned 1 values for 2 completions"):
        BoundRewards([lambda completions, **kw: [1.0]], ["Q"], ["1"])(
            ["a", "b"], torch.tensor([0, 0])
        )


def test_a_none_score_means_does_not_apply_as_in_trl():
    # TRL sums the reward functions skipping a None (nansum): it adds 0 to the total. Here it
    # scores 0 and is counted as a flag, so a run says how often a reward did not apply.
    def only_short(completions, **kwargs):
        return [None if len(c) > 3 else 1.0 for c in completions]

    out = BoundRewards([only_short], ["Q"], ["1"])(["ab", "abcdef"], torch.tensor([0, 0]))
    assert out["only_short"].tolist() == [1.0, 0.0]
    assert out["only_short/not_applicable"].tolist() == [0.0, 1.0]


def test_every_builtin_reward_says_which_data_it_reads_and_ignores_the_rest():
    assert set(REWARD_INPUTS) == set(REWARD_FUNCTIONS)
    completion = "<translation>Two plus two?</translation> \\boxed{4}"
    for name, reads in REWARD_INPUTS.items():
        given = {"references": ["Two plus two?"], "answers": ["4"]}
        unread = {k: [None] for k in given if k not in reads}
        rewards, _ = REWARD_FUNCTIONS[name]([completion], **{**given, **unread})
        assert len(rewards) == 1, name


# ---------------------------------------------------------------- datasets
def problems(n_per_language: int = 2, seed: int = 0) -> pd.DataFrame:
    table = generate_tapo_problems(n_per_language, ["en", "de"], seed=seed, max_operand=9)
    table["prompt"] = [tapo_prompt(q) for q in table["question"]]
    targets = zip(table["question_en"], table["answer"], table["reasoning_en"], strict=True)
    table["target"] = [format_tapo_target(*row) for row in targets]
    return table


def test_a_dataset_is_a_frame_or_a_list_of_dicts_checked_for_what_the_rewards_read():
    frame = problems()
    records = api.as_dataset(frame.to_dict("records"), ["reasoning", "translation"], sft=True)
    pd.testing.assert_frame_equal(records, api.as_dataset(frame))
    shuffled = frame.sample(frac=1, random_state=0)
    assert api.as_dataset(shuffled).index.tolist() == list(range(len(frame)))
    prompts_only = frame[["prompt"]]
    assert len(api.as_dataset(prompts_only, ["format", length_penalty])) == len(frame)
    with pytest.raises(ConfigError, match="no 'answer' column, which the 'reasoning' reward"):
        api.as_dataset(prompts_only, ["reasoning"])
    with pytest.raises(ConfigError, match=r"no 'reference' column \(or 'question_en'\)"):
        api.as_dataset(prompts_only, ["translation"])
    with pytest.raises(ConfigError, match="no 'target' column, which the SFT warm start"):
        api.as_dataset(prompts_only, sft=True)
    with pytest.raises(ConfigError, match="both"):
        api.as_dataset(frame.assign(reference=frame["question_en"]), ["translation"])
    with pytest.raises(ConfigError, match="'prompt' column"):
        api.as_dataset(frame.drop(columns="prompt"))
    with pytest.raises(ConfigError, match="DataFrame, a list of dicts"):
        api.as_dataset("prompts.csv")


def test_grpo_config_checks_fields_and_strategy_and_train_checks_the_rewards():
    config = api.grpo_config(**SMALL_GRPO, advantage={"name": "tapo", "alpha": 0.3})
    assert config.advantage == {"name": "tapo", "alpha": 0.3} and config.steps == 1
    with pytest.raises(ConfigError, match="stpes"):
        api.grpo_config(stpes=3)
    with pytest.raises(ConfigError, match="alpha"):
        api.grpo_config(advantage={"name": "tapo", "alpha": 2.0})
    # TAPO reads `translation` and `reasoning`; only `reasoning` is computed. No model is
    # needed: the check comes before anything is built or trained.
    with pytest.raises(ConfigError, match=r"reads rewards \['translation'\]"):
        api.train(None, None, problems(), ["reasoning"], config, sft={"steps": 1})


# ---------------------------------------------------------------- policies
def test_build_policy_trains_a_tokenizer_for_a_tiny_policy_and_loads_a_checkpoint(tmp_path):
    texts = [*problems()["prompt"], *problems()["target"]]
    with pytest.raises(ConfigError, match="texts"):
        api.build_policy(TINY)
    model, tokenizer = api.build_policy(TINY, texts=texts, vocab_size=300)
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = api.build_policy(tmp_path)  # a local checkpoint directory
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert all(torch.equal(w, loaded.state_dict()[k]) for k, w in model.state_dict().items())
    assert api.build_tokenizer(str(tmp_path)).get_vocab() == tokenizer.get_vocab()


# ---------------------------------------------------------------- columns reach the rewards
class Recorder:
    """A TRL-style reward that scores 0 and records, per completion, the prompt and the
    dataset's `id` it was called with."""

    __name__ = "recorder"

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, str]]] = []

    def __call__(self, completions, prompts, id, **kwargs):  # `id`: the dataset column
        self.calls.append(list(zip(prompts, id, strict=True)))
        return [0.0] * len(completions)


@pytest.fixture(scope="module")
def tiny_policy():
    texts = [*problems()["prompt"], *problems()["target"]]
    return api.build_policy(TINY, texts=texts, vocab_size=300)


def test_train_and_evaluate_hand_each_completion_its_own_rows_columns(tiny_policy):
    model, tokenizer = tiny_policy
    dataset = problems().drop(columns=["answer", "question_en", "target"])
    of_id = dict(zip(dataset["id"], dataset["prompt"], strict=True))
    recorder = Recorder()
    config = api.grpo_config(**SMALL_GRPO, rewards={"format": 1.0})
    trained = api.train_grpo(
        model, tokenizer, dataset.to_dict("records"), ["format", recorder], config
    )
    (batch,) = recorder.calls  # one step: 2 prompts x 2 completions
    assert len(batch) == 4 and all(of_id[i] == prompt for prompt, i in batch)
    assert list(trained.metrics["step"]) == [1] and "reward/recorder" in trained.metrics

    recorder.calls.clear()
    sampled = (dataset["language"] == "de").tolist()
    table = api.evaluate(
        trained.model,
        tokenizer,
        dataset,
        ["format", recorder],
        max_new_tokens=4,
        samples_per_problem=2,
        sampled_rows=sampled,
    )
    greedy, samples = recorder.calls
    assert [i for _, i in greedy] == list(dataset["id"])
    german = dataset.loc[sampled, "id"].tolist()
    assert [i for _, i in samples] == [i for i in german for _ in range(2)]  # prompt-major
    assert all(of_id[i] == prompt for prompt, i in greedy + samples)
    assert list(table.columns[: len(dataset.columns)]) == list(dataset.columns)
    assert table["sampled/reward/recorder"].notna().tolist() == sampled
