import doctest
import importlib

import pytest
import torch
from torch.testing import assert_close

from creditflow import algorithms
from creditflow.algorithms import masked_mean

PUBLIC_API = {
    "group_zscore",
    "tapo_advantages",
    "segment_token_advantages",
    "sign_conflict_rate",
    "topp_entropy",
    "visual_sensitivity",
    "top_fraction_mask",
    "tor_token_weights",
    "kl_penalty",
    "policy_loss",
    "overlong_penalty",
    "constant_groups",
}


def test_public_api_is_exported():
    assert PUBLIC_API <= set(algorithms.__all__)
    for name in algorithms.__all__:
        assert hasattr(algorithms, name), name


@pytest.mark.parametrize("module", ["_masked", "advantages", "tor", "logprobs", "losses", "dapo"])
def test_docstring_examples(module):
    mod = importlib.import_module(f"creditflow.algorithms.{module}")
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_masked_mean_hand_computed():
    values = torch.tensor([[1.0, 2.0, 30.0], [4.0, 50.0, 60.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    # all: (1 + 2 + 4) / 3
    assert_close(masked_mean(values, mask), torch.tensor(7.0 / 3))
    # rows: (1 + 2) / 2, 4 / 1, an all-padding row -> 0 / clamp(0, min=1) = 0
    assert_close(masked_mean(values, mask, dim=1), torch.tensor([1.5, 4.0, 0.0]))
    # columns: (1 + 4) / 2, 2 / 1, nothing -> 0
    assert_close(masked_mean(values, mask.bool(), dim=0), torch.tensor([2.5, 2.0, 0.0]))


def test_masked_mean_ignores_non_finite_padding():
    values = torch.tensor([2.0, float("nan"), float("inf")])
    mask = torch.tensor([True, False, False])
    assert_close(masked_mean(values, mask), torch.tensor(2.0))


def test_masked_mean_gradient_is_zero_on_padding():
    values = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    masked_mean(values, torch.tensor([1, 0, 1])).backward()
    # d/dv (v0 + v2) / 2
    assert_close(values.grad, torch.tensor([0.5, 0.0, 0.5]))


def test_masked_mean_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same shape"):
        masked_mean(torch.zeros(2, 3), torch.ones(3, 2))
