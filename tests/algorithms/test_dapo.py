"""DAPO's overlong punishment and dynamic-sampling group filter (algorithms.dapo)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from creditflow.algorithms import constant_groups, overlong_penalty


def test_overlong_penalty_hand_computed():
    # L_max = 20, L_cache = 4: 0 up to 16 tokens, then (16 - len) / 4: 17 -> -0.25, 19 -> -0.75,
    # 20 -> -1; times the factor 0.5.
    lengths = torch.tensor([0, 16, 17, 19, 20])
    assert overlong_penalty(lengths, max_len=20, buffer=4).tolist() == [0, 0, -0.25, -0.75, -1]
    assert overlong_penalty(lengths, 20, 4, factor=0.5).tolist() == [0, 0, -0.125, -0.375, -0.5]
    # A buffer as long as the limit punishes from the first token on.
    assert overlong_penalty(torch.tensor([0.0, 5.0, 10.0]), 10, 10).tolist() == [0, -0.5, -1]


def test_overlong_penalty_equals_trls_soft_overlong_punishment():
    rewards = pytest.importorskip("trl.rewards")
    punish = rewards.get_soft_overlong_punishment(max_completion_len=30, soft_punish_cache=7)
    lengths = list(range(31))
    expected = punish([[1] * n for n in lengths])
    got = overlong_penalty(torch.tensor(lengths), max_len=30, buffer=7)
    assert got.tolist() == pytest.approx(expected, abs=1e-7)


def test_overlong_penalty_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"buffer must be in \[1, max_len = 8\], got 9"):
        overlong_penalty(torch.tensor([3]), max_len=8, buffer=9)
    with pytest.raises(ValueError, match="factor must be >= 0"):
        overlong_penalty(torch.tensor([3]), max_len=8, buffer=2, factor=-1.0)
    with pytest.raises(ValueError, match=r"\(B,\)"):
        overlong_penalty(torch.ones(2, 2), max_len=8, buffer=2)


def test_constant_groups_hand_computed():
    # G = 3: (1,1,1) all solved, (0,1,0) mixed, (0,0,0) none solved, (1,0,1) mixed.
    success = torch.tensor([1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 1])
    assert constant_groups(success, 3).tolist() == [True, False, True, False]
    assert constant_groups(success.bool(), 12).tolist() == [False]
    with pytest.raises(ValueError, match=r"group_size \(5\) must divide"):
        constant_groups(success, 5)


@given(st.lists(st.lists(st.booleans(), min_size=2, max_size=2), min_size=1, max_size=8))
def test_a_group_is_constant_iff_all_its_successes_are_equal(groups):
    flat = torch.tensor([s for group in groups for s in group])
    expected = [len(set(group)) == 1 for group in groups]
    assert constant_groups(flat, 2).tolist() == expected
