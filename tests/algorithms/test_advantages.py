import math
import statistics

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from creditflow.algorithms import (
    group_zscore,
    segment_token_advantages,
    sign_conflict_rate,
    tapo_advantages,
)

EPS = 1e-6
SQRT3_HALF = math.sqrt(3) / 2


def loop_zscore(rewards: list[float], group_size: int) -> list[float]:
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        if group_size == 1 or all(r == group[0] for r in group):
            out.extend([0.0] * group_size)
            continue
        mean = sum(group) / group_size
        std = statistics.stdev(group)
        out.extend([(r - mean) / (std + EPS) for r in group])
    return out


def loop_sign_conflict_rate(r_trans, r_reason, group_size):
    a_trans = loop_zscore(r_trans, group_size)
    a_reason = loop_zscore(r_reason, group_size)
    a_traj = loop_zscore([t + r for t, r in zip(r_trans, r_reason, strict=True)], group_size)
    counted = conflicts = 0
    for i in range(len(r_trans)):
        for a_seg in (a_trans[i], a_reason[i]):
            if abs(a_seg) > 1e-8:
                counted += 1
                conflicts += a_seg * a_traj[i] <= 0
    return conflicts / counted if counted else 0.0


def random_rewards(generator, batch):
    # Few distinct values so groups often tie or are constant, as real rewards do.
    r_trans = torch.randint(0, 4, (batch,), generator=generator).double() / 4
    r_reason = torch.randint(0, 2, (batch,), generator=generator).double()
    return r_trans, r_reason


# --- group_zscore -------------------------------------------------------------------------


def test_group_zscore_hand_computed():
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    # group 1: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1 -> (-1, 0, 1) / (1 + eps)
    # group 2: all equal -> exactly 0
    expected = torch.tensor([-1 / (1 + EPS), 0.0, 1 / (1 + EPS), 0.0, 0.0, 0.0])
    assert_close(group_zscore(rewards, group_size=3), expected)


def test_group_zscore_two_samples():
    # mean 0.5, std sqrt((0.25 + 0.25) / 1) = sqrt(0.5) -> +-0.5 / (sqrt(0.5) + eps)
    expected = 0.5 / (math.sqrt(0.5) + EPS)
    assert_close(group_zscore(torch.tensor([1.0, 0.0]), 2), torch.tensor([expected, -expected]))


def test_group_zscore_constant_group_is_exactly_zero():
    # mean(0.1, 0.1, 0.1) is not exactly 0.1 in float32; the result must still be 0.
    adv = group_zscore(torch.full((3,), 0.1), group_size=3)
    assert torch.equal(adv, torch.zeros(3))


def test_group_zscore_group_size_one_gives_zeros():
    assert torch.equal(group_zscore(torch.tensor([0.3, 1.0, -2.0]), 1), torch.zeros(3))


def test_group_zscore_integer_rewards_become_float():
    adv = group_zscore(torch.tensor([0, 1]), 2)
    assert adv.is_floating_point()
    assert adv[1] > 0 > adv[0]


def test_group_zscore_rejects_indivisible_batch():
    with pytest.raises(ValueError, match="divisible by group_size"):
        group_zscore(torch.zeros(5), group_size=2)


def test_group_zscore_rejects_bad_shape():
    with pytest.raises(ValueError, match=r"\(B,\)"):
        group_zscore(torch.zeros(2, 2), group_size=2)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
def test_group_zscore_matches_loop(seed, group_size):
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(group_size * 6, generator=generator, dtype=torch.float64)
    rewards[:group_size] = 0.7  # one constant group
    expected = torch.tensor(loop_zscore(rewards.tolist(), group_size), dtype=torch.float64)
    assert_close(group_zscore(rewards, group_size), expected)


