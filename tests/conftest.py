"""Shared test set-up: offline Hugging Face, no Kedro telemetry, a reproducible hypothesis profile."""

import os
from pathlib import Path

os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "creditflow",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("creditflow")

from creditflow.ingest.sources import FETCH_HINT, RAW_DATA_DIR, missing_sets  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# The project's raw data dir: `creditflow fetch-data` fills it (`make test` first copies the
# sets from ../shared/data when that folder exists, as it does in CI).
RAW_DATA = PROJECT_ROOT / RAW_DATA_DIR


@pytest.fixture(scope="session")
def project_root() -> Path:
    return PROJECT_ROOT


@pytest.fixture(scope="session")
def raw_data() -> Path:
    """data/01_raw of the project, holding every raw data set (tests read them, never write);
    a test that takes it is skipped, saying how to fetch them, when one is absent."""
    missing = missing_sets(RAW_DATA)
    if missing:
        pytest.skip(f"raw data set(s) {', '.join(missing)} not in {RAW_DATA_DIR}. {FETCH_HINT}")
    return RAW_DATA


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
