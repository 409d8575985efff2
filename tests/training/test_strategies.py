"""Credit-assignment strategies on hand-made rollout batches (docs/methods/grpo.md and 1)."""

import math
import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from creditflow.errors import ConfigError
from creditflow.rollout import RolloutBatch
from creditflow.training import ADVANTAGE_STRATEGIES, TOKEN_WEIGHT_STRATEGIES, GRPOConfig
from creditflow.training.strategies import SignConflictRate, WeightContext, weighted_reward

A = 1 / math.sqrt(2)  # zscore of (1, 0): mean 0.5, unbiased std sqrt(0.5) -> (+-0.5 / 0.7071)


def _batch(tokenizer, completions: list[list[int]], group_size: int, width: int) -> RolloutBatch:
    """Right-padded completions (token ids) as a rollout batch; prompts are irrelevant here."""
    B = len(completions)
    ids = torch.full((B, width), tokenizer.pad_token_id)
    mask = torch.zeros(B, width)
    for row, tokens in enumerate(completions):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1.0
    return RolloutBatch(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.long),
        completion_ids=ids,
        completion_mask=mask,
        old_logp=torch.zeros(B, width),
        completion_texts=tokenizer.batch_decode(ids, skip_special_tokens=True),
        prompt_index=torch.arange(B) // group_size,
        group_size=group_size,
    )


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_grpo_advantage_is_the_group_zscore_of_the_weighted_reward(tapo_tokenizer):
    # Rewards a = (1, 0 | 2, 2), b = (0, 1 | 0, 1) with weights a: 1, b: 2 -> totals
    # (1, 2 | 2, 4): group 1 zscore (-A, +A), group 2 (-A, +A), on every valid token.
    batch = _batch(tapo_tokenizer, [[5, 6], [5], [7, 8, 9], [7]], group_size=2, width=3)
    rewards = {"a": torch.tensor([1.0, 0.0, 2.0, 2.0]), "b": torch.tensor([0.0, 1.0, 0.0, 1.0])}
    config = GRPOConfig(group_size=2, rewards={"a": 1.0, "b": 2.0})
    adv, metrics = ADVANTAGE_STRATEGIES["grpo"].compute(
        {"name": "grpo"}, rewards, batch, None, config
    )
    expected = torch.tensor([[-A, -A, 0], [A, 0, 0], [-A, -A, -A], [A, 0, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert metrics["adv/abs_mean"] == pytest.approx(A, abs=1e-5)


def test_grpo_advantage_is_zero_for_a_group_with_equal_rewards(tapo_tokenizer):
    batch = _batch(tapo_tokenizer, [[5, 6], [5, 6]], group_size=2, width=2)
    config = GRPOConfig(group_size=2, rewards={"a": 1.0})
    adv, _ = ADVANTAGE_STRATEGIES["grpo"].compute(
        {"name": "grpo"}, {"a": torch.tensor([3.0, 3.0])}, batch, None, config
    )
    assert torch.equal(adv, torch.zeros(2, 2))


def test_tapo_advantages_split_at_the_closing_tag(tapo_tokenizer):
    """Row 0 never closes the tag: all its tokens are translation segment. Row 1 closes it.

    R_trans = (1, 0) -> A_trans = (+A, -A); R_reason = (0, 1) -> A_reason = (-A, +A).
    alpha = 0.75: translation tokens get 0.75 * A_trans + 0.25 * A_reason
    = (0.5 A, -0.5 A); reasoning tokens A_reason = +A (row 1 only).
    """
    tok = tapo_tokenizer
    close_id = tok.convert_tokens_to_ids("</translation>")
    row0 = _encode(tok, "<translation>Anna has 5 pencils and")  # no closing tag
    head = _encode(tok, "<translation>Q")
    tail = _encode(tok, " 5 + 3")
    row1 = head + [close_id] + tail
    width = max(len(row0), len(row1)) + 1
    batch = _batch(tok, [row0, row1], group_size=2, width=width)
    rewards = {"translation": torch.tensor([1.0, 0.0]), "reasoning": torch.tensor([0.0, 1.0])}
    spec = {"name": "tapo", "alpha": 0.75}
    policy = types.SimpleNamespace(tokenizer=tok)
    config = GRPOConfig(group_size=2, advantage=spec, rewards={"translation": 1, "reasoning": 1})
    adv, metrics = ADVANTAGE_STRATEGIES["tapo"].compute(spec, rewards, batch, policy, config)

    expected = torch.zeros(2, width)
    expected[0, : len(row0)] = 0.5 * A
    expected[1, : len(head) + 1] = -0.5 * A
    expected[1, len(head) + 1 : len(row1)] = A
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert metrics["adv/reasoning_token_frac"] == pytest.approx(len(tail) / (len(row0) + len(row1)))


@given(st.floats(0.0, 1.0), st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4))
def test_tapo_advantages_match_a_reference_for_any_alpha(tapo_tokenizer, alpha, r_t):
    """Translation tokens alpha * A_trans + (1 - alpha) * A_reason, reasoning tokens A_reason,
    for random translation rewards and alpha (plus the ends 0 and 1)."""
    tok = tapo_tokenizer
    close_id = tok.convert_tokens_to_ids("</translation>")
    head, tail = _encode(tok, "<translation>Q"), _encode(tok, " 8")
    batch = _batch(tok, [head + [close_id] + tail] * 4, group_size=4, width=len(head) + 3)
    rewards = {"translation": torch.tensor(r_t), "reasoning": torch.tensor([1.0, 0, 0, 1])}
    policy = types.SimpleNamespace(tokenizer=tok)
    config = GRPOConfig(group_size=4, rewards={"reasoning": 1.0})
    for a in (alpha, 0.0, 1.0):
        spec = {"name": "tapo", "alpha": a}
        adv, _ = ADVANTAGE_STRATEGIES["tapo"].compute(spec, rewards, batch, policy, config)
        a_trans = _zscore(rewards["translation"])
        a_reason = _zscore(rewards["reasoning"])
        n = len(head) + 1
        torch.testing.assert_close(
            adv[:, :n], (a * a_trans + (1 - a) * a_reason)[:, None].expand(4, n), atol=1e-5, rtol=0
        )
        torch.testing.assert_close(adv[:, n:], a_reason[:, None].expand(4, len(tail)))


def _zscore(r: torch.Tensor) -> torch.Tensor:
    """One group, docs/methods/grpo.md: unbiased std, eps 1e-6, all-equal -> 0."""
    std = r.std()
    return (r - r.mean()) / (std + 1e-6) if std > 0 else torch.zeros_like(r)


def test_uniform_weights_are_the_mask_and_accept_the_context(tapo_tokenizer):
    batch = _batch(tapo_tokenizer, [[5, 6], [5]], group_size=2, width=3)
    context = WeightContext(generator=torch.Generator().manual_seed(0))
    weights, metrics = TOKEN_WEIGHT_STRATEGIES["uniform"].compute(
        {"name": "uniform"}, batch, None, context
    )
    assert torch.equal(weights, batch.completion_mask)
    assert weights is not batch.completion_mask
    assert metrics == {}


def test_weighted_reward_and_the_sign_conflict_rate():
    rewards = {"translation": torch.tensor([1.0, 0.0]), "reasoning": torch.tensor([0.0, 1.0])}
    torch.testing.assert_close(
        weighted_reward(rewards, {"translation": 2.0, "reasoning": 1.0}), torch.tensor([2.0, 1.0])
    )
    # zscore of the sum (1, 1) is (0, 0): both rows' non-zero segment advantages conflict.
    assert SignConflictRate("translation", "reasoning")(rewards, 2) == {
        "adv/sign_conflict_rate": 1.0
    }
    assert SignConflictRate("chrf", "reasoning")(rewards, 2) == {}


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({"name": "grpo", "alpha": 0.5}, "alpha"),
        ({"name": "tapo", "alpha": 1.5}, "advantage.alpha"),
        ({"name": "tapo", "alpha": -0.1}, "advantage.alpha"),
        ({"name": "tapo", "beta": 0.1}, "beta"),
    ],
)
def test_strategy_options_are_validated(spec, key):
    with pytest.raises(ConfigError, match=key):
        ADVANTAGE_STRATEGIES[spec["name"]].validate(spec, GRPOConfig())


def test_tapo_names_the_rewards_it_reads():
    names = ADVANTAGE_STRATEGIES["tapo"].reward_names
    assert names({"name": "tapo"}) == {"translation", "reasoning"}
    assert names({"name": "tapo", "translation_reward": "comet"}) == {"comet", "reasoning"}
    assert ADVANTAGE_STRATEGIES["grpo"].reward_names({"name": "grpo"}) == set()
