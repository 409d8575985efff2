"""The GSPO and CISPO variants of ``policy_loss`` (docs/methods/loss_types.md): hand-computed
values and gradients, a plain-float loop reference, and the tables by name."""

import math

import pytest
import torch
from torch.testing import assert_close

from creditflow.algorithms import AGGREGATIONS, IMPORTANCE_LEVELS, SURROGATES, policy_loss
from creditflow.config.grpo import AGG_MODES, IMPORTANCE_LEVEL_NAMES, SURROGATE_NAMES

F64 = torch.float64


def test_the_configs_names_are_the_algorithms_tables():
    assert set(IMPORTANCE_LEVEL_NAMES) == set(IMPORTANCE_LEVELS)
    assert set(SURROGATE_NAMES) == set(SURROGATES)
    assert set(AGG_MODES) == set(AGGREGATIONS)


def test_sequence_level_hand_computed_value_and_gradient():
    # Row 0: log-ratios (0.2, -0.1) -> s = exp(0.05) = 1.051271, inside [0.8, 1.2]; A = +1.
    # Row 1: log-ratios (0.5, pad) -> s = exp(0.5) = 1.648721 > 1.2: clipped; A = +1.
    # Per token: row 0 -s = -1.051271 on both tokens, row 1 -1.2 on its token.
    # seq-mean-token-mean: mean(-1.051271, -1.2) = -1.1256355.
    # Gradient (GSPO-token): row 0 token t: -A s / |o_0| / B = -1.051271 / 2 / 2 = -0.262818;
    # row 1 clipped: 0; padding 0.
    old_logp = torch.tensor([[-1.0, -2.0], [-1.0, -4.0]], dtype=F64)
    logp = (old_logp + torch.tensor([[0.2, -0.1], [0.5, 3.0]], dtype=F64)).requires_grad_(True)
    mask = torch.tensor([[1, 1], [1, 0]])
    advantages = torch.tensor([1.0, 1.0], dtype=F64)
    loss, metrics = policy_loss(logp, old_logp, advantages, mask, importance_level="sequence")
    s0 = math.exp(0.05)
    assert loss.item() == pytest.approx((-s0 - 1.2) / 2, abs=1e-12)
    loss.backward()
    assert_close(logp.grad, torch.tensor([[-s0 / 4, -s0 / 4], [0.0, 0.0]], dtype=F64))
    # Every valid token carries its sequence's ratio: (s0 + s0 + e^0.5) / 3; one of 3 clipped.
    assert metrics["actor/ratio_mean"] == pytest.approx((2 * s0 + math.exp(0.5)) / 3)
    assert metrics["actor/clip_frac"] == pytest.approx(1 / 3)


def test_sequence_level_ratio_ignores_padding_and_weights():
    """The sequence ratio is over the valid tokens only (whatever padding holds), and a token
    weight scales that token's term, not the ratio."""
    old_logp = torch.tensor([[-1.0, -1.0, -1.0]], dtype=F64)
    logp = torch.tensor([[-0.9, -1.1, 50.0]], dtype=F64)  # padding holds a huge log-ratio
    mask = torch.tensor([[1, 1, 0]])
    weights = torch.tensor([[2.0, 0.0, 7.0]], dtype=F64)
    # s = exp(mean(0.1, -0.1)) = 1; token terms -A s w = (-2, 0); mean over 2 tokens: -1.
    loss, metrics = policy_loss(
        logp, old_logp, torch.tensor([1.0], dtype=F64), mask, weights, importance_level="sequence"
    )
    assert loss.item() == pytest.approx(-1.0, abs=1e-12)
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0)


def test_cispo_hand_computed_value_and_gradient():
    # Ratios e^0.5 = 1.648721 (capped at 1.5) and e^-1 = 0.367879; A = 2; logp = (-1, -2).
    # Per token -sg(min(r, 1.5)) A logp: -1.5 * 2 * -1 = 3; -0.367879 * 2 * -2 = 1.471518.
    # token-mean: (3 + 1.471518) / 2; gradient -sg(min(r, 1.5)) A / 2 = (-1.5, -0.367879).
    logp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    old_logp = torch.tensor([[-1.5, -1.0]], dtype=F64)
    r1 = math.exp(-1)
    loss, metrics = policy_loss(
        logp,
        old_logp,
        torch.tensor([2.0], dtype=F64),
        torch.ones(1, 2),
        agg="token-mean",
        surrogate="cispo",
        max_ratio=1.5,
    )
    assert loss.item() == pytest.approx((3 + 4 * r1) / 2, abs=1e-12)
    loss.backward()
    assert_close(logp.grad, torch.tensor([[-1.5, -r1]], dtype=F64))
    assert metrics["actor/clip_frac"] == pytest.approx(0.5)  # the capped token


