import math

import pytest
import torch
from torch.testing import assert_close

from creditflow.algorithms import (
    kl_penalty,
    micro_batch_share,
    policy_loss,
    truncated_importance_weights,
)

AGG_MODES = ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


def loop_policy_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    weights,
    clip_low,
    clip_high,
    agg,
    ref_logp,
    beta,
    kl,
    max_len,
):
    """Plain-float GRPO loss, one token at a time (docs/methods/grpo.md)."""
    batch, length = len(logp), len(logp[0])
    max_len = length if max_len is None else max_len

    def token_terms(b, t):
        ratio = math.exp(logp[b][t] - old_logp[b][t])
        adv = advantages[b] if not isinstance(advantages[b], list) else advantages[b][t]
        clipped_ratio = min(max(ratio, 1 - clip_low), 1 + clip_high)
        loss = -min(ratio * adv, clipped_ratio * adv)
        w = 1.0 if weights is None else weights[b][t]
        is_clipped = -clipped_ratio * adv > -ratio * adv
        kl_value = 0.0
        if ref_logp is not None:
            delta = ref_logp[b][t] - logp[b][t]
            kl_value = (math.exp(delta) - delta - 1) if kl == "k3" else -delta
        return w * loss, kl_value, ratio, is_clipped

    def aggregate(index):
        if agg == "seq-mean-token-mean":
            per_seq = []
            for b in range(batch):
                values = [token_terms(b, t)[index] for t in range(length) if mask[b][t]]
                per_seq.append(sum(values) / max(1, len(values)))
            return sum(per_seq) / batch
        values = [
            token_terms(b, t)[index] for b in range(batch) for t in range(length) if mask[b][t]
        ]
        if agg == "token-mean":
            return sum(values) / max(1, len(values))
        return sum(values) / (batch * max_len)

    valid = [(b, t) for b in range(batch) for t in range(length) if mask[b][t]]
    pg_loss = aggregate(0)
    loss = pg_loss + (beta * aggregate(1) if beta > 0 else 0.0)
    metrics = {
        "actor/pg_loss": pg_loss,
        "actor/clip_frac": sum(token_terms(b, t)[3] for b, t in valid) / len(valid),
        "actor/ratio_mean": sum(token_terms(b, t)[2] for b, t in valid) / len(valid),
        "actor/kl": sum(token_terms(b, t)[1] for b, t in valid) / len(valid)
        if ref_logp is not None
        else 0.0,
    }
    return loss, metrics


def hand_case():
    """B = 2, T = 2; ratios (1.5, 0.9 | 0.5, pad), advantages (+1, -1), clip 0.2."""
    old_logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=torch.float64)
    ratios = torch.tensor([[1.5, 0.9], [0.5, 7.0]], dtype=torch.float64)
    logp = old_logp + ratios.log()
    mask = torch.tensor([[1, 1], [1, 0]])
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    return logp, old_logp, advantages, mask


# Per-token losses of hand_case():
#   (0,0) r=1.5, A=+1: -min(1.5, 1.2) = -1.2 (clipped)
#   (0,1) r=0.9, A=+1: -min(0.9, 0.9) = -0.9
#   (1,0) r=0.5, A=-1: -min(-0.5, -0.8) = 0.8 (clipped); (1,1) is padding
@pytest.mark.parametrize(
    ("agg", "max_len", "expected"),
    [
        # mean(( -1.2 - 0.9) / 2, 0.8 / 1) = mean(-1.05, 0.8)
        ("seq-mean-token-mean", None, -0.125),
        # (-1.2 - 0.9 + 0.8) / 3
        ("token-mean", None, -1.3 / 3),
        # (-1.3) / (B * T) = -1.3 / 4, and / (2 * 5) with max_len = 5
        ("seq-mean-token-sum-norm", None, -0.325),
        ("seq-mean-token-sum-norm", 5, -0.13),
    ],
)
def test_policy_loss_hand_computed(agg, max_len, expected):
    logp, old_logp, advantages, mask = hand_case()
    loss, metrics = policy_loss(logp, old_logp, advantages, mask, agg=agg, max_len=max_len)
    assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    assert metrics["actor/pg_loss"] == pytest.approx(expected)
    assert metrics["actor/clip_frac"] == pytest.approx(2 / 3)  # (0,0) and (1,0)
    assert metrics["actor/ratio_mean"] == pytest.approx((1.5 + 0.9 + 0.5) / 3)
    assert metrics["actor/kl"] == 0.0


