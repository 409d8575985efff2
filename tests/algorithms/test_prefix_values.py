"""The math of Monte Carlo credit (creditflow.algorithms.prefix_values) and the recovery
scores (creditflow.reporting.recovery), by hand."""

import math

import pytest
import torch
from scipy.stats import spearmanr

from creditflow.algorithms.prefix_values import (
    every_n_boundaries,
    known_prefixes,
    segment_boundaries,
    span_credits,
)
from creditflow.reporting.recovery import recovery_scores

NAN = float("nan")


def test_every_token_credit_is_the_step_in_value():
    # V = 0.2, 0.6, 0.6, 1.0 after 0..3 tokens: credits 0.4, 0, 0.4; padding gets 0.
    values = torch.tensor([[0.2, 0.6, 0.6, 1.0, NAN]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    boundaries = every_n_boundaries(mask, 1)
    assert boundaries.tolist() == [[True, True, True, False]]
    credit = span_credits(values, boundaries, mask)
    torch.testing.assert_close(credit, torch.tensor([[0.4, 0.0, 0.4, 0.0]]))
    torch.testing.assert_close(credit.sum(), torch.tensor(1.0 - 0.2))


def test_a_span_shares_its_change_in_value_equally():
    # every 3 of 5 tokens: spans [0, 3) and [3, 5); V(0) = 0.5, V(3) = 0.8, V(5) = 0.2:
    # 0.3 / 3 = 0.1 on the first three tokens, -0.6 / 2 = -0.3 on the last two.
    mask = torch.ones(1, 5)
    boundaries = every_n_boundaries(mask, 3)
    assert boundaries.int().tolist() == [[0, 0, 1, 0, 1]]
    assert known_prefixes(boundaries).int().tolist() == [[1, 0, 0, 1, 0, 1]]
    values = torch.tensor([[0.5, NAN, NAN, 0.8, NAN, 0.2]])
    credit = span_credits(values, boundaries, mask)
    torch.testing.assert_close(credit, torch.tensor([[0.1, 0.1, 0.1, -0.3, -0.3]]))


def test_segments_end_where_the_label_changes_and_rows_are_independent():
    segments = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    boundaries = segment_boundaries(segments, mask)
    assert boundaries.int().tolist() == [[0, 1, 0, 1], [1, 1, 0, 0]]
    values = torch.tensor([[0.0, NAN, 1.0, NAN, 0.0], [0.5, 1.0, 0.0, NAN, NAN]])
    credit = span_credits(values, boundaries, mask)
    # row 0: +1 over 2 tokens, -1 over 2; row 1: +0.5, -1 on its two tokens.
    torch.testing.assert_close(credit, torch.tensor([[0.5, 0.5, -0.5, -0.5], [0.5, -1.0, 0, 0]]))


def test_recovery_scores_average_over_completions():
    deserved = torch.tensor([[1.0, 0.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    # Row 0: decisive tokens 0 and 3 (|d| = 1) get |a| 2 and 1, free ones 1 and 0:
    # pairs (2>1, 2>0, 1=1 half, 1>0) -> 3.5 / 4. Row 1 deserves nothing: no AUC, no rho.
    assigned = torch.tensor([[2.0, 1.0, 0.0, -1.0], [5.0, 1.0, 2.0, 9.0]])
    scores = recovery_scores(assigned, deserved, mask)
    assert scores["credit/recovery_auc"] == 0.875
    assert scores["credit/recovery_completions"] == 1.0
    # Row 0's ranks: a (4, 3, 2, 1), d (4, 2.5, 2.5, 1): centred (1.5, .5, -.5, -1.5) and
    # (1.5, 0, 0, -1.5): rho = 4.5 / sqrt(5 * 4.5) = 0.9487.
    assert scores["credit/recovery_spearman"] == pytest.approx(4.5 / math.sqrt(5 * 4.5))
    # Pooled: the 7 valid tokens of both (credited) rows at once, the masked 9 left out.
    pooled = spearmanr([2, 1, 0, -1, 5, 1, 2], [1, 0, 0, -1, 0, 0, 0]).statistic
    assert scores["credit/recovery_pooled_spearman"] == pytest.approx(pooled)
    perfect = recovery_scores(deserved * 3, deserved, mask)
    assert perfect["credit/recovery_auc"] == 1.0
    assert perfect["credit/recovery_spearman"] == pytest.approx(1.0)


def test_tokens_between_high_and_zero_take_no_part_in_the_auc():
    # |d| 0.3 is neither >= 0.5 nor <= 0.1 of the largest (1): the AUC compares token 0 with
    # token 2 only, and token 1's large assigned credit does not count against it.
    deserved = torch.tensor([[1.0, 0.3, 0.0]])
    scores = recovery_scores(torch.tensor([[1.0, 5.0, 0.0]]), deserved, torch.ones(1, 3))
    assert scores["credit/recovery_auc"] == 1.0