def test_cispo_keeps_the_gradient_of_tokens_the_clip_would_drop():
    # r = 1.5 with A = +1: the clipped surrogate has zero slope there; CISPO does not.
    logp = torch.tensor([[math.log(1.5)]], dtype=F64, requires_grad=True)
    args = (torch.zeros(1, 1, dtype=F64), torch.tensor([1.0], dtype=F64), torch.ones(1, 1))
    policy_loss(logp, *args)[0].backward()
    assert logp.grad.item() == 0.0
    logp.grad = None
    policy_loss(logp, *args, surrogate="cispo")[0].backward()
    assert logp.grad.item() == pytest.approx(-1.5)  # -min(1.5, 5) * A


def loop_variant_loss(logp, old_logp, advantages, mask, weights, level, surrogate, agg):
    """Plain floats: each token's ratio is its own (token) or its row's exp(mean log-ratio)
    (sequence); the per-token loss is the clipped surrogate (clip 0.2 / 0.28) or CISPO's
    -min(r, 2.0) A logp; then the aggregation."""
    batch, length = len(logp), len(logp[0])
    rows = []
    for b in range(batch):
        valid = [t for t in range(length) if mask[b][t]]
        mean_log = sum(logp[b][t] - old_logp[b][t] for t in valid) / max(1, len(valid))
        terms = []
        for t in valid:
            r = math.exp(mean_log if level == "sequence" else logp[b][t] - old_logp[b][t])
            a = advantages[b][t]
            if surrogate == "clip":
                term = -min(r * a, min(max(r, 0.8), 1.28) * a)
            else:
                term = -min(r, 2.0) * a * logp[b][t]
            terms.append(weights[b][t] * term)
        rows.append(terms)
    if agg == "seq-mean-token-mean":
        return sum(sum(r) / max(1, len(r)) for r in rows) / batch
    if agg == "token-mean":
        return sum(map(sum, rows)) / max(1, sum(map(len, rows)))
    if agg == "seq-mean-token-sum":
        return sum(map(sum, rows)) / batch
    return sum(map(sum, rows)) / (batch * length)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("surrogate", ["clip", "cispo"])
@pytest.mark.parametrize("agg", AGG_MODES)
def test_variants_match_the_loop(seed, level, surrogate, agg):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    old_logp = -3 * torch.rand(B, T, generator=g, dtype=F64)
    logp = old_logp + 0.5 * torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[-1] = False  # no tokens: contributes 0, never NaN
    advantages = torch.randn(B, T, generator=g, dtype=F64)
    weights = torch.rand(B, T, generator=g, dtype=F64) * 1.5
    loss, _ = policy_loss(
        logp, old_logp, advantages, mask, weights,
        clip_high=0.28, agg=agg, importance_level=level, surrogate=surrogate, max_ratio=2.0,
    )  # fmt: skip
    expected = loop_variant_loss(
        logp.tolist(), old_logp.tolist(), advantages.tolist(), mask.int().tolist(),
        weights.tolist(), level, surrogate, agg,
    )  # fmt: skip
    assert loss.item() == pytest.approx(expected, abs=1e-12)


def test_sequence_level_equals_token_level_on_one_token_completions():
    g = torch.Generator().manual_seed(0)
    old_logp = -torch.rand(5, 1, generator=g, dtype=F64)
    logp = (old_logp + 0.4 * torch.randn(5, 1, generator=g, dtype=F64)).requires_grad_(True)
    args = (old_logp, torch.randn(5, generator=g, dtype=F64), torch.ones(5, 1))
    token, _ = policy_loss(logp, *args)
    (grad_token,) = torch.autograd.grad(token, logp)
    sequence, _ = policy_loss(logp, *args, importance_level="sequence")
    (grad_sequence,) = torch.autograd.grad(sequence, logp)
    assert_close(sequence, token)
    assert_close(grad_sequence, grad_token)


def test_unknown_variant_names_and_bad_cap_are_refused():
    logp, mask = torch.zeros(1, 2), torch.ones(1, 2)
    args = (logp, logp, torch.zeros(1), mask)
    with pytest.raises(ValueError, match="unknown importance_level 'seq'; valid: sequence, token"):
        policy_loss(*args, importance_level="seq")
    with pytest.raises(ValueError, match="unknown surrogate 'ppo'; valid: cispo, clip"):
        policy_loss(*args, surrogate="ppo")
    with pytest.raises(ValueError, match="max_ratio must be > 0"):
        policy_loss(*args, surrogate="cispo", max_ratio=0.0)
