"""The Monte Carlo deserved credit (creditflow.training.deserved_credit): convergence to the
exact prefix values of a hand-built world, and the credit inspector's deserved column, for a
language and a vision-language policy."""

# The VL fixtures are imported from the rollout tests and requested by name as parameters.
# ruff: noqa: F811

import math

import pandas as pd
import pytest
import torch

from creditflow.config.grpo import CreditInspection
from creditflow.errors import ConfigError
from creditflow.reporting.credit import credit_html, deserved_recovery
from creditflow.rollout import SamplingSettings, VisionLanguagePolicy
from creditflow.training import GRPOConfig, GRPOTrainer
from creditflow.training.credit import CREDIT_COLUMNS, DESERVED_COLUMNS
from creditflow.training.deserved_credit import (
    estimate_deserved_credit,
    prefix_inputs,
    prefix_sampler,
    span_boundaries,
)
from creditflow.training.grpo_runs import grpo_policy
from tests.rollout.test_vision_policy import (  # noqa: F401 - fixtures are found by name
    make_vl_model,
    tor_tasks,
    vl_processor,
    vl_prompts,
)
from tests.training.helpers import length_reward, make_trainer

# The world: 3 binary tokens drawn independently, token t is 1 with probability P[t]; the
# reward is token 0 AND token 2, so token 1 is free. Exact values: V(0) = P0 * P2,
# V(1) = x0 * P2, V(2) = x0 * P2, V(3) = x0 * x2; exact credits x0*P2 - P0*P2, 0, x0*(x2 - P2).
P = torch.tensor([0.3, 0.5, 0.6])
COMPLETIONS = torch.tensor([[1, 0, 1], [1, 1, 0], [0, 1, 1]])


def _world_sampler(generator):
    def sample(rows, lengths, k):
        ids = (torch.rand(len(rows) * k, 3, generator=generator) < P).long()
        for j, (row, t) in enumerate(
            zip(rows.repeat_interleave(k), lengths.repeat_interleave(k), strict=True)
        ):
            ids[j, :t] = COMPLETIONS[row, :t]
        return ids, torch.ones_like(ids, dtype=torch.float)

    return sample


def _world_reward(rows, ids, mask):
    return (ids[:, 0] * ids[:, 2]).float()


def _exact_credit():
    x0, x2 = COMPLETIONS[:, 0].float(), COMPLETIONS[:, 2].float()
    p0, p2 = P[0], P[2]
    return torch.stack([x0 * p2 - p0 * p2, torch.zeros(3), x0 * (x2 - p2)], dim=1)


def _error(k: int, seeds: int = 20) -> tuple[float, float]:
    """RMS error of the estimated credit over seeds, and the free token's mean |credit|."""
    mask = torch.ones(3, 3)
    rewards = _world_reward(None, COMPLETIONS, mask)
    squared, free = 0.0, 0.0
    for seed in range(seeds):
        sampler = _world_sampler(torch.Generator().manual_seed(seed))
        credit, values = estimate_deserved_credit(
            sampler, _world_reward, span_boundaries(1, mask), mask, rewards, k
        )
        assert torch.isfinite(values).all()  # every-token spans: every prefix valued
        torch.testing.assert_close(values[:, 3].float(), rewards)  # the end: the own reward
        squared += float((credit - _exact_credit()).square().mean())
        free += float(credit[:, 1].abs().mean())
    return math.sqrt(squared / seeds), free / seeds


def test_the_estimate_converges_like_one_over_sqrt_k():
    errors = {k: _error(k) for k in (4, 64, 1024)}
    # 16x the continuations -> the error / 4 (1/sqrt(K)); a loose band around it.
    for small, large in ((4, 64), (64, 1024)):
        ratio = errors[small][0] / errors[large][0]
        assert 2.0 < ratio < 8.0, (small, large, errors)
    assert errors[1024][0] < 0.03
    assert errors[1024][1] < 0.03  # the free token gets about nothing


def test_coarse_spans_spread_the_change_in_value():
    """every 2 of 3 tokens: V(0) and V(2) are sampled, V(3) is the reward."""
    mask = torch.ones(3, 3)
    sampler = _world_sampler(torch.Generator().manual_seed(0))
    rewards = _world_reward(None, COMPLETIONS, mask)
    credit, values = estimate_deserved_credit(
        sampler, _world_reward, span_boundaries(2, mask), mask, rewards, 4096
    )
    assert values[:, 1].isnan().all() and values[:, [0, 2, 3]].isfinite().all()
    exact = _exact_credit()
    first = (exact[:, 0] + exact[:, 1]) / 2
    torch.testing.assert_close(credit[:, 0], first, atol=0.04, rtol=0)
    torch.testing.assert_close(credit[:, 1], first, atol=0.04, rtol=0)
    torch.testing.assert_close(credit[:, 2], exact[:, 2], atol=0.04, rtol=0)


@pytest.mark.parametrize(
    ("deserved", "match"),
    [
        ({"continuations": 0}, r"continuations \(K\) must be >= 1"),
        ({"every": 0}, "every must be an int >= 1"),
        ({"every": "tokens"}, "or 'segments'"),
        ({"k": 2}, r"valid: \['continuations', 'every'\]"),
    ],
)
def test_a_bad_deserved_spec_fails_up_front(deserved, match):
    with pytest.raises(ConfigError, match=match):
        GRPOConfig(steps=2, credit_inspector={"deserved": deserved}).validate()
    assert CreditInspection().deserved is None  # off by default


