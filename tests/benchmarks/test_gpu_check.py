"""The GPU check: its Qwen2.5-0.5B configuration and its CPU dry run end to end."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gpu_check = _load("gpu_check")


def test_the_configuration_is_qwen25_05b_by_its_parameter_count():
    # Qwen2.5-0.5B's model card: 0.49 B parameters; 494,032,768 with the tied embedding
    # (151,936 x 896 = 136,134,656 of them). Built on the meta device: no memory, no init.
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**gpu_check.QWEN25_05B))
    assert sum(p.numel() for p in model.parameters()) == 494_032_768


def test_runs_list_vllm_only_on_a_gpu_and_filter_by_label():
    labels = [label for label, _ in gpu_check.runs(cpu=True)]
    assert labels == ["creditflow[hf]", "creditflow[lean]", "trl"]
    assert [label for label, _ in gpu_check.runs(True, ["trl"])] == ["trl"]


@pytest.mark.slow
def test_cpu_dry_run_measures_a_backend_and_an_fsdp_step(tmp_path):
    """The shell script's --cpu mode: model built, one measured run (the others are the same
    grpo_step.py call with other arguments, each run by test_grpo_step), the FSDP2 step."""
    done = subprocess.run(
        [str(BENCHMARKS / "gpu_check.sh"), "--cpu", str(tmp_path), "--runs", "creditflow[lean]"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "gpu-marked tests: skipped in the --cpu dry run" in done.stdout
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    lean, fsdp = records
    assert lean["label"] == "creditflow[lean]" and lean["device"] == "cpu"
    assert lean["tokens_per_s"] > 0 and lean["completion_tokens"] > 0
    assert fsdp["label"] == "creditflow FSDP2 step" and fsdp["grad_norm"] >= 0
    table = (tmp_path / "table.md").read_text()
    assert "| creditflow[lean] |" in table and "| creditflow FSDP2 step |" in table
