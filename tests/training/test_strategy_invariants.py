"""Invariants between strategies: where one method's knobs make it another method, the two give
the same advantages or weights, checked through the engine's strategy tables on random batches
over several seeds.

- ToR with both fractions 1 and both gammas 1 selects every token: with ``overlap: reasoning``
  every weight is 1, uniform GRPO's weights exactly; with the default ``overlap: sum`` every
  token is in both sets and weighs gamma_r + gamma_p = 2 (twice uniform GRPO's loss).
- TAPO with alpha 0 is GRPO on the reasoning reward.
- TAPO where no token is in the translation segment is GRPO on the reasoning reward, for any
  alpha. Through text that cannot happen: the segment runs through the token that completes
  ``</translation>`` (docs/methods/tapo.md), so even ``<translation></translation>`` leaves the
  tag's tokens in it, and they keep alpha * A_trans + (1 - alpha) * A_reason.
- The page reward with beta 0 is GRPO on R_old: exactly at alpha 1; at another alpha the
  z-score differs only by its eps (1e-6 added to the std, scaled by alpha), and without the std
  (Dr. GRPO) the advantages are alpha times R_old's.
"""

from __future__ import annotations

import types

import pytest
import torch

from creditflow.algorithms import segment_token_advantages, tapo_advantages
from creditflow.chain.reranker.page_reward import LoggedClicks, PageReward
from creditflow.rollout import RolloutBatch
from creditflow.testing import CLOSE, OPEN, PAD, ToyPolicy, toy_batch, toy_rewards
from creditflow.training import ADVANTAGE_STRATEGIES, TOKEN_WEIGHT_STRATEGIES, GRPOConfig
from creditflow.training.strategies import WeightContext

SEEDS = range(5)
GRPO, TAPO = ADVANTAGE_STRATEGIES["grpo"], ADVANTAGE_STRATEGIES["tapo"]


def _grpo_on(reward: str, rewards, batch, scale_by_std: bool = True) -> torch.Tensor:
    spec = {"name": "grpo", "scale_by_std": scale_by_std}
    config = GRPOConfig(group_size=batch.group_size, advantage=spec, rewards={reward: 1.0})
    return GRPO.compute(spec, rewards, batch, None, config)[0]


def _tapo(alpha: float, rewards, batch, scale_by_std: bool = True) -> torch.Tensor:
    spec = {"name": "tapo", "alpha": alpha, "scale_by_std": scale_by_std}
    config = GRPOConfig(group_size=batch.group_size, advantage=spec)
    return TAPO.compute(spec, rewards, batch, ToyPolicy(), config)[0]


# ---------------------------------------------------------------- ToR -> uniform
@pytest.mark.parametrize("seed", SEEDS)
def test_tor_selecting_every_token_at_weight_one_is_uniform_grpo(seed):
    batch = toy_batch(seed=seed)
    policy, uniform = ToyPolicy(), TOKEN_WEIGHT_STRATEGIES["uniform"]
    context = WeightContext(torch.Generator().manual_seed(seed))
    expected, _ = uniform.compute({"name": "uniform"}, batch, policy, context)
    everything = {"alpha_r": 1.0, "alpha_p": 1.0, "gamma_r": 1.0, "gamma_p": 1.0}
    for overlap, factor in (("reasoning", 1.0), ("sum", 2.0)):
        spec = {"name": "tor", **everything, "overlap": overlap}
        tor = TOKEN_WEIGHT_STRATEGIES["tor"]
        tor.validate(spec, GRPOConfig())
        weights, metrics = tor.compute(spec, batch, policy, context)
        assert torch.equal(weights, factor * expected), overlap
        assert metrics["tor/selected_frac"] == 1.0 and metrics["tor/overlap_frac"] == 1.0


