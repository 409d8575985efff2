"""GRPO entry points (``training.grpo_runs``) and evaluation helpers: parameter overrides,
reward binding, greedy decoding, and a whole (tiny) ``run_grpo``."""

import copy

import pandas as pd
import pytest
import torch

from creditflow.rollout import LanguagePolicy, SamplingSettings
from creditflow.training import CheckpointStore, GRPOConfig
from creditflow.training.evaluation import (
    evaluate_policy,
    evaluate_policy_sampled,
    greedy_completions,
    sampled_completions,
    score_completions,
)
from creditflow.training.grpo_runs import merge_overrides, run_grpo
from creditflow.training.rewards import BoundRewards


def test_merge_overrides_merges_mappings_one_level_and_replaces_rewards():
    base = {"steps": 3, "advantage": {"name": "grpo"}, "rewards": {"a": 1.0, "b": 1.0}}
    merged = merge_overrides(base, {"steps": 5, "advantage": {"alpha": 0.5}, "rewards": {"b": 2.0}})
    assert merged == {
        "steps": 5,
        "advantage": {"name": "grpo", "alpha": 0.5},
        "rewards": {"b": 2.0},  # rewards are replaced whole, so a strategy can drop one
    }
    assert base["advantage"] == {"name": "grpo"}, "the base is not modified"
    assert merge_overrides(base, None) == base


def test_text_rewards_score_each_row_against_its_prompt():
    rewards = BoundRewards(["format", "reasoning"], ["Q0", "Q1"], ["3", "7"])
    out = rewards(
        ["<translation>Q1</translation> \\boxed{7}", "no tags \\boxed{3}", "\\boxed{3}"],
        torch.tensor([1, 1, 0]),
    )
    # Row 0 answers prompt 1 (gold 7): format 1, correct. Row 1 answers prompt 1 with 3:
    # wrong, no tags. Row 2 answers prompt 0 (gold 3): correct, no tags.
    assert out["format"].tolist() == [1.0, 0.0, 0.0]
    assert out["reasoning"].tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="bleu"):
        BoundRewards(["bleu"], [], [])
    table = score_completions(["\\boxed{3}"], ["Q0"], ["3"], ["reasoning"])
    assert list(table.columns) == ["reward/reasoning"]
    assert table["reward/reasoning"].tolist() == [1.0]


def test_greedy_completions_do_not_depend_on_the_batching(make_model, tapo_tokenizer, tapo_prompts):
    policy = LanguagePolicy(make_model(), tapo_tokenizer, SamplingSettings(max_new_tokens=6))
    prompts = ["Hi", *tapo_prompts[:3]]  # different lengths: left padding inside a batch
    together = greedy_completions(policy, prompts, batch_size=4)
    alone = greedy_completions(policy, prompts, batch_size=1)
    assert together == alone
    assert len(together) == 4


def test_evaluate_policy_table(make_model, tapo_tokenizer, tapo_tasks, tapo_prompts):
    table = evaluate_policy(
        make_model(),
        tapo_tokenizer,
        tapo_prompts[:3],
        list(tapo_tasks["question_en"][:3]),
        list(tapo_tasks["answer"][:3]),
        ["format", "translation"],
        max_new_tokens=4,
    )
    assert isinstance(table, pd.DataFrame)
    assert list(table.columns) == ["reward/format", "reward/translation", "completion"]
    assert len(table) == 3


def test_sampled_completions_are_seeded_grouped_and_leave_the_global_rng_alone(
    make_model, tapo_tokenizer, tapo_prompts
):
    policy = LanguagePolicy(make_model(), tapo_tokenizer, SamplingSettings(max_new_tokens=5))
    prompts = tapo_prompts[:3]
    torch.manual_seed(7)
    expected_next = torch.rand(1)
    torch.manual_seed(7)
    first = sampled_completions(policy, prompts, samples_per_prompt=4, batch_size=8, seed=3)
    assert torch.rand(1) == expected_next, "evaluation must not advance the caller's RNG"
    assert len(first) == 12
    # The same seed and batching give the same draws; another seed other draws.
    assert sampled_completions(policy, prompts, 4, batch_size=8, seed=3) == first
    assert sampled_completions(policy, prompts, 4, batch_size=8, seed=4) != first
    # A random tiny model over a 5-token budget: the 4 samples of one prompt are not all equal.
    assert len(set(first[:4])) > 1
    with pytest.raises(ValueError, match="samples_per_prompt"):
        sampled_completions(policy, prompts, 0)