def test_a_run_records_deserved_credit_and_trains_as_without_it(
    make_model, tapo_tokenizer, tapo_prompts
):
    def run(inspector):
        trainer = make_trainer(
            make_model(), tapo_tokenizer, tapo_prompts, steps=2, credit_inspector=inspector
        )
        result = trainer.train()
        return pd.DataFrame(result.credit), result.history

    spec = {"steps": [1], "rollouts": 2, "deserved": {"continuations": 2, "every": 3}}
    table, history = run(spec)
    plain, plain_history = run({"steps": [1], "rollouts": 2})
    assert list(table.columns[: len(CREDIT_COLUMNS)]) == list(CREDIT_COLUMNS)
    assert set(DESERVED_COLUMNS) <= set(table.columns)
    assert not set(DESERVED_COLUMNS) & set(plain.columns)  # off: the table is unchanged
    assert table["deserved"].notna().all() and table["deserved"].map(math.isfinite).all()
    # A completion's deserved credits add up to its reward minus the prompt's value, and the
    # value after its last token is its own reward (the length reward, weight 1).
    for _, tokens in table.groupby("row"):
        last = tokens.sort_values("position").iloc[-1]
        assert last["prefix_value"] == pytest.approx(last["reward/length"])
    # The continuations draw from their own random stream: the training is unchanged.
    assert [h["reward/total"] for h in history] == [h["reward/total"] for h in plain_history]
    pd.testing.assert_frame_equal(table[list(CREDIT_COLUMNS)], plain[list(CREDIT_COLUMNS)])
    page = credit_html({"grpo": table.assign(seed=0)})
    assert "deserved" in page and "recovery" in page
    scores = deserved_recovery({"grpo": table})
    assert list(scores["strategy"]) == ["grpo"]


# ---------------------------------------------------------------- a vision-language policy
def test_a_prefix_keeps_its_rows_picture_and_a_greedy_sampler_completes_it_as_before(
    make_vl_model, vl_processor, vl_prompts
):
    # top_k 1 makes sampling greedy, so a continuation of a prefix of a sampled completion
    # must be that completion's own tail, which holds only if the prefix carries its row's
    # picture, image-token types and rope positions as the rollout's prompt did.
    policy = VisionLanguagePolicy(
        make_vl_model(), vl_processor, SamplingSettings(max_new_tokens=8, top_k=1)
    )
    batch = policy.sample(vl_prompts, group_size=1)
    rows, lengths = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 2, 3, 1])
    inputs = prefix_inputs(batch, rows, lengths, policy.device)
    for n, (row, t) in enumerate(zip(rows.tolist(), lengths.tolist(), strict=True)):
        kept = inputs["attention_mask"][n].bool()
        prompt = batch.prompt_ids[row][batch.prompt_mask[row].bool()]
        expected = torch.cat([prompt, batch.completion_ids[row, :t]])
        assert torch.equal(inputs["input_ids"][n][kept], expected)
        types = batch.extras["mm_token_type_ids"][row][batch.prompt_mask[row].bool()]
        assert torch.equal(inputs["mm_token_type_ids"][n][kept][: len(types)], types)
        assert not inputs["mm_token_type_ids"][n][kept][len(types) :].any()  # text tokens
        assert torch.equal(inputs["pixel_values"][n], batch.extras["pixel_values"][row])
        assert torch.equal(inputs["image_grid_thw"][n], batch.extras["image_grid_thw"][row])
    ids, mask = prefix_sampler(policy, batch)(rows, lengths, 2)
    expected_ids = batch.completion_ids.repeat_interleave(2, dim=0)
    expected_mask = batch.completion_mask.repeat_interleave(2, dim=0)
    width = expected_ids.shape[1]
    assert torch.equal(mask[:, :width], expected_mask) and not mask[:, width:].any()
    assert torch.equal((ids[:, :width] * mask[:, :width]).long(), expected_ids * expected_mask)


def test_a_vision_language_run_records_deserved_credit_and_trains_as_without_it(
    make_vl_model, vl_processor, vl_prompts
):
    def run(inspector):
        config = GRPOConfig.from_params(
            {
                "steps": 2,
                "prompts_per_step": 2,
                "group_size": 2,
                "max_new_tokens": 6,
                "rewards": {"length": 1.0},
                "warmup_steps": 0,
                "checkpoint_every": 0,
                "log_samples_every": 0,
                "token_weights": {"name": "tor"},
                "credit_inspector": inspector,
            }
        )
        policy = grpo_policy(make_vl_model(), vl_processor, config)
        result = GRPOTrainer(policy, vl_prompts, length_reward, config, progress=False).train()
        return pd.DataFrame(result.credit), result.history

    spec = {"steps": [2], "rollouts": 2, "deserved": {"continuations": 2, "every": 2}}
    table, history = run(spec)
    plain, plain_history = run({"steps": [2], "rollouts": 2})
    assert table["deserved"].map(math.isfinite).all()
    for _, tokens in table.groupby("row"):
        last = tokens.sort_values("position").iloc[-1]
        assert last["prefix_value"] == pytest.approx(last["reward/length"])
    assert [h["reward/total"] for h in history] == [h["reward/total"] for h in plain_history]
    pd.testing.assert_frame_equal(table[list(CREDIT_COLUMNS)], plain[list(CREDIT_COLUMNS)])
