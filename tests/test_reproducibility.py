"""Bit-identical reruns of the ``tapo`` pipeline, and who switches deterministic kernels on.

``run_tapo_smallest`` runs the whole pipeline at the smallest sizes the tapo pipeline test
uses (``tests/pipelines/_params.TAPO_SMALLEST``) with a longer SFT, so that GRPO takes real
steps, on MemoryDatasets the runner never releases, with a fresh checkpoint directory, under
``torch.use_deterministic_algorithms(True)`` and one intra-op thread. Two runs in this
process and one in a fresh interpreter (another ``PYTHONHASHSEED``) must agree bit for bit:
weights (``torch.equal``), training metrics without the ``time/*`` columns, samples,
evaluation tables, the comparison table, the tokenizer and the checkpoint fingerprints.

A real ``kedro run`` (project CLI, settings.py hooks) shows that nothing in the project touches
``torch.use_deterministic_algorithms``: it is the user's switch (docs/reproducibility.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from kedro.config import OmegaConfigLoader
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from creditflow.datasets import CheckpointDirectoryDataset
from creditflow.ingest import load_mgsm
from creditflow.pipelines.comparison import configured_strategies
from creditflow.pipelines.tapo import create_pipeline
from tests.pipelines._params import TAPO_SMALLEST, deep_update, parameter_datasets

pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")

# The compared strategies, as the pipeline reads them from conf/base/parameters_tapo.yml.
STRATEGIES = tuple(configured_strategies("tapo"))

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT_S = 300

# On top of TAPO_SMALLEST: at those sizes every reward is 0, so every advantage is 0 and GRPO
# leaves the warm start untouched, which would make the GRPO half of the comparison vacuous.
# A longer, faster SFT and longer completions give format rewards that differ within a group
# (grpo_sum and tapo then take real steps; grpo_reasoning's answer reward stays 0).
NONTRIVIAL = {
    "sft": {"steps": 60, "learning_rate": 0.02, "batch_size": 8},
    "grpo": {"max_new_tokens": 40, "group_size": 4},
}
# Strategies whose GRPO steps must have moved the weights at these sizes.
TRAINED = ("grpo_sum", "tapo")
# The strategies' datasets hold {seed: model}; at the default n_seeds = 1 seed 0 is the policy.
MODELS = ("tapo_initial_policy", "tapo_sft_policy", *(f"tapo_policies_{s}" for s in STRATEGIES))
TABLES = (
    "tapo_train_tasks",
    "tapo_eval_tasks",
    "tapo_sft_metrics",
    "tapo_comparison",
    "tapo_results_sft",
    *(f"tapo_results_{s}" for s in STRATEGIES),
    *(f"tapo_samples_{s}" for s in STRATEGIES),
)
GRPO_METRICS = tuple(f"tapo_{s}_metrics" for s in STRATEGIES)


def smallest_tapo_params(
    overrides: dict | None = None, project_root: Path = PROJECT_ROOT
) -> dict[str, Any]:
    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="local")
    return deep_update(deep_update(loader["parameters"]["tapo"], TAPO_SMALLEST), overrides or {})


class KeptMemoryDataset(MemoryDataset):
    """A MemoryDataset the runner cannot release, so the test can read intermediate outputs."""

    def _release(self) -> None:
        pass


@contextmanager
def deterministic_torch() -> Iterator[None]:
    """Deterministic kernels (errors on ops that have none) and one intra-op thread, restored
    afterwards. The thread count is part of the result: a CPU matmul split over another number
    of threads sums in another order (1 vs 2 threads moves the SFT weights by ~3e-7)."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.set_num_threads(threads)


def run_tapo_smallest(
    raw_data: Path, checkpoint_root: Path, overrides: dict | None = NONTRIVIAL
) -> dict[str, Any]:
    """One run of the whole tapo pipeline; returns everything two runs should agree on."""
    mgsm = load_mgsm(Path(raw_data) / "mgsm", ["en", "de", "zh"], max_rows=2)
    pipeline = create_pipeline()
    datasets = {
        **parameter_datasets("tapo", smallest_tapo_params(overrides)),
        "mgsm_problems": MemoryDataset(mgsm),
        "tapo_source_problems": MemoryDataset(None),  # tapo.tasks.source: synthetic
    }
    for name in pipeline.all_outputs():
        datasets[name] = KeptMemoryDataset(copy_mode="assign")
    datasets["tapo_sft_checkpoints"] = CheckpointDirectoryDataset(
        str(Path(checkpoint_root) / "sft")
    )
    for strategy in STRATEGIES:
        datasets[f"tapo_checkpoints_{strategy}"] = CheckpointDirectoryDataset(
            str(Path(checkpoint_root) / strategy)
        )
    catalog = DataCatalog(datasets)
    with deterministic_torch():
        SequentialRunner().run(pipeline, catalog)

    def without_time(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.drop(columns=[c for c in frame.columns if c.startswith("time/")])

    def model(name: str):
        loaded = catalog.load(name)
        return loaded[0] if isinstance(loaded, dict) else loaded

    return {
        "weights": {
            name: {k: v.detach().clone() for k, v in model(name).state_dict().items()}
            for name in MODELS
        },
        "tables": {name: catalog.load(name) for name in TABLES},
        "grpo_metrics": {name: without_time(catalog.load(name)) for name in GRPO_METRICS},
        "tokenizer": catalog.load("tapo_tokenizer").backend_tokenizer.to_str(),
        # The fingerprint of (SFT weights, GRPO config, prompts) names each run's checkpoints.
        "checkpoint_runs": {
            s: sorted(p.name for p in (Path(checkpoint_root) / s).iterdir()) for s in STRATEGIES
        },
    }


def assert_identical_runs(first: dict[str, Any], second: dict[str, Any]) -> None:
    assert first["tokenizer"] == second["tokenizer"]
    assert first["checkpoint_runs"] == second["checkpoint_runs"]
    for name in MODELS:
        a, b = first["weights"][name], second["weights"][name]
        assert a.keys() == b.keys(), name
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}: {key} differs"
    for group in ("grpo_metrics", "tables"):
        for name, frame in first[group].items():
            # check_exact: bit-equal floats, not the default rtol of 1e-5.
            pd.testing.assert_frame_equal(frame, second[group][name], check_exact=True, obj=name)