def test_policy_loss_hand_computed_weights_and_asymmetric_clip():
    logp, old_logp, advantages, mask = hand_case()
    weights = torch.tensor([[1.0, 0.0], [0.5, 9.0]], dtype=torch.float64)
    # clip_high 0.28: (0,0) -> -1.28; weighted: -1.28 * 1, -0.9 * 0, 0.8 * 0.5 (pad ignored)
    # seq-mean-token-mean: mean(-1.28 / 2, 0.4 / 1) = mean(-0.64, 0.4) = -0.12;
    # the 1/|o_i| still counts the zero-weight token (docs/methods/tor.md)
    loss, _ = policy_loss(logp, old_logp, advantages, mask, weights=weights, clip_high=0.28)
    assert_close(loss, torch.tensor(-0.12, dtype=torch.float64))


def test_policy_loss_hand_computed_kl():
    logp, old_logp, advantages, mask = hand_case()
    ref_logp = logp - 1.0
    # k3 with ref - logp = -1: e^-1 + 1 - 1 = e^-1 on every token; k1 = 1
    # token-mean: -1.3 / 3 + 0.1 * e^-1
    loss, metrics = policy_loss(
        logp, old_logp, advantages, mask, agg="token-mean", ref_logp=ref_logp, beta=0.1
    )
    assert_close(loss, torch.tensor(-1.3 / 3 + 0.1 * math.exp(-1), dtype=torch.float64))
    assert metrics["actor/kl"] == pytest.approx(math.exp(-1))
    assert metrics["actor/pg_loss"] == pytest.approx(-1.3 / 3)
    loss, metrics = policy_loss(
        logp, old_logp, advantages, mask, agg="token-mean", ref_logp=ref_logp, beta=0.1, kl="k1"
    )
    assert_close(loss, torch.tensor(-1.3 / 3 + 0.1, dtype=torch.float64))
    assert metrics["actor/kl"] == pytest.approx(1.0)
    # beta = 0 with ref_logp: KL reported, not added
    loss, metrics = policy_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp)
    assert_close(loss, torch.tensor(-0.125, dtype=torch.float64))
    assert metrics["actor/kl"] == pytest.approx(math.exp(-1))


def test_policy_loss_accepts_token_level_advantages():
    logp, old_logp, advantages, mask = hand_case()
    per_token = advantages[:, None].expand(2, 2).clone()
    loss_seq, _ = policy_loss(logp, old_logp, advantages, mask)
    loss_tok, _ = policy_loss(logp, old_logp, per_token, mask)
    assert_close(loss_seq, loss_tok)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("use_weights", [False, True])
