"""Control strategies and the entropy-fraction selections, on hand-made rollout batches
(docs/methods/controls.md)."""

# The VL fixtures are imported from the rollout tests and requested by name as parameters.
# ruff: noqa: F811

import math

import pytest
import torch

from creditflow.algorithms import group_zscore, shuffle_group_advantages
from creditflow.errors import ConfigError
from creditflow.rollout import RolloutBatch
from creditflow.training import ADVANTAGE_STRATEGIES, TOKEN_WEIGHT_STRATEGIES, GRPOConfig
from creditflow.training.grpo import GRPOTrainer
from creditflow.training.grpo_runs import check_comparison_params, grpo_policy
from creditflow.training.seeding import step_seed
from creditflow.training.strategies import (
    WeightContext,
    token_weight_strategy,
    validate_strategies,
)
from tests.rollout.test_vision_policy import (  # noqa: F401 - fixtures are found by name
    make_vl_model,
    tor_tasks,
    vl_processor,
    vl_prompts,
)
from tests.training.helpers import length_reward, make_trainer

A = 1 / math.sqrt(2)  # zscore of (1, 0): mean 0.5, unbiased std sqrt(0.5) -> (+-0.5 / 0.7071)


def _batch(lengths: list[int], group_size: int, width: int, entropy=None) -> RolloutBatch:
    """Completions of the given lengths (right-padded to ``width``); ids are irrelevant."""
    B = len(lengths)
    mask = (torch.arange(width) < torch.tensor(lengths)[:, None]).float()  # (B, T)
    return RolloutBatch(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.long),
        completion_ids=torch.ones(B, width, dtype=torch.long),
        completion_mask=mask,
        old_logp=torch.zeros(B, width),
        completion_texts=["x"] * B,
        prompt_index=torch.arange(B) // group_size,
        group_size=group_size,
        entropy=entropy,
    )


def _context(seed: int = 0) -> WeightContext:
    return WeightContext(generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- shuffled advantages
def test_shuffle_moves_every_group_to_another_group():
    # 3 groups of 2 with advantages (1, -1 | 2, -2 | 3, -3): a cyclic derangement of the
    # groups, so each group holds another group's pair, in its row order; the multiset and
    # each group's zero sum are kept.
    adv = torch.tensor([1.0, -1.0, 2.0, -2.0, 3.0, -3.0])
    for seed in range(6):
        out = shuffle_group_advantages(adv, 2, torch.Generator().manual_seed(seed)).view(3, 2)
        sources = [int(row[0]) for row in out]  # group g+1 holds (g+1, -(g+1))
        assert sorted(sources) == [1, 2, 3]
        assert all(source != g + 1 for g, source in enumerate(sources))
        torch.testing.assert_close(out[:, 1], -out[:, 0])


def test_shuffle_is_seeded_and_needs_two_groups():
    adv = torch.arange(8.0)
    first = shuffle_group_advantages(adv, 2, torch.Generator().manual_seed(3))
    again = shuffle_group_advantages(adv, 2, torch.Generator().manual_seed(3))
    assert torch.equal(first, again)
    with pytest.raises(ValueError, match="at least 2 groups"):
        shuffle_group_advantages(torch.tensor([1.0, -1.0]), 2)


def test_shuffled_advantages_give_each_group_the_other_groups_grpo_advantage():
    # Rewards (1, 0 | 0, 0 | 0, 1): GRPO gives (+A, -A | 0, 0 | -A, +A). With 3 groups every
    # cyclic derangement sends group 0's (+A, -A) to a group that is not group 0.
    batch = _batch([2, 1, 2, 2, 1, 3], group_size=2, width=3)
    rewards = {"a": torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0])}
    config = GRPOConfig(group_size=2, prompts_per_step=3, rewards={"a": 1.0})
    torch.manual_seed(0)
    adv, metrics = ADVANTAGE_STRATEGIES["shuffled_advantages"].compute(
        {"name": "shuffled_advantages"}, rewards, batch, None, config
    )
    per_row = adv[:, 0]  # every row has a valid first token
    torch.testing.assert_close(adv, per_row[:, None] * batch.completion_mask)
    grpo = group_zscore(rewards["a"], 2)
    assert not torch.allclose(per_row.view(3, 2)[0], grpo.view(3, 2)[0])
    assert sorted(per_row.tolist()) == pytest.approx(sorted(grpo.tolist()), abs=1e-5)
    assert metrics["adv/abs_mean"] == pytest.approx(4 * A / 6, abs=1e-5)