_SUBPROCESS_RUN = textwrap.dedent(
    """
    import sys
    import torch
    from tests.test_reproducibility import run_tapo_smallest
    torch.save(run_tapo_smallest(sys.argv[1], sys.argv[2]), sys.argv[3])
    """
)


@pytest.mark.slow
def test_tapo_reruns_are_bit_identical_in_process_and_in_a_fresh_interpreter(raw_data, tmp_path):
    # A different checkpoint directory per run, so no run resumes another's finished run.
    first = run_tapo_smallest(raw_data, tmp_path / "ckpt1")
    second = run_tapo_smallest(raw_data, tmp_path / "ckpt2")

    # The comparison is not vacuous: every GRPO step ran, and two strategies had non-zero
    # gradients and moved every weight of the warm start.
    for name in GRPO_METRICS:
        assert first["grpo_metrics"][name]["step"].tolist() == [1.0, 2.0]
        assert not any(c.startswith("time/") for c in first["grpo_metrics"][name].columns)
    sft = first["weights"]["tapo_sft_policy"]
    for strategy in TRAINED:
        assert (first["grpo_metrics"][f"tapo_{strategy}_metrics"]["actor/grad_norm"] > 0).all()
        trained = first["weights"][f"tapo_policies_{strategy}"]
        assert all(not torch.equal(trained[k], sft[k]) for k in sft), (
            f"{strategy}: GRPO did not change the warm start; raise NONTRIVIAL's SFT budget"
        )
    assert_identical_runs(first, second)

    # A fresh interpreter: new hash seed (set and dict-of-str order), fresh RNG state, fresh
    # reward worker, fresh tokenizer library state.
    out = tmp_path / "fresh.pt"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", _SUBPROCESS_RUN, str(raw_data), str(tmp_path / "ckpt3")]
    completed = subprocess.run(
        [*command, str(out)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    fresh = torch.load(out, weights_only=False)
    assert_identical_runs(first, fresh)


def test_deterministic_torch_restores_the_previous_settings():
    before = (torch.are_deterministic_algorithms_enabled(), torch.get_num_threads())
    with deterministic_torch():
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.get_num_threads() == 1
    assert (torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()) == before


def _flat_params(tree: dict, prefix: str) -> list[str]:
    """``--params`` items (``tapo.sft.steps=3``) for a nested mapping."""
    items = []
    for key, value in tree.items():
        name = f"{prefix}.{key}"
        items += _flat_params(value, name) if isinstance(value, dict) else [f"{name}={value}"]
    return items


# docs/reproducibility.md's switch: turn deterministic kernels on, then start the Kedro CLI.
# Every later call of torch.use_deterministic_algorithms is recorded.
_RECORDING_CLI = textwrap.dedent(
    """
    import atexit, json, sys
    import torch
    calls = []
    switch = torch.use_deterministic_algorithms
    def recording(mode, *, warn_only=False):
        calls.append(bool(mode))
        switch(mode, warn_only=warn_only)
    torch.use_deterministic_algorithms = recording
    switch(True)
    record = sys.argv.pop(1)
    def write():
        state = torch.are_deterministic_algorithms_enabled()
        with open(record, "w") as f:
            json.dump({"calls": calls, "enabled_at_exit": state}, f)
    atexit.register(write)
    from creditflow.__main__ import main
    main()
    """
)


@pytest.mark.slow
def test_the_project_leaves_the_deterministic_switch_to_the_user(project_root, tmp_path):
    """Neither settings.py's hooks nor the GRPO entry points call ``torch.use_deterministic_algorithms``
    (docs/reproducibility.md says how a user turns it on). A real ``kedro run`` of the tapo
    set-up and SFT nodes, through the documented switch, keeps it on throughout.

    If a hook or recipe starts managing the switch, this fails: update the docs with it.
    """
    for name in ("conf/base", "pyproject.toml"):
        copy_ = shutil.copytree if (project_root / name).is_dir() else shutil.copy
        copy_(project_root / name, tmp_path / name)
    (tmp_path / "conf/local").mkdir()
    sizes = {key: TAPO_SMALLEST[key] for key in ("tasks", "tokenizer", "policy", "sft")}
    # MLflow tracking stays on (into tmp_path/mlruns): every hook of settings.py takes part.
    params = ",".join(_flat_params(sizes, "tapo"))
    nodes = "build_tapo_tasks,train_tapo_tokenizer,build_tapo_policy,warm_start_tapo_policy"
    record = tmp_path / "switch.json"
    command = [sys.executable, "-c", _RECORDING_CLI, str(record)]
    completed = subprocess.run(
        [*command, "--pipelines", "tapo", "--nodes", nodes, "--params", params],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(record.read_text()) == {"calls": [], "enabled_at_exit": True}
    (manifest,) = (tmp_path / "data/08_reporting/run_manifests").glob("*.json")
    assert json.loads(manifest.read_text())["status"] == "completed"
    assert list((tmp_path / "data/06_models/tapo_sft_policy").iterdir()), "SFT saved a model"
    assert (tmp_path / "mlruns").is_dir(), "the MLflow hook ran"
