"""Chunked token log-probs against the single-pass log-softmax on random inputs."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from creditflow.algorithms import logprobs, token_logprobs, topp_entropy
from creditflow.algorithms.logprobs import chunk_rows


def _inputs(seed: int, B=3, T=5, H=6, V=11, dtype=torch.float32, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=dtype, requires_grad=True) if bias else None
    ids = torch.randint(V, (B, T), generator=g)
    return hidden, weight, b, ids


def _plain(hidden, weight, bias, ids, temperature):
    """The single pass: every (B, T, V) logit at once."""
    logits = F.linear(hidden, weight, bias) / temperature  # (B, T, V)
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[..., None])[..., 0], logits


def test_hand_computed_case():
    # One position, V = 2, H = 1: logits (w0 h, w1 h) = (2, 0), token 0:
    # log p = 2 - log(e^2 + 1); d/dh = w0 - (p0 w0 + p1 w1) = 1 - p0 = p1 = 1 / (1 + e^2).
    hidden = torch.tensor([[[2.0]]], requires_grad=True)
    weight = torch.tensor([[1.0], [0.0]])
    logp, entropy = token_logprobs(hidden, weight, torch.tensor([[0]]))
    assert entropy is None
    assert_close(logp, torch.tensor([[2 - math.log(math.e**2 + 1)]]))
    logp.sum().backward()
    assert_close(hidden.grad, torch.tensor([[[1 / (1 + math.e**2)]]]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("chunk_size", [1, 4, 7, 15, 100, None])
def test_chunked_equals_single_pass_values_entropy_and_gradients(seed, chunk_size):
    hidden, weight, bias, ids = _inputs(seed)
    temperature = 0.7 if seed % 2 else 1.0
    expected, logits = _plain(hidden, weight, bias, ids, temperature)
    expected_entropy = topp_entropy(logits.detach(), top_p=0.9)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(seed + 10))
    expected_grads = torch.autograd.grad((expected * g).sum(), (hidden, weight, bias))

    logp, entropy = token_logprobs(
        hidden,
        weight,
        ids,
        bias=bias,
        temperature=temperature,
        chunk_size=chunk_size,
        entropy_top_p=0.9,
    )
    assert logp.dtype == torch.float32 and not entropy.requires_grad
    assert_close(logp, expected, atol=1e-6, rtol=1e-6)
    assert_close(entropy, expected_entropy, atol=1e-6, rtol=1e-6)
    grads = torch.autograd.grad((logp * g).sum(), (hidden, weight, bias))
    for name, got, want in zip(("hidden", "weight", "bias"), grads, expected_grads, strict=True):
        assert_close(got, want, atol=1e-6, rtol=1e-5, msg=name)


def test_gradcheck_in_float64():
    hidden, weight, bias, ids = _inputs(0, B=2, T=3, H=4, V=5, dtype=torch.float64)

    def score(h, w, b):
        return token_logprobs(h, w, ids, bias=b, temperature=1.3, chunk_size=2)[0]

    assert torch.autograd.gradcheck(score, (hidden, weight, bias))


def test_no_grad_and_frozen_head():
    hidden, weight, _, ids = _inputs(1, bias=False)
    expected, _ = _plain(hidden, weight, None, ids, 1.0)
    with torch.no_grad():
        logp, _ = token_logprobs(hidden, weight, ids, chunk_size=4)
    assert not logp.requires_grad
    assert_close(logp, expected.detach())
    # Only the hidden states train (a frozen head): the head gets no gradient.
    frozen = weight.detach()
    logp, _ = token_logprobs(hidden, frozen, ids, chunk_size=4)
    (grad,) = torch.autograd.grad(logp.sum(), hidden)
    (want,) = torch.autograd.grad(_plain(hidden, frozen, None, ids, 1.0)[0].sum(), hidden)
    assert_close(grad, want)


def test_never_more_than_one_chunk_of_logits(monkeypatch):
    """Forward and backward project at most chunk_size positions at a time."""
    widths = []
    chunk_logits = logprobs._chunk_logits

    def recording(hidden, *args):
        widths.append(hidden.shape[0])
        return chunk_logits(hidden, *args)

    monkeypatch.setattr(logprobs, "_chunk_logits", recording)
    hidden, weight, bias, ids = _inputs(2, B=4, T=6)  # N = 24 positions
    logp, _ = token_logprobs(hidden, weight, ids, bias=bias, chunk_size=5)
    assert widths == [5, 5, 5, 5, 4]
    logp.sum().backward()
    assert widths == [5, 5, 5, 5, 4] * 2, "the backward recomputes each chunk once"


def test_chunk_rows_fits_the_logit_budget():
    assert chunk_rows(151_936) * 151_936 <= logprobs.CHUNK_LOGITS
    assert chunk_rows(10**9) == 1
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_rows(10, chunk_size=0)


def test_bf16_autocast_scores_in_float32_and_trains():
    hidden, weight, _, ids = _inputs(3, bias=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = token_logprobs(hidden, weight, ids, chunk_size=4)
        logits = F.linear(hidden, weight)  # (B, T, V) bfloat16
    assert logits.dtype == torch.bfloat16
    expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[..., None])[..., 0]
    assert logp.dtype == torch.float32
    assert_close(logp, expected, atol=1e-6, rtol=1e-6)  # the same logits, softmax in float32
    logp.sum().backward()
    (want,) = torch.autograd.grad(_plain(hidden, weight, None, ids, 1.0)[0].sum(), weight)
    assert_close(weight.grad, want, atol=0.05, rtol=0.05)  # bfloat16 logits, float32 backward


def test_rejects_bad_shapes():
    hidden, weight, _, ids = _inputs(0, bias=False)
    with pytest.raises(ValueError, match="token_ids"):
        token_logprobs(hidden, weight, ids[:, :2])
    with pytest.raises(ValueError, match="weight"):
        token_logprobs(hidden, weight[:, :2], ids)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(hidden, weight, ids, temperature=0.0)