def test_shuffled_advantages_reject_a_single_prompt():
    config = GRPOConfig(prompts_per_step=1, advantage={"name": "shuffled_advantages"})
    with pytest.raises(ConfigError, match="prompts_per_step >= 2"):
        validate_strategies(config)


# ---------------------------------------------------------------- random tokens
# A batch of 3 completions (4, 2 and 3 valid tokens) whose ToR selection is known. ToR at its
# defaults takes ceil(0.3 * 9) = 3 tokens by entropy and 3 by visual sensitivity.
TOR_ENTROPY = torch.tensor(
    [
        [0.9, 0.8, 0.7, 0.1],  # the top 3 entropies: (0, 0), (0, 1), (0, 2)
        [0.2, 0.3, 0.0, 0.0],
        [0.4, 0.5, 0.6, 0.0],
    ]
)
# old_logp is 0, so the sensitivity |old_logp - no_image| is |NO_IMAGE|; the top 3 are
# (0, 1), (1, 1), (2, 2).
NO_IMAGE = -torch.tensor(
    [
        [0.00, 0.90, 0.05, 0.01],
        [0.02, 0.80, 0.00, 0.00],
        [0.03, 0.04, 0.70, 0.00],
    ]
)
# ToR weighs the union: 3 tokens of completion 0, 1 of completion 1, 1 of completion 2.
TOR_SELECTED = torch.tensor(
    [[True, True, True, False], [False, True, False, False], [False, False, True, False]]
)


class FixedNoImagePolicy:
    """A policy whose log-probs without the image are ``NO_IMAGE``."""

    def no_image_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        return NO_IMAGE.clone()  # (B, T)


def _tor_batch() -> RolloutBatch:
    return _batch([4, 2, 3], group_size=3, width=4, entropy=TOR_ENTROPY)


def test_the_hand_built_batch_has_the_tor_selection_it_says():
    weights, _ = TOKEN_WEIGHT_STRATEGIES["tor"].compute(
        {"name": "tor"}, _tor_batch(), FixedNoImagePolicy(), _context()
    )
    assert torch.equal(weights != 0, TOR_SELECTED)


def test_random_tokens_select_tors_count_in_each_completion_at_random():
    # Per completion ToR selects 3 of 4, 1 of 2 and 1 of 3 tokens; random_tokens selects as
    # many, each valid token of completion i with probability count_i / n_valid_i: 3/4, 1/2,
    # 1/3 (binomial s.d. over 600 draws at most 0.021), and never a padding token.
    batch, policy = _tor_batch(), FixedNoImagePolicy()
    strategy = TOKEN_WEIGHT_STRATEGIES["random_tokens"]
    valid = batch.completion_mask.bool()
    draws = [
        strategy.compute({"name": "random_tokens"}, batch, policy, _context(s)) for s in range(600)
    ]
    for weights, metrics in draws:
        assert set(weights.unique().tolist()) <= {0.0, 1.0}
        assert weights.sum(1).tolist() == TOR_SELECTED.sum(1).tolist() == [3, 1, 1]
        assert float(weights[~valid].abs().sum()) == 0.0
        assert metrics["control/selected_frac"] == pytest.approx(5 / 9)
        overlap = int(((weights != 0) & TOR_SELECTED).sum()) / 5
        assert metrics["control/tor_overlap_frac"] == pytest.approx(overlap)
    frequency = sum(w for w, _ in draws) / len(draws)
    expected = torch.tensor([3 / 4, 1 / 2, 1 / 3])[:, None] * batch.completion_mask
    assert (frequency - expected)[valid].abs().max() < 0.08
    # ToR's own choice is one draw in 4 * 2 * 3 = 24: not what the control picks in general.
    same = sum(torch.equal(w != 0, TOR_SELECTED) for w, _ in draws)
    assert 0 < same < 0.1 * len(draws)


def test_random_tokens_are_seeded():
    batch, policy, spec = _tor_batch(), FixedNoImagePolicy(), {"name": "random_tokens"}
    strategy = TOKEN_WEIGHT_STRATEGIES["random_tokens"]
    same = [strategy.compute(spec, batch, policy, _context(7))[0] for _ in range(2)]
    assert torch.equal(*same)
    others = [strategy.compute(spec, batch, policy, _context(s))[0] for s in range(8)]
    assert any(not torch.equal(others[0], w) for w in others[1:])


