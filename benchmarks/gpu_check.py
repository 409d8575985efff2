"""The GPU check's measurements: creditflow's rollout backends and TRL at Qwen2.5-0.5B's sizes.

Builds a randomly initialised ``Qwen2ForCausalLM`` from Qwen2.5-0.5B's configuration
(``QWEN25_05B``, written below: nothing is downloaded) with the benchmark's BPE tokenizer and
TAPO prompts (``make_tiny_model.py``; the embedding keeps Qwen2.5's 151,936 rows, so ids the
tokenizer never produces decode to nothing, as in the padded-vocabulary benchmark), then runs
``grpo_step.py`` once per implementation, each in its own process: creditflow with the
``hf``, ``lean`` and, when ``vllm`` imports, ``vllm`` (colocate) rollout backends, and TRL
1.16's ``GRPOTrainer``; every run in bfloat16 autocast around float32 weights. Then one FSDP2
GRPO step of creditflow (``run_grpo`` with ``distributed.accelerate.fsdp``, one process).
Prints one markdown table (completion tokens/s, s/step, peak GPU memory, peak RSS) and writes
every JSON record to ``--out``.

``--cpu`` is the dry run the test suite runs: the same steps on a tiny configuration
(``TINY``), float32, on the CPU, one measured step each, in seconds.

Usage (``benchmarks/gpu_check.sh`` calls it after the ``gpu``-marked tests)::

    .venv/bin/python benchmarks/gpu_check.py --out /tmp/gpu_check
    .venv/bin/python benchmarks/gpu_check.py --cpu --out /tmp/gpu_check_dry
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

HERE = Path(__file__).resolve().parent
GRPO_STEP = HERE / "grpo_step.py"

# Qwen/Qwen2.5-0.5B's config.json (architecture fields; the token ids are the benchmark
# tokenizer's, set in build_model). 494,032,768 parameters with the tied embedding.
QWEN25_05B: dict[str, Any] = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
}
# The dry run's model: Qwen2.5's shape of configuration at CPU-test sizes.
TINY: dict[str, Any] = {
    **QWEN25_05B,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 1024,
    "max_window_layers": 2,
    "sliding_window": 1024,
}
# The colocated vLLM engine's share of the GPU (the trainer keeps the rest).
VLLM_COLOCATE = "rollout={name: vllm, mode: colocate, gpu_memory_utilization: 0.3}"


def _load_make_tiny_model():
    # benchmarks/ holds scripts, not a package: import the builder from its file.
    spec = importlib.util.spec_from_file_location(
        "bench_make_tiny_model", HERE / "make_tiny_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_model(out: Path, config: dict[str, Any], seed: int = 0) -> int:
    """Write the tokenizer, prompts and a random model of ``config`` to ``out``; returns the
    parameter count. The tokenizer and prompts come from ``make_tiny_model`` (its own tiny
    model is overwritten)."""
    make_tiny_model = _load_make_tiny_model()
    make_tiny_model.make_tiny_model(
        out,
        seed=seed,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=16,
    )
    tiny = Qwen2Config.from_pretrained(out)
    # The benchmark tokenizer's special ids: its EOS ends completions, its pad pads.
    ids = {key: getattr(tiny, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(Qwen2Config(**config, **ids, attn_implementation="sdpa"))
    model.generation_config.eos_token_id = ids["eos_token_id"]
    model.generation_config.pad_token_id = ids["pad_token_id"]
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def say(text: str) -> None:
    """One line of the check's report on stdout (the script's output, not a log)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def runs(cpu: bool, only: Sequence[str] | None = None) -> list[tuple[str, list[str]]]:
    """(label, grpo_step.py arguments) of every measured run (of those labelled ``only``)."""
    out = [(f"creditflow[{b}]", ["--impl", "creditflow", "--rollout", b]) for b in ("hf", "lean")]
    out.append(("trl", ["--impl", "trl"]))
    # Last: its engine's start-up is the slowest and must not eat the others' time.
    if vllm_installed() and not cpu:
        out.append(
            ("creditflow[vllm]", ["--impl", "creditflow", "--creditflow-set", VLLM_COLOCATE])
        )
    return [run for run in out if only is None or run[0] in only]


def step_arguments(args: argparse.Namespace) -> list[str]:
    """The workload every run shares."""
    device = ["--device", "cpu", "--threads", "1"] if args.cpu else ["--device", "cuda", "--bf16"]
    return [
        "--group-size", str(args.group_size),
        "--prompts", str(args.prompts),
        "--max-new-tokens", str(args.max_new_tokens),
        "--steps", str(args.steps),
        "--warmup-steps", "1",
        "--attn", "sdpa",
        *device,
    ]  # fmt: skip


