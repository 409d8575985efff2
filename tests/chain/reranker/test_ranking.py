import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import ndcg_score
from torch.testing import assert_close

from creditflow.chain.reranker.ranking import augmented_target, ndcg_at_k, page_reward, rank_gains

LOG2_3 = math.log2(3)


def loop_ndcg(gains: list[float], k: int, ideal: list[float]) -> float:
    def dcg(values):
        return sum(g / math.log2(j + 1) for j, g in enumerate(values[:k], start=1))

    ideal_dcg = dcg(sorted(ideal, reverse=True))
    return dcg(gains) / ideal_dcg if ideal_dcg > 0 else 0.0


def loop_rank_gains(scores: list[float]) -> list[float]:
    length = len(scores)
    order = sorted(range(length), key=lambda i: (-scores[i], i))
    gains = [0.0] * length
    for rank, i in enumerate(order):
        gains[i] = (length - rank) / length
    return gains


def loop_augmented_target(clicked: list[bool], scores: list[float]) -> list[int]:
    def by_score(items):
        return sorted(items, key=lambda i: (-scores[i], i))

    indices = range(len(scores))
    return by_score([i for i in indices if clicked[i]]) + by_score(
        [i for i in indices if not clicked[i]]
    )


# --- ndcg_at_k ----------------------------------------------------------------------------


def test_ndcg_hand_computed():
    # DCG@2 of (0, 1) = 0/1 + 1/log2(3); ideal (1, 0) -> 1/1
    assert_close(ndcg_at_k(torch.tensor([0.0, 1.0]), k=2), torch.tensor(1 / LOG2_3))
    # k = 1 only sees the first position: 0 / 1
    assert_close(ndcg_at_k(torch.tensor([0.0, 1.0]), k=1), torch.tensor(0.0))


def test_ndcg_textbook_example():
    gains = torch.tensor([3.0, 2.0, 3.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    # DCG = 3 + 2/log2 3 + 3/2 + 0 + 1/log2 6 + 2/log2 7 = 6.861
    dcg = 3 + 2 / LOG2_3 + 3 / 2 + 1 / math.log2(6) + 2 / math.log2(7)
    # ideal (3, 3, 2, 2, 1, 0): 3 + 3/log2 3 + 2/2 + 2/log2 5 + 1/log2 6 = 7.141
    ideal = 3 + 3 / LOG2_3 + 1 + 2 / math.log2(5) + 1 / math.log2(6)
    result = ndcg_at_k(gains, k=6)
    assert_close(result, torch.tensor(dcg / ideal, dtype=torch.float64))
    assert float(result) == pytest.approx(0.961, abs=1e-3)
    # k beyond L counts the whole list
    assert_close(ndcg_at_k(gains, k=50), result)


def test_ndcg_with_separate_ideal_gains_and_batches():
    gains = torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 0.0]])
    ideal = torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]])
    # row 0: (1/log2 3) / (1 + 1/log2 3); row 1: ideal order -> 1; row 2: ideal DCG 0 -> 0
    expected = torch.tensor([(1 / LOG2_3) / (1 + 1 / LOG2_3), 1.0, 0.0])
    assert_close(ndcg_at_k(gains, k=2, ideal_gains=ideal), expected)