def test_random_tokens_with_a_fraction_select_ceil_fraction_of_the_batch():
    # 2 + 3 + 4 = 9 valid tokens; fraction 0.46 -> ceil(4.14) = 5 selected, weight 1 each;
    # no entropy, no log-probs and no policy needed.
    batch = _batch([2, 3, 4], group_size=3, width=4)
    weights, metrics = TOKEN_WEIGHT_STRATEGIES["random_tokens"].compute(
        {"name": "random_tokens", "fraction": 0.46}, batch, None, _context()
    )
    assert set(weights.unique().tolist()) <= {0.0, 1.0}
    assert int(weights.sum()) == 5
    assert float((weights * (1 - batch.completion_mask)).sum()) == 0.0
    assert metrics["control/selected_frac"] == pytest.approx(5 / 9)
    half, _ = TOKEN_WEIGHT_STRATEGIES["random_tokens"].compute(
        {"name": "random_tokens", "fraction": 0.5}, batch, None, _context()
    )
    assert int(half.sum()) == 5  # ceil(4.5)


def test_random_tokens_with_a_fraction_are_uniform_and_seeded():
    # Over 400 seeds each of the 6 valid tokens is chosen ceil(0.5 * 6) / 6 = 1/2 of the time
    # (binomial s.d. 0.025); the same seed chooses the same tokens.
    batch = _batch([4, 2], group_size=2, width=4)
    strategy, spec = (
        TOKEN_WEIGHT_STRATEGIES["random_tokens"],
        {"name": "random_tokens", "fraction": 0.5},
    )
    counts = sum(strategy.compute(spec, batch, None, _context(s))[0] for s in range(400))
    valid = batch.completion_mask.bool()
    assert (counts[valid] / 400 - 0.5).abs().max() < 0.1
    same = [strategy.compute(spec, batch, None, _context(7))[0] for _ in range(2)]
    assert torch.equal(*same)


@pytest.mark.parametrize("fraction", [-0.1, 1.5, "half", True, None])
def test_random_tokens_reject_a_bad_fraction(fraction):
    config = GRPOConfig(token_weights={"name": "random_tokens", "fraction": fraction})
    with pytest.raises(ConfigError, match="fraction"):
        validate_strategies(config)


def test_random_tokens_ask_for_tors_signals_only_without_a_fraction():
    default = token_weight_strategy(GRPOConfig(token_weights={"name": "random_tokens"}))
    assert default.needs_entropy and default.needs_rollout_logprobs and default.needs_image_pass
    fixed = token_weight_strategy(
        GRPOConfig(token_weights={"name": "random_tokens", "fraction": 0.46})
    )
    assert not (fixed.needs_entropy or fixed.needs_rollout_logprobs or fixed.needs_image_pass)


def test_random_tokens_without_a_fraction_need_a_policy_with_an_image_pass(
    make_model, tapo_tokenizer, tapo_prompts
):
    """A text-only policy has no no-image pass: the trainer says so before training, and so
    does the check of a tapo comparison, before its first node."""
    with pytest.raises(ConfigError, match="no_image_logprobs.*token_weights.fraction"):
        make_trainer(
            make_model(), tapo_tokenizer, tapo_prompts, token_weights={"name": "random_tokens"}
        )
    params = {
        "grpo": {"rewards": {"translation": 1.0}},
        "sft": {},
        "reward_functions": ["translation"],
        "strategies": {"random": {"token_weights": {"name": "random_tokens"}}},
    }
    with pytest.raises(ConfigError, match="tapo.strategies.random.*tapo pipeline's policy"):
        check_comparison_params("tapo", params)
    check_comparison_params("tor", params, has_image_pass=True)  # a vision-language policy
    params["strategies"]["random"]["token_weights"]["fraction"] = 0.46
    check_comparison_params("tapo", params)


