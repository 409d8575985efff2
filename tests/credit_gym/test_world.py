"""The gym's world: the oracle credit is exact (checked against brute-force enumeration),
free tokens get oracle credit 0, and the rewards follow their construction."""

from __future__ import annotations

import itertools

import pytest
import torch

from creditflow.tasks.credit_gym import (
    GymKnobs,
    build_world,
    expected_total_reward,
    gym_rewards,
    oracle_credit,
)


def _total(world, family, image, tokens):
    r = gym_rewards(world, family, image, tokens)
    return r["translation"] + r["reasoning"]


@pytest.mark.parametrize("conflict", [0.0, 0.3, 0.5])
def test_oracle_credit_is_the_exact_change_in_expected_reward(conflict):
    # 4 positions over 3 symbols: enumerate all 81 completions of one prompt under a random
    # per-position distribution; E[R | y_t] - E[R] must equal oracle_credit for every token.
    knobs = GymKnobs(decisive_fraction=0.5, conflict=conflict, perception=0.5)
    world = build_world(knobs, seed=3, n_families=1, length=4, vocab_size=3, n_images=2)
    family, image = torch.tensor([0]), torch.tensor([1])
    probs = torch.softmax(torch.randn(1, 4, 3, generator=torch.Generator().manual_seed(0)), -1)
    completions = torch.tensor(list(itertools.product(range(3), repeat=4)))  # (81, 4)
    p_each = probs[0, torch.arange(4), completions].prod(1)  # (81,)
    rewards = _total(world, family.expand(81), image.expand(81), completions)
    expected = (p_each * rewards).sum()
    torch.testing.assert_close(expected_total_reward(world, family, image, probs)[0], expected)
    for y in completions[:20]:
        credit = oracle_credit(world, family, image, y[None], probs)[0]
        for t in range(4):
            given = completions[:, t] == y[t]
            conditional = (p_each[given] * rewards[given]).sum() / p_each[given].sum()
            torch.testing.assert_close(credit[t], conditional - expected)


def test_free_tokens_get_oracle_credit_zero():
    world = build_world(GymKnobs(decisive_fraction=0.2), seed=0)
    family = torch.arange(8)
    tokens = torch.randint(8, (8, 30))
    probs = torch.full((8, 30, 8), 1 / 8)
    credit = oracle_credit(world, family, torch.zeros(8, dtype=torch.long), tokens, probs)
    assert (credit[~world.decisive[family]] == 0).all()
    assert (credit[world.decisive[family]] != 0).all()  # 1[right] - 1/8 is never 0


def test_hand_built_rewards_and_oracle():
    # Two positions, one per segment, both decisive; conflict 0.5: each reward reads its own.
    world = build_world(
        GymKnobs(decisive_fraction=1.0, conflict=0.5, perception=0.0),
        0,
        n_families=1,
        length=2,
        vocab_size=2,
        n_images=1,
    )
    right = world.base[0]
    wrong = 1 - right
    tokens = torch.stack([torch.stack([right[0], wrong[1]])])  # translation right, reasoning wrong
    r = gym_rewards(world, torch.tensor([0]), torch.tensor([0]), tokens)
    assert (float(r["translation"]), float(r["reasoning"])) == (1.0, 0.0)
    probs = torch.tensor([[[0.25, 0.75], [0.5, 0.5]]])
    p_right = probs[0, [0, 1], right]
    credit = oracle_credit(world, torch.tensor([0]), torch.tensor([0]), tokens, probs)[0]
    # w = 1 per segment: right token -> 1 - p(right); wrong -> 0 - p(right)
    torch.testing.assert_close(credit, torch.stack([1 - p_right[0], -p_right[1]]))


def test_perception_tokens_move_with_the_image():
    world = build_world(GymKnobs(perception=1.0), seed=1, n_images=4)
    family = torch.zeros(4, dtype=torch.long)
    rights = world.right_tokens(family, torch.arange(4))
    decisive = world.decisive[0]
    assert (rights[:, decisive] != rights[0, decisive]).any(0).all()


def test_knobs_are_checked():
    with pytest.raises(ValueError, match="conflict"):
        GymKnobs(conflict=0.7)
    with pytest.raises(ValueError, match="decisive_fraction"):
        GymKnobs(decisive_fraction=0.0)
