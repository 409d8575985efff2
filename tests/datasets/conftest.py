"""A trained tokenizer and two differently seeded tiny models to save through the catalog."""

import pytest
import torch

from creditflow.models import build_tiny_qwen2, train_bpe_tokenizer
from tests.models.conftest import CORPUS, TAPO_TOKENS


@pytest.fixture(autouse=True, scope="package")
def _single_thread_torch():
    """One intra-op thread for tiny models (see tests/models/conftest.py for why)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    return train_bpe_tokenizer(CORPUS * 20, vocab_size=400, special_tokens=TAPO_TOKENS)


@pytest.fixture(scope="session")
def model_a(tokenizer):
    return build_tiny_qwen2(tokenizer, seed=0)


@pytest.fixture(scope="session")
def model_b(tokenizer):
    return build_tiny_qwen2(tokenizer, seed=1)


@pytest.fixture(scope="session")
def input_ids(tokenizer) -> torch.Tensor:
    """(B, T) = (1, T) ids of a TAPO-style completion."""
    return torch.tensor([tokenizer.encode("<translation>Сколько яиц?</translation> \\boxed{13}")])