def test_a_vl_grpo_step_spends_tors_count_on_random_tokens(
    make_vl_model, vl_processor, vl_prompts, monkeypatch
):
    """One step of the tiny VL policy: the trainer's random_tokens weights have, in every
    completion, as many tokens as ToR's weights of that rollout under the step's generator."""
    model = make_vl_model()
    config = GRPOConfig.from_params(
        {
            "steps": 1,
            "prompts_per_step": 2,
            "group_size": 4,
            "max_new_tokens": 8,
            "rewards": {"length": 1.0},
            "warmup_steps": 0,
            "checkpoint_every": 0,
            "log_samples_every": 0,
            "token_weights": {"name": "random_tokens"},
        }
    )
    policy = grpo_policy(model, vl_processor, config)
    trainer = GRPOTrainer(policy, vl_prompts, length_reward, config, progress=False)
    seen = {}
    update = trainer.update

    def recording_update(step, batch, advantages, weights, ref_logp):
        tor, _ = TOKEN_WEIGHT_STRATEGIES["tor"].compute(
            {"name": "tor"},
            batch,
            policy,
            WeightContext(torch.Generator().manual_seed(step_seed(config.seed, step, 1))),
        )
        seen.update(batch=batch, weights=weights, tor=tor)
        return update(step, batch, advantages, weights, ref_logp)

    monkeypatch.setattr(trainer, "update", recording_update)
    metrics = trainer.step(0)
    weights, batch = seen["weights"], seen["batch"]
    assert batch.entropy is not None and batch.old_logp.numel() > 0
    assert torch.equal((weights != 0).sum(1), (seen["tor"] != 0).sum(1))
    assert float(weights[batch.completion_mask == 0].abs().sum()) == 0.0
    assert 0 < metrics["control/selected_frac"] <= 1 and metrics["time/no_image_pass_s"] > 0


# ---------------------------------------------------------------- entropy fractions
ENTROPY = torch.tensor(
    [
        [0.9, 0.1, 0.5, 0.0],  # 3 valid
        [0.3, 0.8, 0.2, 0.7],  # 4 valid
        [0.6, 0.4, 0.0, 0.0],  # 2 valid
    ]
)


def test_high_entropy_20_weights_the_top_fifth_of_the_batch():
    # 9 valid tokens; ceil(0.2 * 9) = 2: the two highest entropies 0.9 and 0.8.
    batch = _batch([3, 4, 2], group_size=3, width=4, entropy=ENTROPY)
    weights, metrics = TOKEN_WEIGHT_STRATEGIES["high_entropy_20"].compute(
        {"name": "high_entropy_20"}, batch, None, _context()
    )
    expected = torch.zeros(3, 4)
    expected[0, 0] = expected[1, 1] = 1.0
    torch.testing.assert_close(weights, expected)
    assert metrics["entropy/selected_frac"] == pytest.approx(2 / 9)
    assert metrics["entropy/entropy_selected"] == pytest.approx(0.85)
    # the other 7: (0.1 + 0.5 + 0.3 + 0.2 + 0.7 + 0.6 + 0.4) / 7 = 2.8 / 7
    assert metrics["entropy/entropy_unselected"] == pytest.approx(0.4)


def test_low_entropy_80_weights_the_bottom_four_fifths():
    # ceil(0.8 * 9) = ceil(7.2) = 8: every valid token but the highest (0.9); the padding
    # (entropy 0.0, lower than any valid one) is never selected.
    batch = _batch([3, 4, 2], group_size=3, width=4, entropy=ENTROPY)
    weights, _ = TOKEN_WEIGHT_STRATEGIES["low_entropy_80"].compute(
        {"name": "low_entropy_80"}, batch, None, _context()
    )
    expected = batch.completion_mask.clone()
    expected[0, 0] = 0.0
    torch.testing.assert_close(weights, expected)


def test_entropy_selections_need_the_entropy_and_take_no_options():
    assert TOKEN_WEIGHT_STRATEGIES["low_entropy_80"].needs_entropy
    with pytest.raises(ValueError, match="entropy"):
        TOKEN_WEIGHT_STRATEGIES["high_entropy_20"].compute(
            {"name": "high_entropy_20"}, _batch([2], 1, 2), None, _context()
        )
    with pytest.raises(ConfigError, match="unknown"):
        validate_strategies(GRPOConfig(token_weights={"name": "low_entropy_80", "fraction": 0.5}))


def test_a_grpo_step_runs_each_control(make_model, tapo_tokenizer, tapo_prompts):
    """One step of the tiny text policy per control (random_tokens with a fraction: a text
    policy has no image pass): the strategy's own metrics are reported."""
    for advantage, weights, key in [
        ("shuffled_advantages", {"name": "uniform"}, "control/own_advantage_corr"),
        ("grpo", {"name": "random_tokens", "fraction": 0.46}, "control/selected_frac"),
        ("grpo", {"name": "low_entropy_80"}, "entropy/selected_frac"),
    ]:
        trainer = make_trainer(
            make_model(),
            tapo_tokenizer,
            tapo_prompts,
            steps=1,
            advantage={"name": advantage},
            token_weights=weights,
        )
        metrics = trainer.train().history[0]
        assert key in metrics and math.isfinite(metrics[key])
