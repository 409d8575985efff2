"""HICRA (creditflow.algorithms.hicra, docs/methods/hicra.md): hand-computed cases from the
paper's rule ``A + alpha |A|`` on planning tokens, a slow reference loop on random batches,
and the strategy in a GRPO run. No peer's code serves as the reference: the one public
implementation read (TRL's HICRATrainer at commit 4915fb2) writes its amplification into a
copy (``advantages[group][mask] *= ...`` indexes twice) and leaves the advantages as they were;
the test below shows that indexing twice writes nothing."""

import pytest
import torch

from creditflow.algorithms import entropy_threshold, hicra_advantages, strategic_gram_mask
from creditflow.testing import check_advantage_strategy
from creditflow.training.strategies import ADVANTAGE_STRATEGIES
from tests.training.helpers import make_trainer


def _reference(advantages, entropy, mask, group_size, alpha, top, planning=None, longer_only=True):
    """Token by token, as the paper and the authors' code describe it."""
    out = advantages.clone()
    B, T = advantages.shape
    for start in range(0, B, group_size):
        rows = range(start, start + group_size)
        lengths = {b: int(mask[b].sum()) for b in rows}
        mean_adv = {b: float((advantages[b] * mask[b]).sum()) / max(lengths[b], 1) for b in rows}
        if not any(mean_adv[b] > 0 for b in rows):
            continue
        mean_length = sum(lengths.values()) / group_size
        for b in rows:
            valid = sorted(float(entropy[b, t]) for t in range(T) if mask[b, t])
            cut = valid[min(max(int((1 - top) * len(valid)), 0), len(valid) - 1)] if valid else 0
            for t in range(T):
                if not mask[b, t]:
                    continue
                longer = lengths[b] > mean_length or not longer_only
                high = mean_adv[b] > 0 and longer and entropy[b, t] > cut
                if high or (planning is not None and planning[b, t]):
                    a = float(advantages[b, t])
                    out[b, t] = a + alpha * abs(a)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("with_planning", [False, True])
@pytest.mark.parametrize("longer_only", [True, False])
def test_equals_the_slow_reference_loop(seed, with_planning, longer_only):
    g = torch.Generator().manual_seed(seed)
    B, T, G = 12, 9, 4
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    per_completion = torch.randn(B, generator=g)
    per_completion[:G] = -per_completion[:G].abs()  # one group with no correct completion
    advantages = per_completion[:, None] * mask
    entropy = torch.rand(B, T, generator=g) * mask
    planning = (torch.rand(B, T, generator=g) < 0.2) & mask.bool() if with_planning else None
    got, amplified = hicra_advantages(
        advantages, entropy, mask, G, 0.3, 0.3, planning, longer_only=longer_only
    )
    expected = _reference(advantages, entropy, mask, G, 0.3, 0.3, planning, longer_only)
    torch.testing.assert_close(got, expected)
    assert torch.equal(amplified, (got != advantages))  # nonzero advantages here
    assert not amplified[:G].any()  # no correct completion: the group is left alone


def test_planning_tokens_soften_a_wrong_completions_penalty():
    # A group of two: row 0 correct (A = +1), row 1 wrong (A = -1); token 1 of each row is a
    # planning token; all entropies tie, so no token is high-entropy.
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    entropy = torch.full((2, 3), 0.5)
    planning = torch.tensor([[False, True, False], [False, True, False]])
    got, _ = hicra_advantages(adv, entropy, torch.ones(2, 3), 2, alpha=0.2, planning=planning)
    torch.testing.assert_close(got, torch.tensor([[1.0, 1.2, 1.0], [-1.0, -0.8, -1.0]]))


def test_completions_of_one_length_are_amplified_only_without_the_length_filter():
    adv = torch.tensor([[1.0] * 5, [-1.0] * 5])
    entropy = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.7], [0.9, 0.1, 0.2, 0.3, 0.4]])
    mask = torch.ones(2, 5)
    unchanged, _ = hicra_advantages(adv, entropy, mask, 2)  # none is longer than the mean
    assert torch.equal(unchanged, adv)
    got, _ = hicra_advantages(adv, entropy, mask, 2, longer_only=False)
    torch.testing.assert_close(got[0], torch.tensor([1.0, 1.2, 1.0, 1.0, 1.0]))
    assert torch.equal(got[1], adv[1])  # the wrong completion's high-entropy token is not


def test_the_entropy_threshold_and_the_gram_finder_by_hand():
    # 10 valid tokens, top 0.3: index int(0.7 * 10) = 7 of the sorted values -> 0.7, so the
    # tokens above it are the top two (the authors' threshold, kept as they compute it).
    entropy = torch.arange(10.0)[None] / 10
    assert float(entropy_threshold(entropy, torch.ones(1, 10), 0.3)) == pytest.approx(0.7)
    ids = torch.tensor([[3, 4, 3, 4, 5], [4, 3, 9, 9, 9]])
    found = strategic_gram_mask(ids, [[3, 4], [9, 9, 9]])
    assert found.tolist() == [[True] * 4 + [False], [False, False, True, True, True]]


def test_indexing_twice_writes_into_a_copy():
    # Why TRL's HICRATrainer (commit 4915fb2) cannot serve as a reference: its update has the
    # form below, and the tensor it means to change stays as it was.
    advantages = torch.ones(4, 3)
    group = torch.tensor([True, True, False, False])
    chosen = torch.tensor([[True, False, True], [False, False, True]])
    advantages[group][chosen] *= 1.2
    assert torch.equal(advantages, torch.ones(4, 3))


def test_hicra_keeps_the_strategy_contract_and_trains(make_model, tapo_tokenizer, tapo_prompts):
    spec = {"name": "hicra", "alpha": 0.2, "strategic_grams": ["Tom has"]}
    check_advantage_strategy(ADVANTAGE_STRATEGIES["hicra"], spec)
    trainer = make_trainer(make_model(), tapo_tokenizer, tapo_prompts, advantage={"name": "hicra"})
    assert trainer.needs_entropy  # the rollout computes the entropy HICRA reads
    history = trainer.train().history
    assert all(0 <= h["adv/hicra_amplified"] <= 1 for h in history)
