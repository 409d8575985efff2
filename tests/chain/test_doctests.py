import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["reranker.ranking", "expmodel.losses"])
def test_docstring_examples(module):
    mod = importlib.import_module(f"creditflow.chain.{module}")
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