@pytest.mark.parametrize("seed", range(5))
def test_ndcg_matches_loop(seed):
    generator = torch.Generator().manual_seed(seed)
    gains = torch.randint(0, 4, (6, 8), generator=generator).double()
    ideal = torch.randint(0, 4, (6, 8), generator=generator).double()
    k = seed + 1
    expected = [loop_ndcg(g, k, i) for g, i in zip(gains.tolist(), ideal.tolist(), strict=True)]
    assert_close(ndcg_at_k(gains, k, ideal), torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("seed", range(6))
def test_ndcg_matches_sklearn(seed):
    generator = torch.Generator().manual_seed(seed)
    length = 3 + seed
    y_true = torch.randint(0, 5, (10, length), generator=generator).double()
    y_score = torch.rand(10, length, generator=generator, dtype=torch.float64)  # no ties
    ranking = y_score.argsort(dim=1, descending=True)
    gains_in_order = y_true.gather(1, ranking)
    for k in (1, 2, length, length + 2):
        ours = ndcg_at_k(gains_in_order, k, ideal_gains=y_true)
        for row in range(10):
            expected = ndcg_score(
                y_true[row : row + 1].numpy(), y_score[row : row + 1].numpy(), k=k
            )
            assert float(ours[row]) == pytest.approx(expected, abs=1e-12)
        assert float(ours.mean()) == pytest.approx(ndcg_score(y_true.numpy(), y_score.numpy(), k=k))


@given(
    st.lists(st.floats(0, 10), min_size=1, max_size=12).filter(lambda xs: max(xs) > 1e-3),
    st.integers(1, 15),
)
def test_ndcg_is_one_for_the_ideal_order(gains, k):
    ideal_order = torch.tensor(sorted(gains, reverse=True), dtype=torch.float64)
    shuffled = torch.tensor(gains, dtype=torch.float64)
    assert float(ndcg_at_k(ideal_order, k, ideal_gains=shuffled)) == pytest.approx(1.0)
    assert 0.0 <= float(ndcg_at_k(shuffled, k)) <= 1.0 + 1e-12


def test_ndcg_rejects_bad_arguments():
    with pytest.raises(ValueError, match="k must be >= 1"):
        ndcg_at_k(torch.ones(3), k=0)
    with pytest.raises(ValueError, match="one shape"):
        ndcg_at_k(torch.ones(3), k=1, ideal_gains=torch.ones(4))
    with pytest.raises(ValueError, match=r"\(\.\.\., L\)"):
        ndcg_at_k(torch.tensor(1.0), k=1)


# --- rank_gains ---------------------------------------------------------------------------


def test_rank_gains_hand_computed():
    # ranks (2, 0, 1) -> (3 - rank) / 3
    assert_close(rank_gains(torch.tensor([0.1, 0.9, 0.5])), torch.tensor([1 / 3, 1.0, 2 / 3]))
    # ties: earlier index ranks first -> ranks (0, 1, 2)
    assert_close(rank_gains(torch.tensor([1.0, 1.0, 0.0])), torch.tensor([1.0, 2 / 3, 1 / 3]))


def test_rank_gains_minmax_hand_computed():
    # (s - 1) / (3 - 1); a constant row -> 0
    scores = torch.tensor([[1.0, 3.0, 2.0], [4.0, 4.0, 4.0]])
    expected = torch.tensor([[0.0, 1.0, 0.5], [0.0, 0.0, 0.0]])
    assert_close(rank_gains(scores, mode="minmax"), expected)


@pytest.mark.parametrize("seed", range(4))
def test_rank_gains_match_loop(seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 5, (5, 7), generator=generator).double()  # with ties
    expected = torch.tensor([loop_rank_gains(row) for row in scores.tolist()], dtype=torch.float64)
    assert_close(rank_gains(scores), expected)


@given(st.lists(st.integers(-3, 3), min_size=1, max_size=15))
def test_rank_gains_ranks_are_a_permutation(scores):
    gains = rank_gains(torch.tensor(scores, dtype=torch.float64))
    length = len(scores)
    ranks = torch.round(length - gains * length).long()
    assert sorted(ranks.tolist()) == list(range(length))
    # a higher score never ranks below a lower one
    for i in range(length):
        for j in range(length):
            if scores[i] > scores[j]:
                assert ranks[i] < ranks[j]


def test_rank_gains_rejects_unknown_mode():
    with pytest.raises(ValueError, match="unknown gain mode 'log'; valid: minmax, rank"):
        rank_gains(torch.ones(3), mode="log")


# --- augmented_target ---------------------------------------------------------------------


def test_augmented_target_hand_computed():
    clicked = torch.tensor([False, True, False, True])
    scores = torch.tensor([0.9, 0.1, 0.5, 0.7])
    # clicked by score: 3 (0.7), 1 (0.1); then the rest: 0 (0.9), 2 (0.5)
    assert augmented_target(clicked, scores).tolist() == [3, 1, 0, 2]
    # all tied: lower index first inside each part
    assert augmented_target(clicked, torch.zeros(4)).tolist() == [1, 3, 0, 2]
    assert augmented_target(clicked, scores).dtype == torch.long


@pytest.mark.parametrize("seed", range(5))
def test_augmented_target_matches_loop(seed):
    generator = torch.Generator().manual_seed(seed)
    clicked = torch.rand(4, 9, generator=generator) < 0.3
    scores = torch.randint(0, 4, (4, 9), generator=generator).float()  # with ties
    expected = [
        loop_augmented_target(c, s) for c, s in zip(clicked.tolist(), scores.tolist(), strict=True)
    ]
    assert augmented_target(clicked, scores).tolist() == expected
    assert augmented_target(clicked[0], scores[0]).tolist() == expected[0]


@given(st.lists(st.tuples(st.booleans(), st.integers(-5, 5)), min_size=1, max_size=15))
def test_augmented_target_is_a_permutation_with_clicked_first(items):
    clicked = torch.tensor([c for c, _ in items])
    scores = torch.tensor([float(s) for _, s in items])
    target = augmented_target(clicked, scores).tolist()
    assert sorted(target) == list(range(len(items)))
    n_clicked = int(clicked.sum())
    assert all(clicked[i] for i in target[:n_clicked])
    for part in (target[:n_clicked], target[n_clicked:]):
        keys = [(-float(scores[i]), i) for i in part]
        assert keys == sorted(keys)


def test_augmented_target_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        augmented_target(torch.zeros(3, dtype=torch.bool), torch.zeros(4))


# --- page_reward --------------------------------------------------------------------------


def test_page_reward_hand_computed():
    rankings = torch.tensor([[2, 0, 1]])
    business = torch.tensor([[1.0, 0.0, 0.0]])  # candidate 0 was clicked
    exp_scores = torch.tensor([[0.2, 0.9, 0.5]])
    # R_old: gains in ranked order (0, 1, 0); DCG@2 = 1/log2 3, ideal 1
    r_old = 1 / LOG2_3
    # exp gains: ranks (2, 0, 1) -> (1/3, 1, 2/3); ranked (2/3, 1/3, 1);
    # DCG@2 = 2/3 + (1/3)/log2 3, ideal (1, 2/3): 1 + (2/3)/log2 3
    r_exp = (2 / 3 + (1 / 3) / LOG2_3) / (1 + (2 / 3) / LOG2_3)
    result = page_reward(rankings, business, exp_scores, alpha=0.5, beta=2.0, k=2)
    assert_close(result, torch.tensor([0.5 * r_old + 2.0 * r_exp]))


@pytest.mark.parametrize("seed", range(4))
def test_page_reward_matches_loop(seed):
    generator = torch.Generator().manual_seed(seed)
    num_lists, length, k = 6, 7, 1 + seed
    rankings = torch.stack([torch.randperm(length, generator=generator) for _ in range(num_lists)])
    business = torch.randint(0, 3, (num_lists, length), generator=generator).double()
    business[0] = 0  # no feedback at all: R_old = 0
    exp_scores = torch.randn(num_lists, length, generator=generator, dtype=torch.float64)
    expected = []
    for perm, gains, scores in zip(
        rankings.tolist(), business.tolist(), exp_scores.tolist(), strict=True
    ):
        exp_gains = loop_rank_gains(scores)
        r_old = loop_ndcg([gains[c] for c in perm], k, gains)
        r_exp = loop_ndcg([exp_gains[c] for c in perm], k, exp_gains)
        expected.append(0.7 * r_old + 0.3 * r_exp)
    result = page_reward(rankings, business, exp_scores, alpha=0.7, beta=0.3, k=k)
    assert_close(result, torch.tensor(expected, dtype=torch.float64))


def test_page_reward_is_maximal_for_the_ideal_ranking():
    exp_scores = torch.tensor([[0.3, 0.8, 0.1, 0.5]])
    ideal = exp_scores.argsort(dim=1, descending=True)
    result = page_reward(ideal, torch.zeros(1, 4), exp_scores, alpha=1.0, beta=1.0, k=3)
    assert_close(result, torch.tensor([1.0]))


def test_page_reward_rejects_bad_rankings():
    gains, scores = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="permutation"):
        page_reward(torch.tensor([[0, 1, 2], [0, 0, 2]]), gains, scores, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="permutation"):
        page_reward(torch.tensor([[0, 1, 3], [0, 1, 2]]), gains, scores, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="integer"):
        page_reward(torch.tensor([[0.0, 1, 2], [0, 1, 2]]), gains, scores, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="one shape"):
        page_reward(torch.tensor([[0, 1, 2]]), gains, scores, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match=r"\(N, L\)"):
        page_reward(torch.tensor([0, 1, 2]), gains[0], scores[0], 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        page_reward(torch.tensor([[0, 1, 2], [2, 1, 0]]), gains, scores, 1.0, 1.0, 0)