@given(
    st.integers(2, 8).flatmap(
        lambda g: st.tuples(
            st.just(g),
            st.lists(st.floats(-100, 100), min_size=g, max_size=4 * g).map(
                lambda xs, g=g: xs[: len(xs) - len(xs) % g]
            ),
        )
    )
)
def test_group_advantages_sum_to_zero(case):
    group_size, rewards = case
    adv = group_zscore(torch.tensor(rewards, dtype=torch.float64), group_size)
    assert not torch.isnan(adv).any()
    assert_close(
        adv.view(-1, group_size).sum(dim=1),
        torch.zeros(len(rewards) // group_size, dtype=torch.float64),
        atol=1e-8,
        rtol=0,
    )


@given(st.floats(-1e6, 1e6), st.integers(1, 12), st.integers(1, 4))
def test_equal_rewards_give_zero(value, group_size, groups):
    adv = group_zscore(torch.full((group_size * groups,), value), group_size)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_group_zscore_without_std_only_centres_hand_case():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.52, 0.50, 0.7, 0.7])
    adv = group_zscore(rewards, group_size=4, scale_by_std=False)
    # group 1: mean 0.25 -> (0.75, -0.25, -0.25, -0.25); group 2: mean 2.42 / 4 = 0.605 ->
    # (-0.085, -0.105, 0.095, 0.095): a one-in-four solve outweighs the chrF-like noise.
    # With the std (0.5 and sqrt(0.0363 / 3) = 0.11) the largest advantages would be 1.5
    # and 0.95: almost the same weight for the noise.
    assert_close(adv[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    assert_close(adv[4:], torch.tensor([-0.085, -0.105, 0.095, 0.095]))
    assert torch.equal(
        group_zscore(torch.full((4,), 0.3), 2, scale_by_std=False), torch.zeros(4)
    ), "constant groups stay exactly 0"


@pytest.mark.parametrize("seed", range(3))
def test_group_zscore_without_std_matches_loop(seed):
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(24, generator=generator, dtype=torch.float64)
    expected = []
    for start in range(0, 24, 6):
        group = rewards[start : start + 6].tolist()
        expected += [r - sum(group) / 6 for r in group]
    assert_close(
        group_zscore(rewards, 6, scale_by_std=False), torch.tensor(expected, dtype=torch.float64)
    )


# --- tapo_advantages ----------------------------------------------------------------------


def test_tapo_advantages_hand_computed():
    r_trans = torch.tensor([0.0, 0.0, 1.0, 1.0])
    r_reason = torch.tensor([1.0, 0.0, 1.0, 0.0])
    # both groups: mean 0.5, std sqrt(4 * 0.25 / 3) = 1/sqrt(3) -> z = +-0.5*sqrt(3) = +-0.866
    z = 0.5 / (1 / math.sqrt(3) + EPS)
    a_trans = torch.tensor([-z, -z, z, z])
    a_reason = torch.tensor([z, -z, z, -z])
    adv_translation, adv_reasoning = tapo_advantages(r_trans, r_reason, group_size=4, alpha=0.25)
    # 0.25 * A_trans + 0.75 * A_reason = z * (0.5, -1, 1, -0.5)
    assert_close(adv_translation, 0.25 * a_trans + 0.75 * a_reason)
    assert_close(adv_translation, torch.tensor([0.5, -1.0, 1.0, -0.5]) * z)
    assert_close(adv_reasoning, a_reason)
    assert z == pytest.approx(SQRT3_HALF, rel=1e-5)


def test_tapo_advantages_without_std_hand_computed():
    r_trans = torch.tensor([0.5, 0.7])
    r_reason = torch.tensor([1.0, 0.0])
    # centred: A_trans = (-0.1, 0.1), A_reason = (0.5, -0.5); alpha 0.5 -> (0.2, -0.2)
    adv_translation, adv_reasoning = tapo_advantages(r_trans, r_reason, 2, 0.5, scale_by_std=False)
    assert_close(adv_translation, torch.tensor([0.2, -0.2]))
    assert_close(adv_reasoning, torch.tensor([0.5, -0.5]))


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_tapo_alpha_extremes(alpha):
    r_trans, r_reason = torch.tensor([0.2, 0.9]), torch.tensor([1.0, 0.0])
    adv_translation, adv_reasoning = tapo_advantages(r_trans, r_reason, 2, alpha)
    expected = group_zscore(r_trans, 2) if alpha == 1.0 else group_zscore(r_reason, 2)
    assert_close(adv_translation, expected)
    assert_close(adv_reasoning, group_zscore(r_reason, 2))


@pytest.mark.parametrize("seed", range(5))
def test_tapo_advantages_match_loop(seed):
    generator = torch.Generator().manual_seed(seed)
    r_trans, r_reason = random_rewards(generator, 24)
    alpha = float(torch.rand((), generator=generator))
    a_trans = loop_zscore(r_trans.tolist(), 6)
    a_reason = loop_zscore(r_reason.tolist(), 6)
    expected_trans = [alpha * t + (1 - alpha) * r for t, r in zip(a_trans, a_reason, strict=True)]
    adv_translation, adv_reasoning = tapo_advantages(r_trans, r_reason, 6, alpha)
    assert_close(adv_translation, torch.tensor(expected_trans, dtype=torch.float64))
    assert_close(adv_reasoning, torch.tensor(a_reason, dtype=torch.float64))


@pytest.mark.parametrize("alpha", [-0.1, 1.5])
def test_tapo_rejects_alpha_outside_unit_interval(alpha):
    with pytest.raises(ValueError, match=r"alpha must lie in \[0, 1\]"):
        tapo_advantages(torch.zeros(2), torch.zeros(2), 2, alpha)


def test_tapo_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        tapo_advantages(torch.zeros(4), torch.zeros(2), 2, 0.5)


# --- segment_token_advantages -------------------------------------------------------------


def test_segment_token_advantages_hand_computed():
    segment_adv = torch.tensor([[0.5, -1.0], [2.0, 3.0]])
    segment_ids = torch.tensor([[0, 0, 1, -1], [0, 0, 0, 0]])
    # row 0: translation, translation, reasoning, padding; row 1: never reached reasoning
    expected = torch.tensor([[0.5, 0.5, -1.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    assert_close(segment_token_advantages(segment_adv, segment_ids), expected)


def test_segment_token_advantages_carry_gradient():
    segment_adv = torch.tensor([[0.5, -1.0]], requires_grad=True)
    segment_token_advantages(segment_adv, torch.tensor([[0, 1, 1, -1]])).sum().backward()
    # one translation token, two reasoning tokens, padding contributes nothing
    assert_close(segment_adv.grad, torch.tensor([[1.0, 2.0]]))


@pytest.mark.parametrize("bad_id", [2, -2])
def test_segment_token_advantages_rejects_out_of_range_ids(bad_id):
    with pytest.raises(ValueError, match=r"segment ids must lie in \[0, 1\]"):
        segment_token_advantages(torch.zeros(1, 2), torch.tensor([[0, bad_id]]))


def test_segment_token_advantages_rejects_batch_mismatch():
    with pytest.raises(ValueError, match="disagree on B"):
        segment_token_advantages(torch.zeros(2, 2), torch.zeros(3, 4, dtype=torch.long))


# --- sign_conflict_rate -------------------------------------------------------------------


def test_sign_conflict_rate_hand_computed():
    r_trans = torch.tensor([0.0, 0.0, 1.0, 1.0])
    r_reason = torch.tensor([1.0, 0.0, 1.0, 0.0])
    # A_trans signs (-, -, +, +), A_reason signs (+, -, +, -);
    # sum (1, 0, 2, 1) has mean 1, so the trajectory advantage is (0, -, +, 0).
    # Products <= 0: completion 0 and 3 in both segments -> 4 conflicts of 8 pairs.
    assert sign_conflict_rate(r_trans, r_reason, 4) == pytest.approx(0.5)


def test_sign_conflict_rate_all_conflicting():
    # r_trans + r_reason is constant -> trajectory advantage 0 -> all 4 pairs conflict
    assert sign_conflict_rate(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), 2) == 1.0


def test_sign_conflict_rate_ignores_zero_segment_advantages():
    # A_trans = 0 (constant) is not counted; A_reason agrees with the trajectory: 0 of 2
    rate = sign_conflict_rate(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), 2)
    assert rate == 0.0


def test_sign_conflict_rate_without_signal_is_zero():
    assert sign_conflict_rate(torch.ones(4), torch.zeros(4), 2) == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_sign_conflict_rate_matches_loop(seed):
    generator = torch.Generator().manual_seed(seed)
    r_trans, r_reason = random_rewards(generator, 40)
    expected = loop_sign_conflict_rate(r_trans.tolist(), r_reason.tolist(), 5)
    assert sign_conflict_rate(r_trans, r_reason, 5) == pytest.approx(expected)
