"""The experience chain's tests run their tiny models on one torch thread, as the engine's do."""

import pytest

from tests.training.conftest import one_torch_thread


@pytest.fixture(autouse=True, scope="package")
def _single_thread_torch():
    with one_torch_thread():
        yield