# ---------------------------------------------------------------- TAPO -> GRPO on reasoning
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale_by_std", [True, False])
def test_tapo_with_alpha_zero_is_grpo_on_the_reasoning_reward(seed, scale_by_std):
    batch = toy_batch(seed=seed)
    rewards = toy_rewards(batch, ["reasoning", "translation"], seed)
    expected = _grpo_on("reasoning", rewards, batch, scale_by_std)
    assert torch.equal(_tapo(0.0, rewards, batch, scale_by_std), expected)
    # Not a coincidence of the rewards: alpha > 0 moves the translation tokens.
    assert not torch.equal(_tapo(0.5, rewards, batch, scale_by_std), expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_tapo_without_translation_tokens_is_grpo_on_the_reasoning_reward(seed):
    batch = toy_batch(seed=seed)
    rewards = toy_rewards(batch, ["reasoning", "translation"], seed)
    expected = _grpo_on("reasoning", rewards, batch)
    # The strategy's own composition (strategies.tapo): segment advantages spread over segment
    # ids, here with every valid token in the reasoning segment (1) and padding -1.
    segment_ids = batch.completion_mask.long() * 2 - 1  # (B, T)
    for alpha in (0.0, 0.3, 1.0):
        a_trans, a_reason = tapo_advantages(
            rewards["translation"], rewards["reasoning"], batch.group_size, alpha
        )
        token_adv = segment_token_advantages(torch.stack([a_trans, a_reason], 1), segment_ids)
        assert torch.equal(token_adv, expected), alpha


def test_tapo_on_an_empty_translation_keeps_the_tag_tokens_in_the_translation_segment():
    # Completions "<translation></translation> ..." (G = 2): the closing tag is the segment's
    # last token, so the two tag tokens carry the mix, every later token A_reason.
    ids = torch.tensor([[OPEN, CLOSE, 4, 5, 6], [OPEN, CLOSE, 7, PAD, PAD]])
    mask = (ids != PAD).float()
    batch = RolloutBatch(
        prompt_ids=torch.zeros(2, 1, dtype=torch.long),
        prompt_mask=torch.ones(2, 1, dtype=torch.long),
        completion_ids=ids,
        completion_mask=mask,
        old_logp=torch.empty(0),
        completion_texts=ToyPolicy().tokenizer.batch_decode(ids),
        prompt_index=torch.zeros(2, dtype=torch.long),
        group_size=2,
    )
    rewards = {"translation": torch.tensor([1.0, 0.0]), "reasoning": torch.tensor([0.0, 1.0])}
    grpo, tapo = _grpo_on("reasoning", rewards, batch), _tapo(0.5, rewards, batch)
    assert torch.equal(tapo[:, 2:], grpo[:, 2:])  # the reasoning tokens (and the padding)
    a = 2**-0.5  # zscore of (1, 0) and (0, 1): +-0.7071; the tags get 0.5 * (+-a) + 0.5 * (-+a)
    torch.testing.assert_close(tapo[:, :2], torch.zeros(2, 2))
    torch.testing.assert_close(grpo[:, :2], torch.tensor([[-a, -a], [a, a]]))


# ---------------------------------------------------------------- page reward -> GRPO on R_old
def _page_rewards(seed: int, alpha: float) -> tuple[dict[str, torch.Tensor], RolloutBatch]:
    """The page reward (beta 0) of random rankings of 3 sessions x 4 candidates, G = 4."""
    g = torch.Generator().manual_seed(seed)
    n, length, group = 3, 4, 4
    clicks = (torch.rand(n, length, generator=g) < 0.4).float()
    reward = PageReward(
        LoggedClicks(clicks, k=3), torch.rand(n, length, generator=g), alpha=alpha, beta=0.0, k=3
    )
    rankings = [torch.randperm(length, generator=g).tolist() for _ in range(n * group)]
    texts = [" ".join(map(str, r)) for r in rankings]
    rows = torch.arange(n).repeat_interleave(group)
    batch = types.SimpleNamespace(
        completion_mask=torch.ones(n * group, length), group_size=group, completion_texts=texts
    )
    return reward(texts, rows), batch


@pytest.mark.parametrize("seed", SEEDS)
def test_the_page_reward_without_the_experience_term_is_grpo_on_r_old(seed):
    rewards, batch = _page_rewards(seed, alpha=1.0)
    assert torch.equal(_grpo_on("page", rewards, batch), _grpo_on("r_old", rewards, batch))

    rewards, batch = _page_rewards(seed, alpha=0.9)  # the shipped alpha
    page, r_old = _grpo_on("page", rewards, batch), _grpo_on("r_old", rewards, batch)
    # (0.9 d) / (0.9 s + eps) vs d / (s + eps): equal up to the eps of the z-score (1e-6).
    torch.testing.assert_close(page, r_old, rtol=1e-5, atol=1e-5)
    centred = _grpo_on("page", rewards, batch, False), _grpo_on("r_old", rewards, batch, False)
    torch.testing.assert_close(centred[0], 0.9 * centred[1])