def run_step(
    label: str, impl_args: list[str], model_dir: Path, shared: list[str], timeout_s: float
) -> dict[str, Any]:
    """One ``grpo_step.py`` process; its record, or ``{"error": ...}`` when it failed (a
    backend that cannot run must not hide the others' figures)."""
    command = [sys.executable, str(GRPO_STEP), *impl_args, "--model-dir", str(model_dir), *shared]
    try:
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return {"label": label, "error": f"timed out after {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {"label": label, "error": done.stderr.strip().splitlines()[-1:]}
    return {"label": label, **json.loads(done.stdout.strip().splitlines()[-1])}


def fsdp_step(model_dir: Path, cpu: bool) -> dict[str, Any]:
    """One creditflow GRPO step under FSDP2 (one process, ``hf`` rollout: the lean decoder
    reads whole parameters), through ``run_grpo`` as a Kedro node calls it."""
    # Imported here: the measured runs above must not pay for creditflow's import.
    from creditflow.models import load_tokenizer  # noqa: PLC0415
    from creditflow.training import GRPOConfig  # noqa: PLC0415
    from creditflow.training.grpo_runs import run_grpo  # noqa: PLC0415

    prompts = [json.loads(line) for line in (model_dir / "prompts.jsonl").read_text().splitlines()]
    prompts = prompts[:2]
    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = GRPOConfig.from_params({
        "steps": 1, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16,
        "rewards": {"reasoning": 1.0}, "warmup_steps": 0, "checkpoint_every": 0,
        "log_samples_every": 0, "rollout": {"name": "hf"}, "bf16": not cpu,
    })  # fmt: skip
    accelerate = {"fsdp": {"fsdp_version": 2}, **({"cpu": True} if cpu else {})}
    t0 = time.perf_counter()
    _, result = run_grpo(
        model,
        load_tokenizer(model_dir),
        [p["prompt"] for p in prompts],
        [p["prompt"] for p in prompts],
        [str(p["answer"]) for p in prompts],
        config,
        ["reasoning"],
        None,
        distributed={"num_processes": 1, "accelerate": accelerate},
    )
    row = result.history[-1]
    return {"label": "creditflow FSDP2 step", "wall_s": time.perf_counter() - t0,
            "grad_norm": row["actor/grad_norm"], "reward_mean": row["reward/total"]}  # fmt: skip


def table(records: list[dict[str, Any]]) -> str:
    """A markdown table of the runs' headline figures."""
    lines = [
        "| run | completion tok/s | s/step | peak GPU MB | peak RSS MB |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['label']} | failed: {r['error']} | | | |")
            continue
        if "tokens_per_s" not in r:  # the FSDP step
            lines.append(f"| {r['label']} | | {r['wall_s']:.2f} (whole call) | | |")
            continue
        gpu = "-" if r.get("peak_gpu_mb") is None else f"{r['peak_gpu_mb']:.0f}"
        lines.append(
            f"| {r['label']} | {r['tokens_per_s']:.0f} | {r['s_per_step']:.3f} | {gpu} "
            f"| {r['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="model and records go here")
    parser.add_argument("--cpu", action="store_true", help="dry run: tiny model, CPU, float32")
    parser.add_argument("--group-size", type=int, default=None, help="G (8; dry run 2)")
    parser.add_argument("--prompts", type=int, default=None, help="P (8; dry run 2)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="T (128; dry run 8)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps (2; dry run 1)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per measured run")
    parser.add_argument(
        "--runs",
        nargs="+",
        default=None,
        metavar="LABEL",
        help="only these runs, e.g. 'creditflow[lean]' trl (default: all)",
    )
    parser.add_argument("--no-fsdp", action="store_true", help="skip the FSDP2 step")
    args = parser.parse_args(argv)
    defaults = (2, 2, 8, 1) if args.cpu else (8, 8, 128, 2)
    for name, default in zip(
        ("group_size", "prompts", "max_new_tokens", "steps"), defaults, strict=True
    ):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if not args.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device is visible; use --cpu for the dry run")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = parse_args(argv)
    model_dir = args.out / "model"
    n_params = build_model(model_dir, TINY if args.cpu else QWEN25_05B)
    say(f"random Qwen2 with {n_params:,} parameters in {model_dir}")
    shared = step_arguments(args)
    records = []
    for label, impl_args in runs(args.cpu, args.runs):
        record = run_step(label, impl_args, model_dir, shared, args.timeout_s)
        say(json.dumps(record))
        records.append(record)
    try:
        if not args.no_fsdp:
            records.append(fsdp_step(model_dir, args.cpu))
    except Exception as error:  # reported in the table; the figures above still count
        records.append({"label": "creditflow FSDP2 step", "error": repr(error)[:300]})
    (args.out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    say(table(records))
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
