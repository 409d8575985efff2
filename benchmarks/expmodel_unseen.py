"""The experience model judged on unseen items: the script behind README's ExpModel numbers.

Runs the chain's first four pipelines (annotation -> expmodel_sft -> expmodel_pft ->
experience_scoring) and the ``evaluate_experience_model`` node on in-memory datasets with the
project's parameters, plus any overrides, and prints ``expmodel_evaluation`` (Kendall tau of
s_exp against the hidden quality and each dimension, on the train items and on the unseen
ones) and the wall time. Nothing under data/ is read or written; checkpoints go to a
temporary folder, or to ``--checkpoints DIR``, where a setting that changes only PFT loads the
SFT run it shares with an earlier one instead of training it again.

    python benchmarks/expmodel_unseen.py \\
        --setting "expmodel_sft.tokenizer.image_size=112,annotation.items.n_items=800"

Each ``--setting`` is a comma-separated list of overrides (``group.key.sub=value``, values
read as YAML), one run per setting (none: the defaults).
"""

from __future__ import annotations

import argparse
import copy
import logging
import re
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml
from kedro.config import OmegaConfigLoader
from kedro.io import DataCatalog, MemoryDataset
from kedro.pipeline import Pipeline
from kedro.runner import SequentialRunner

from creditflow.datasets import CheckpointDirectoryDataset
from creditflow.pipelines import annotation, experience_scoring, expmodel_pft, expmodel_sft
from creditflow.pipelines.reranker_eval import create_pipeline as reranker_eval_pipeline

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("annotation", "expmodel_sft", "expmodel_pft", "experience_scoring")
COLUMNS = [
    "target",
    "kendall_tau_in_sample",
    "kendall_tau_unseen",
    "kendall_tau_annotation",
    "kendall_tau_annotation_unseen",
    "pair_accuracy_in_sample",
    "pair_accuracy_unseen",
]


def overridden(params: dict, setting: str) -> dict:
    """``params`` with the ``group.key=value,...`` overrides of ``setting`` applied.

    >>> overridden({"a": {"b": 1, "c": 2}}, "a.b=3,a.d.e=4,a.c=[x, y]")
    {'a': {'b': 3, 'c': ['x', 'y'], 'd': {'e': 4}}}
    """
    out = copy.deepcopy(params)
    # Commas inside [...] or {...} belong to the value.
    for item in filter(None, re.split(r",(?![^\[{]*[\]}])", setting)):
        key, _, text = item.partition("=")
        *path, last = key.strip().split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(text)
    return out


def run(params: dict, checkpoints: Path | None = None) -> tuple[pd.DataFrame, float]:
    """``expmodel_evaluation`` of one run with ``params`` (group -> dict), and its wall time;
    checkpoints under ``checkpoints`` (None: a temporary folder)."""
    pipeline = Pipeline(
        [
            annotation.create_pipeline(),
            expmodel_sft.create_pipeline(),
            expmodel_pft.create_pipeline(),
            experience_scoring.create_pipeline(),
            reranker_eval_pipeline().only_nodes("evaluate_experience_model"),
        ]
    )
    with tempfile.TemporaryDirectory() as folder:
        datasets = {f"params:{g}": MemoryDataset(v) for g, v in params.items()}
        datasets["credentials"] = MemoryDataset({})
        datasets["annotation_source_items"] = MemoryDataset(None)
        datasets["annotation_source_impressions"] = MemoryDataset(None)
        root = checkpoints or Path(folder)
        for stage in ("expmodel_sft", "expmodel_pft"):
            datasets[f"{stage}_checkpoints"] = CheckpointDirectoryDataset(str(root / stage))
        outputs = pipeline.all_outputs() - set(datasets)
        datasets |= {name: MemoryDataset(copy_mode="assign") for name in outputs}
        catalog = DataCatalog(datasets)
        start = time.perf_counter()
        SequentialRunner().run(pipeline, catalog)
        return catalog.load("expmodel_evaluation"), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", action="append", default=[], help="overrides, one run")
    parser.add_argument("--checkpoints", type=Path, help="keep (and reuse) checkpoints here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    loader = OmegaConfigLoader(str(ROOT / "conf"), base_env="base", default_run_env="local")
    base = {g: loader["parameters"][g] for g in GROUPS}
    for setting in args.setting or [""]:
        table, seconds = run(overridden(base, setting), args.checkpoints)
        text = table[COLUMNS].to_string(index=False, float_format=lambda v: f"{v:.3f}")
        sys.stdout.write(f"\n== {setting or 'defaults'}: {seconds:.0f} s\n{text}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