@pytest.mark.parametrize(("beta", "kl"), [(0.0, "k3"), (0.05, "k3"), (0.2, "k1")])
def test_policy_loss_matches_loop(seed, agg, use_weights, beta, kl):
    generator = torch.Generator().manual_seed(seed)
    batch, length = 4, 6
    old_logp = -torch.rand(batch, length, generator=generator, dtype=torch.float64) * 3
    logp = old_logp + 0.4 * torch.randn(batch, length, generator=generator, dtype=torch.float64)
    ref_logp = old_logp + 0.3 * torch.randn(batch, length, generator=generator, dtype=torch.float64)
    mask = torch.rand(batch, length, generator=generator) < 0.7
    mask[-1] = False  # a sequence with no tokens: contributes 0, never NaN
    token_level = seed % 2 == 1
    shape = (batch, length) if token_level else (batch,)
    advantages = torch.randn(*shape, generator=generator, dtype=torch.float64)
    weights = (
        torch.rand(batch, length, generator=generator, dtype=torch.float64) * 1.5
        if use_weights
        else None
    )
    max_len = 9 if agg == "seq-mean-token-sum-norm" and seed == 2 else None
    kwargs = {"clip_low": 0.2, "clip_high": 0.28, "agg": agg, "beta": beta, "kl": kl}
    with_ref = beta > 0 or seed == 0
    loss, metrics = policy_loss(
        logp, old_logp, advantages, mask, weights,
        ref_logp=ref_logp if with_ref else None, max_len=max_len, **kwargs,
    )  # fmt: skip
    expected_loss, expected_metrics = loop_policy_loss(
        logp.tolist(), old_logp.tolist(), advantages.tolist(), mask.int().tolist(),
        weights=None if weights is None else weights.tolist(),
        ref_logp=ref_logp.tolist() if with_ref else None,
        max_len=max_len, **kwargs,
    )  # fmt: skip
    assert float(loss) == pytest.approx(expected_loss, abs=1e-12)
    assert metrics == pytest.approx(expected_metrics, abs=1e-12)


def test_policy_loss_gradient_only_on_valid_tokens():
    logp, old_logp, advantages, mask = hand_case()
    logp = logp.clone().requires_grad_(True)
    weights = torch.tensor([[1.0, 2.0], [1.0, 1.0]], dtype=torch.float64)
    loss, _ = policy_loss(logp, old_logp, advantages, mask, weights, agg="token-mean")
    loss.backward()
    # d/dlogp of w * (-A r) / 3 = -w A r / 3 where unclipped: (0,1): -2 * 1 * 0.9 / 3 = -0.6;
    # clipped tokens (0,0), (1,0) have zero slope; the padded (1,1) must get exactly 0.
    expected = torch.tensor([[0.0, -0.6], [0.0, 0.0]], dtype=torch.float64)
    assert_close(logp.grad, expected)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_policy_loss_gradient_with_kl_is_zero_on_padding(agg):
    generator = torch.Generator().manual_seed(0)
    old_logp = -torch.rand(3, 5, generator=generator)
    logp = (old_logp + 0.1).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    loss, _ = policy_loss(
        logp, old_logp, torch.randn(3, generator=generator), mask,
        agg=agg, ref_logp=old_logp - 0.5, beta=0.1,
    )  # fmt: skip
    loss.backward()
    assert (logp.grad[mask == 0] == 0).all()
    assert (logp.grad[mask == 1] != 0).all()  # ratio 1.105 < 1.2: unclipped, KL slope too


def test_policy_loss_rejects_unknown_names():
    logp, old_logp, advantages, mask = hand_case()
    valid_aggs = (
        "valid: seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm, token-mean"
    )
    with pytest.raises(ValueError, match=f"unknown agg 'sum'; {valid_aggs}"):
        policy_loss(logp, old_logp, advantages, mask, agg="sum")
    with pytest.raises(ValueError, match="unknown kl estimator 'k2'; valid: k1, k3"):
        policy_loss(logp, old_logp, advantages, mask, kl="k2")
    with pytest.raises(ValueError, match="valid: k1, k3"):
        kl_penalty(logp, old_logp, kind="mse")


def test_policy_loss_rejects_bad_arguments():
    logp, old_logp, advantages, mask = hand_case()
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(logp, old_logp, advantages, mask, beta=0.1)
    with pytest.raises(ValueError, match=r"advantages must have shape \(B,\) or \(B, T\)"):
        policy_loss(logp, old_logp, torch.zeros(3), mask)
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(logp, old_logp, advantages, torch.ones(2, 3))
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(logp, old_logp, advantages, mask, weights=torch.ones(2))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        policy_loss(logp[0], old_logp[0], advantages, mask[0])
    with pytest.raises(ValueError, match="beta must be >= 0"):
        policy_loss(logp, old_logp, advantages, mask, beta=-1.0, ref_logp=logp)
    with pytest.raises(ValueError, match="max_len"):
        policy_loss(logp, old_logp, advantages, mask, agg="seq-mean-token-sum-norm", max_len=0)


