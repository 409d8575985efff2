"""The experience-model chain (docs/methods/experience.md) at its smallest sizes, for the pipeline tests.

``chain_catalog()`` runs the eight pipelines once per test session, in order, on the project's
own catalog entries (``conf/base/catalog.yml``, every file path moved under a temporary
folder): Parquet list columns, PNG bytes, processors, ExpScorer and PointerReranker directories
all go through the datasets a ``kedro run`` uses. Each pipeline's slice test then loads its
inputs from there and runs its own ``create_pipeline()`` on MemoryDatasets.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from kedro.config import OmegaConfigLoader
from kedro.io import DataCatalog, MemoryDataset
from kedro.pipeline import Pipeline
from kedro.runner import SequentialRunner

from tests.pipelines._params import SMALLEST_TINY_DECODER, deep_update

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The chain in DAG order (also DEFAULT_PIPELINES, the bare `kedro run`).
CHAIN = (
    "annotation",
    "expmodel_sft",
    "expmodel_pft",
    "experience_scoring",
    "augmented_targets",
    "reranker_pretrain",
    "reranker_grpo",
    "reranker_eval",
)

SMALLEST: dict[str, dict[str, Any]] = {
    "annotation": {
        "items": {"n_items": 40, "image_size": 32},
        "query_logs": {"n_queries": 6, "n_sessions": 80, "list_length": 6},
    },
    "expmodel_sft": {
        "tokenizer": {"vocab_size": 300, "image_size": 28},
        "model": {"tiny": {**SMALLEST_TINY_DECODER, "vision_depth": 1}},
        "training": {"steps": 2, "batch_size": 4},
    },
    "expmodel_pft": {
        "pairs": {"max_pairs": 60},
        "training": {"steps": 2, "batch_size": 4},
        # The default is 0; the tests read the held-out metric. Held-out pairs, not items: the
        # smallest world's ~20 per-query tail pairs rarely hold two held-out items.
        "pft": {"heldout_fraction": 0.2, "heldout_split": "pairs"},
    },
    "experience_scoring": {"batch_size": 16},
    "reranker_pretrain": {
        "model": {"d_model": 8, "n_heads": 2, "dim_feedforward": 16},
        "training": {"steps": 3, "batch_size": 16},
    },
    "reranker_grpo": {
        "grpo": {
            "steps": 2,
            "prompts_per_step": 4,
            "group_size": 3,
            "checkpoint_every": 1,
            "log_samples_every": 1,
        }
    },
    "reranker_eval": {},
    "movielens_eval": {  # not in the chain: real data
        "sessions": {"max_users": 12},
        "expmodel": {
            "teacher": {"min_ratings": 3},
            "tokenizer": {"vocab_size": 300},
            "model": {"tiny": dict(SMALLEST_TINY_DECODER)},
            "sft": {"steps": 2, "batch_size": 4},
            "pairs": {"max_pairs": 40},
            "pft_training": {"steps": 2, "batch_size": 4},
        },
    },
}


class KeptMemoryDataset(MemoryDataset):
    """A MemoryDataset the runner cannot release, so a test can read intermediate outputs."""

    def _release(self) -> None:
        pass


def smallest_params() -> dict[str, dict[str, Any]]:
    """The parameter groups of ``SMALLEST`` from conf/, with ``SMALLEST`` applied."""
    loader = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), base_env="base", default_run_env="local")
    parameters = loader["parameters"]
    return {name: deep_update(parameters[name], SMALLEST[name]) for name in SMALLEST}


def create_pipeline(name: str) -> Pipeline:
    return importlib.import_module(f"creditflow.pipelines.{name}").create_pipeline()


def chain_pipeline() -> Pipeline:
    return sum((create_pipeline(name) for name in CHAIN), Pipeline([]))


def file_catalog(root: Path, params: dict[str, dict[str, Any]]) -> DataCatalog:
    """``conf/base/catalog.yml`` with every ``data/...`` path under ``root``, plus the params."""
    loader = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), base_env="base", default_run_env="local")
    config = {}
    for name, entry in loader["catalog"].items():
        config[name] = dict(entry)
        if "filepath" in entry:
            config[name]["filepath"] = str(root / entry["filepath"])
    catalog = DataCatalog.from_config(config)
    for group, values in params.items():
        catalog[f"params:{group}"] = MemoryDataset(values)
    return catalog


@functools.cache
def chain_catalog() -> DataCatalog:
    """The whole chain, run once per session at the smallest sizes, on file-backed datasets."""
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="experience_chain_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    params = {name: values for name, values in smallest_params().items() if name in CHAIN}
    catalog = file_catalog(root, params)
    SequentialRunner().run(chain_pipeline(), catalog)
    return catalog


def slice_catalog(pipeline: Pipeline, params: dict[str, Any], **replace: Any) -> DataCatalog:
    """MemoryDatasets for ``pipeline``: its free inputs loaded from ``chain_catalog()`` (or taken
    from ``replace``), the params given, every output kept (models by reference)."""
    upstream = chain_catalog()
    datasets: dict[str, MemoryDataset] = {}
    for name in pipeline.inputs():
        if name in replace:
            datasets[name] = MemoryDataset(replace[name], copy_mode="assign")
        elif name.startswith("params:"):
            datasets[name] = MemoryDataset(params[name.removeprefix("params:")])
        elif name.endswith("_checkpoints"):
            continue  # the caller passes a CheckpointDirectoryDataset of its own
        else:
            datasets[name] = MemoryDataset(upstream.load(name), copy_mode="assign")
    for name in pipeline.all_outputs():
        datasets[name] = KeptMemoryDataset(copy_mode="assign")
    return DataCatalog(datasets)


def as_lists(frame):
    """``frame`` with array cells (Parquet's list columns read back) turned into lists."""
    out = frame.copy()
    for column in out.columns:
        if out[column].map(lambda v: hasattr(v, "tolist") and not isinstance(v, str)).any():
            out[column] = out[column].map(lambda v: list(v.tolist()) if hasattr(v, "tolist") else v)
    return out
