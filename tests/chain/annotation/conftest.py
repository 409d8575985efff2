"""A small synthetic catalogue shared by the annotation tests (rendering it takes ~1 s)."""

import pandas as pd
import pytest

from creditflow.chain.world.catalogue import generate_catalogue


@pytest.fixture(scope="session")
def catalogue() -> pd.DataFrame:
    return generate_catalogue(300, seed=0)
