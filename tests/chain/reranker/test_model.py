"""The pointer reranker: valid rankings under any padding, teacher forcing = sampling, padding
never leaks into real candidates, hand-computed uniform case, safetensors round trip."""

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from creditflow.chain.reranker.model import (
    PointerReranker,
    RerankerConfig,
    pointer_entropy,
    step_mask,
)
from creditflow.datasets import HFModelDataset

F_ = 5  # features per candidate in these tests


def _model(seed: int = 0, **overrides) -> PointerReranker:
    torch.manual_seed(seed)
    return PointerReranker(RerankerConfig(n_features=F_, **overrides)).eval()


@pytest.fixture(scope="module")
def model() -> PointerReranker:
    return _model()


def _inputs(seed: int, N: int = 6, L: int = 7, keep: float = 0.7):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(N, L, F_, generator=g)
    mask = torch.rand(N, L, generator=g) < keep
    return features, mask


def _check_layout(permutations: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> None:
    """Every row: a permutation of 0..L-1, its real candidates first, then its padding slots in
    index order with log-prob 0; real steps have finite log-probs <= 0."""
    N, L = mask.shape
    for n in range(N):
        row = permutations[n].tolist()
        assert sorted(row) == list(range(L)), row
        real = mask[n].nonzero().flatten().tolist()
        padding = (~mask[n]).nonzero().flatten().tolist()
        k = len(real)
        assert sorted(row[:k]) == real
        assert row[k:] == padding
        assert torch.all(logp[n, k:] == 0)
        assert torch.isfinite(logp[n, :k]).all() and (logp[n, :k] <= 1e-6).all()


@st.composite
def _pages(draw):
    N = draw(st.integers(1, 4))
    L = draw(st.integers(1, 7))
    mask = draw(st.lists(st.lists(st.booleans(), min_size=L, max_size=L), min_size=N, max_size=N))
    seed = draw(st.integers(0, 2**16))
    features = torch.randn(N, L, F_, generator=torch.Generator().manual_seed(seed))
    return features, torch.tensor(mask, dtype=torch.bool), seed


@given(_pages(), st.booleans())
def test_sample_is_always_a_valid_ranking(model, page, greedy):
    """No duplicate, no out-of-range index, padding never before a real candidate, for any
    mask, all-padding rows included."""
    features, mask, seed = page
    generator = torch.Generator().manual_seed(seed)
    permutations, logp = model.sample(features, mask, generator=generator, greedy=greedy)
    assert permutations.dtype == torch.long
    assert permutations.shape == logp.shape == mask.shape
    _check_layout(permutations, logp, mask)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_teacher_forced_logp_equals_sampling_logp(seed, temperature):
    model = _model(seed)
    features, mask = _inputs(seed)
    permutations, logp = model.sample(
        features, mask, generator=torch.Generator().manual_seed(seed), temperature=temperature
    )
    forced = model.log_probs_of(features, mask, permutations, temperature=temperature)
    # The sampler runs without grad (the encoder's fused inference path), teacher forcing with
    # grad: the two agree to float32 rounding.
    torch.testing.assert_close(forced, logp, atol=1e-5, rtol=1e-5)
    assert forced.requires_grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_logp_equals_one_page_at_a_time(seed):
    """Rows never interact: the batched pass equals a loop over single pages."""
    model = _model(seed)
    features, mask = _inputs(seed)
    permutations, _ = model.sample(features, mask, generator=torch.Generator().manual_seed(seed))
    batched = model.log_probs_of(features, mask, permutations)
    looped = torch.cat(
        [
            model.log_probs_of(features[n : n + 1], mask[n : n + 1], permutations[n : n + 1])
            for n in range(len(mask))
        ]
    )
    torch.testing.assert_close(batched, looped, atol=1e-6, rtol=1e-5)


def test_padding_features_do_not_change_real_log_probs(model):
    features, mask = _inputs(3)
    permutations, _ = model.sample(features, mask, generator=torch.Generator().manual_seed(3))
    scrambled = torch.where(mask.unsqueeze(-1), features, 100 * torch.randn_like(features))
    torch.testing.assert_close(
        model.log_probs_of(scrambled, mask, permutations),
        model.log_probs_of(features, mask, permutations),
    )


def test_uniform_pointer_hand_case():
    """Query weights at 0 score every candidate 0: each step is uniform over what is left.
    Page with 3 real candidates of L = 4 (slot 1 padding), ranking [2, 0, 3, 1]:
    step 0: 1/3, step 1: 1/2, step 2: 1 (last real), step 3: forced padding.
    log-probs [-log 3, -log 2, 0, 0]; entropies the same values negated (uniform)."""
    model = _model()
    with torch.no_grad():
        model.query.weight.zero_()
        model.query.bias.zero_()
    mask = torch.tensor([[True, False, True, True]])
    features = torch.randn(1, 4, F_)
    ranking = torch.tensor([[2, 0, 3, 1]])
    expected = torch.tensor([[-math.log(3), -math.log(2), 0.0, 0.0]])
    torch.testing.assert_close(model.log_probs_of(features, mask, ranking), expected)
    entropy = pointer_entropy(model.step_log_probs(features, mask, ranking))
    torch.testing.assert_close(entropy, -expected)


def test_step_mask_counts_the_real_candidates():
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    # 2, 0 and 3 real candidates -> the first 2, 0 and 3 steps count.
    expected = torch.tensor([[True, True, False], [False, False, False], [True, True, True]])
    assert torch.equal(step_mask(mask), expected)


@pytest.mark.parametrize(
    ("ranking", "why"),
    [
        ([0, 0, 2], "duplicate"),
        ([1, 0, 2], "padding slot 1 placed before real candidate 2"),
        ([0, 2, 3], "out of range"),
    ],
)
def test_invalid_rankings_are_refused(model, ranking, why):
    mask = torch.tensor([[True, False, True]])
    with pytest.raises(ValueError, match="permutations"):
        model.log_probs_of(torch.randn(1, 3, F_), mask, torch.tensor([ranking]))


def test_config_is_validated():
    with pytest.raises(ValueError, match="divisible"):
        RerankerConfig(n_features=3, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="valid"):
        RerankerConfig.from_dict({"n_features": 3, "width": 8})
    with pytest.raises(ValueError, match="temperature"):
        _model().sample(torch.randn(1, 2, F_), torch.ones(1, 2, dtype=torch.bool), temperature=0)


def test_save_and_load_round_trip(tmp_path):
    model = _model(seed=4, d_model=16, n_heads=2, n_layers=2)
    features, mask = _inputs(4)
    permutations, _ = model.sample(features, mask, generator=torch.Generator().manual_seed(4))
    model.save_pretrained(tmp_path / "reranker")
    assert {p.name for p in (tmp_path / "reranker").iterdir()} == {
        "config.json",
        "model.safetensors",
    }
    config = json.loads((tmp_path / "reranker" / "config.json").read_text())
    assert config["model_type"] == "pointer_reranker" and config["n_layers"] == 2
    loaded = PointerReranker.from_pretrained(tmp_path / "reranker")
    assert not loaded.training
    torch.testing.assert_close(
        loaded.log_probs_of(features, mask, permutations),
        model.log_probs_of(features, mask, permutations),
    )


def test_from_pretrained_refuses_another_model_type(tmp_path):
    _model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    with pytest.raises(ValueError, match="pointer_reranker"):
        PointerReranker.from_pretrained(tmp_path)


def test_catalog_can_version_the_reranker(tmp_path):
    """The project's HFModelDataset saves and loads it by dotted class path, without pickle."""
    from kedro.io.core import Version  # noqa: PLC0415 - only this test needs Kedro

    model = _model(seed=5)
    dataset = HFModelDataset(
        filepath=str(tmp_path / "reranker"),
        model_class="creditflow.chain.reranker.model.PointerReranker",
        version=Version(None, None),
    )
    dataset.save(model)
    loaded = dataset.load()
    assert isinstance(loaded, PointerReranker)
    for (name, a), (_, b) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