def test_sampled_completions_seed_each_call_so_later_calls_share_their_random_numbers(
    make_model, tapo_tokenizer, tapo_prompts
):
    """Common random numbers: a call's draws depend on the seed and the call's index, not on
    how many random numbers an earlier call used (a policy whose samples stopped sooner)."""
    policy = LanguagePolicy(make_model(), tapo_tokenizer, SamplingSettings(max_new_tokens=6))

    class DrawsMoreOnItsFirstCall:
        """The same policy, but its first call uses up 1000 extra random numbers."""

        def __init__(self):
            self.calls = 0

        def sample(self, prompts, samples_per_prompt, with_logprobs):
            self.calls += 1
            if self.calls == 1:
                torch.rand(1000)
            return policy.sample(prompts, samples_per_prompt, with_logprobs=with_logprobs)

    prompts = tapo_prompts[:2]
    # batch_size = samples_per_prompt: one prompt per generate call.
    plain = sampled_completions(policy, prompts, 3, batch_size=3, seed=5)
    draws_more = sampled_completions(DrawsMoreOnItsFirstCall(), prompts, 3, batch_size=3, seed=5)
    assert draws_more[:3] != plain[:3], "the extra draws changed the first call's samples"
    assert draws_more[3:] == plain[3:], "but not the second call's"
    # With one stream for the whole evaluation (the seeding before), the extra draws of the
    # first call would have changed the second call's samples.
    second_calls = []
    for extra in (0, 1000):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            policy.sample(prompts[:1], 3, with_logprobs=False)
            torch.rand(extra)
            second_calls.append(policy.sample(prompts[1:], 3, with_logprobs=False).completion_texts)
    assert second_calls[0] != second_calls[1]


def test_evaluate_policy_sampled_averages_each_prompts_samples(
    make_model, tapo_tokenizer, tapo_tasks, tapo_prompts
):
    model = make_model()
    references = list(tapo_tasks["question_en"][:3])
    answers = list(tapo_tasks["answer"][:3])
    table = evaluate_policy_sampled(
        model,
        tapo_tokenizer,
        tapo_prompts[:3],
        references,
        answers,
        ["format", "translation"],
        max_new_tokens=6,
        samples_per_prompt=3,
        seed=11,
    )
    assert list(table.columns) == ["reward/format", "reward/translation"]
    assert len(table) == 3
    # The slow way: draw the same samples, score each, average by hand.
    policy = LanguagePolicy(model, tapo_tokenizer, SamplingSettings(max_new_tokens=6))
    texts = sampled_completions(policy, tapo_prompts[:3], 3, seed=11)
    for row in range(3):
        scores = score_completions(
            texts[3 * row : 3 * row + 3], [references[row]] * 3, [answers[row]] * 3, ["translation"]
        )
        assert table["reward/translation"][row] == pytest.approx(
            scores["reward/translation"].mean()
        )


@pytest.mark.slow
def test_run_grpo_trains_a_copy_and_checkpoints_by_fingerprint(
    make_format_model, tapo_tokenizer, format_prompts, tmp_path
):
    model = make_format_model()  # closes the tag about half the time: translation rewards vary
    initial = copy.deepcopy(model.state_dict())
    config = GRPOConfig.from_params(
        {
            "steps": 1,
            "prompts_per_step": 4,
            "group_size": 4,
            "max_new_tokens": 16,
            "rewards": {"translation": 1.0},
            "learning_rate": 1e-2,
            "warmup_steps": 0,
        }
    )
    trained, result = run_grpo(
        model,
        tapo_tokenizer,
        format_prompts,
        format_prompts,
        ["5", "5", "3", "8"],
        config,
        ["translation"],
        CheckpointStore(tmp_path),
    )
    assert result.history[0]["reward/total_std"] > 0
    assert trained is not model
    assert all(torch.equal(v, initial[k]) for k, v in model.state_dict().items())
    assert any(not torch.equal(v, initial[k]) for k, v in trained.state_dict().items())
    assert len(result.history) == 1
    (run_dir,) = tmp_path.iterdir()  # one run, keyed by the fingerprint of its inputs
    assert CheckpointStore(run_dir).latest().name == "step-000001"
