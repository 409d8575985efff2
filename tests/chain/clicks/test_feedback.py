"""Simulated page feedback (chain.clicks.feedback): a hand-computed page, exact vs sampled parity
and the best page by the rearrangement inequality."""

import itertools

import pytest
import torch

from creditflow.chain.clicks.feedback import (
    best_page_value,
    expected_page_feedback,
    sample_page_feedback,
)


def test_expected_feedback_of_a_three_candidate_page_by_hand():
    # Candidates 0, 1, 2 with P(click | examined) 0.2, 0.5, 0.4 and P(long | click) 0.1, 0.6,
    # 0.3; the page shows 1, 2, 0 at position weights 1, 0.5, 0.25:
    #   clicks 1 * 0.5, 0.5 * 0.4, 0.25 * 0.2 = 0.5, 0.2, 0.05 (sum 0.75)
    #   long views 0.5 * 0.6, 0.2 * 0.3, 0.05 * 0.1 = 0.3, 0.06, 0.005.
    clicks, long_views = expected_page_feedback(
        torch.tensor([[1, 2, 0]]),
        torch.tensor([[0.2, 0.5, 0.4]]),
        torch.tensor([[0.1, 0.6, 0.3]]),
        torch.tensor([1.0, 0.5, 0.25]),
    )
    torch.testing.assert_close(clicks, torch.tensor([[0.5, 0.2, 0.05]]))
    torch.testing.assert_close(long_views, torch.tensor([[0.3, 0.06, 0.005]]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_feedback_averages_to_the_expectation(seed):
    g = torch.Generator().manual_seed(seed)
    B, L, draws = 3, 5, 40_000
    click = torch.rand(B, L, generator=g, dtype=torch.float64)
    long_view = torch.rand(B, L, generator=g, dtype=torch.float64)
    rankings = torch.stack([torch.randperm(L, generator=g) for _ in range(B)])
    examination = 1.0 / torch.arange(1, L + 1, dtype=torch.float64)
    lo, hi = 2, 4  # depth uniform on {2, 3, 4}: P(depth > p) = 1, 1, 2/3, 1/3, 0
    exposure = torch.tensor([1.0, 1.0, 2 / 3, 1 / 3, 0.0], dtype=torch.float64)
    expected = expected_page_feedback(rankings, click, long_view, exposure * examination)
    depth = torch.randint(lo, hi + 1, (draws * B,), generator=g)
    uniforms = torch.rand(draws * B, L, 2, generator=g, dtype=torch.float64)
    sampled = sample_page_feedback(
        rankings.repeat(draws, 1),
        click.repeat(draws, 1),
        long_view.repeat(draws, 1),
        examination,
        depth,
        uniforms,
    )
    for mean, exact in zip(sampled, expected, strict=True):
        # Bernoulli means over 40k draws: std <= 0.5 / 200 = 0.0025; 0.012 is ~5 std.
        torch.testing.assert_close(mean.view(draws, B, L).mean(0), exact, atol=0.012, rtol=0)
    clicks, long_views = sampled
    assert (long_views <= clicks).all(), "a long view needs a click"
    assert (clicks[:, -1] == 0).all(), "the last position is never exposed (depth <= 4)"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_best_page_value_is_the_best_permutation(seed):
    g = torch.Generator().manual_seed(seed)
    L = 5
    values = torch.rand(2, L, generator=g, dtype=torch.float64)
    weights = torch.rand(L, generator=g, dtype=torch.float64).sort(descending=True).values
    brute = (
        torch.stack(
            [
                torch.stack(
                    [(weights * row[list(p)]).sum() for p in itertools.permutations(range(L))]
                )
                for row in values
            ]
        )
        .max(dim=1)
        .values
    )
    torch.testing.assert_close(best_page_value(values, weights), brute)


def test_feedback_checks_its_shapes():
    with pytest.raises(ValueError, match="position_weights"):
        expected_page_feedback(
            torch.tensor([[0, 1]]), torch.ones(1, 2), torch.ones(1, 2), torch.ones(3)
        )
    with pytest.raises(ValueError, match="uniforms"):
        sample_page_feedback(
            torch.tensor([[0, 1]]),
            torch.ones(1, 2),
            torch.ones(1, 2),
            torch.ones(2),
            torch.tensor([1]),
            torch.rand(1, 2),
        )
    with pytest.raises(ValueError, match="non-increasing"):
        best_page_value(torch.ones(1, 2), torch.tensor([0.5, 1.0]))