# --- kl_penalty ---------------------------------------------------------------------------


def test_micro_batch_share_hand_computed():
    # Rows with 3, 1, 2 and 0 valid tokens (6 in all), split in halves.
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    first, second = mask[:2], mask[2:]
    for agg in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert micro_batch_share(agg, first, mask) == micro_batch_share(agg, second, mask) == 0.5
    # token-mean: 4 of the 6 tokens, then 2; an all-padding minibatch shares nothing.
    assert micro_batch_share("token-mean", first, mask) == pytest.approx(4 / 6)
    assert micro_batch_share("token-mean", second, mask) == pytest.approx(2 / 6)
    empty = torch.zeros(4, 3)
    assert micro_batch_share("token-mean", empty[:2], empty) == 0.0
    with pytest.raises(ValueError, match="agg"):
        micro_batch_share("sum", first, mask)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("micro", [1, 2, 3])
def test_micro_batches_weighted_by_share_give_the_full_loss_and_gradient(seed, agg, micro):
    """Gradient accumulation: sum_k share_k * policy_loss(rows_k) == policy_loss(all rows),
    and so is the gradient, for every aggregation, with weights and a KL term; masks with
    empty rows and rows of different lengths (the normalisers differ per micro-batch)."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 5
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()  # (B, T)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    old_logp = logp.detach() + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref_logp = logp.detach() + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    advantages = torch.randn(B, generator=g, dtype=torch.float64)
    weights = torch.rand(B, T, generator=g, dtype=torch.float64)
    options = {"agg": agg, "beta": 0.05, "kl": "k3", "max_len": 7}

    def loss_of(rows):
        return policy_loss(
            logp[rows],
            old_logp[rows],
            advantages[rows],
            mask[rows],
            weights=weights[rows],
            ref_logp=ref_logp[rows],
            **options,
        )[0]

    full = loss_of(slice(None))
    (full_grad,) = torch.autograd.grad(full, logp)
    parts = [slice(s, s + micro) for s in range(0, B, micro)]
    accumulated = sum(micro_batch_share(agg, mask[rows], mask) * loss_of(rows) for rows in parts)
    (accumulated_grad,) = torch.autograd.grad(accumulated, logp)
    assert_close(accumulated, full, atol=1e-12, rtol=1e-12)
    assert_close(accumulated_grad, full_grad, atol=1e-12, rtol=1e-12)


def test_kl_penalty_hand_computed():
    logp = torch.tensor([[0.0, -1.0, -2.0]])
    ref_logp = torch.tensor([[-1.0, -1.0, -1.0]])
    # k1 = logp - ref: (1, 0, -1)
    assert_close(kl_penalty(logp, ref_logp, "k1"), torch.tensor([[1.0, 0.0, -1.0]]))
    # k3 with d = ref - logp = (-1, 0, 1): e^d - d - 1 = (e^-1, 0, e - 2)
    expected = torch.tensor([[math.exp(-1), 0.0, math.e - 2]])
    assert_close(kl_penalty(logp, ref_logp), expected)


def test_kl_penalty_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(3, 2))


def test_truncated_importance_weights_by_hand():
    """exp(trainer - sampler) per token, truncated at the cap; padding and NaN count as 1."""
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, 0.0, -1.0]])
    sampler = torch.tensor([[-1.5, -1.0, float("nan")], [-1.0, -2.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    expected = torch.tensor(
        [
            [math.exp(0.5), math.exp(-1.0), 1.0],  # NaN sampler log-prob: no correction
            [math.exp(-2.0), 3.0, 1.0],  # exp(2) = 7.39 truncated at 3; padding 1
        ]
    )
    torch.testing.assert_close(
        truncated_importance_weights(trainer, sampler, mask, cap=3.0), expected
    )
    with pytest.raises(ValueError, match="cap must be >= 1"):
        truncated_importance_weights(trainer, sampler, mask, cap=0.5)
