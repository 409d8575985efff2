import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from creditflow.chain.expmodel.losses import pairwise_preference_loss


def test_pairwise_preference_loss_hand_computed():
    s_pos, s_neg = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0])
    # -mean(log sigmoid(2), log sigmoid(0)) = mean(ln(1 + e^-2), ln 2);
    # centring: mean(2^2, 0^2) = 2 -> + 0.1 * 2
    expected = (math.log1p(math.exp(-2)) + math.log(2)) / 2 + 0.2
    assert_close(pairwise_preference_loss(s_pos, s_neg, lam=0.1), torch.tensor(expected))


def test_pairwise_preference_loss_matches_loop_and_pushes_apart():
    generator = torch.Generator().manual_seed(3)
    s_pos = torch.randn(7, generator=generator, dtype=torch.float64, requires_grad=True)
    s_neg = torch.randn(7, generator=generator, dtype=torch.float64)
    loss = pairwise_preference_loss(s_pos, s_neg, lam=0.05)
    expected = (
        sum(
            -F.logsigmoid(torch.tensor(p - n)).item() + 0.05 * (p + n) ** 2
            for p, n in zip(s_pos.tolist(), s_neg.tolist(), strict=True)
        )
        / 7
    )
    assert loss.item() == pytest.approx(expected)
    # without the centring term the gradient raises every preferred score
    pairwise_preference_loss(s_pos, s_neg, lam=0.0).backward()
    assert (s_pos.grad < 0).all()


def test_pairwise_preference_loss_rejects_bad_input():
    with pytest.raises(ValueError, match="one shape"):
        pairwise_preference_loss(torch.zeros(2), torch.zeros(3), 0.1)
    with pytest.raises(ValueError, match="N = 0"):
        pairwise_preference_loss(torch.zeros(0), torch.zeros(0), 0.1)
    with pytest.raises(ValueError, match="lam"):
        pairwise_preference_loss(torch.zeros(2), torch.zeros(2), -0.1)
    with pytest.raises(ValueError, match=r"\(N,\)"):
        pairwise_preference_loss(torch.zeros(2, 2), torch.zeros(2, 2), 0.1)
