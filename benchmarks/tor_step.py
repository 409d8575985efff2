"""A ToR step against a uniform GRPO step of the tor pipeline's policy, in one process, with
alternating repeats: the figure behind benchmarks/README.md's "The VL fast path".

The tor pipeline's own setup (``conf/base/parameters_tor.yml``: synthetic tasks, task-trained
tokenizer, tiny Qwen2.5-VL with a frozen ViT) is warm-started with ``--sft-steps`` SFT steps
(so completions end and the policy is as sure of most tokens as a trained one), then each
round runs ``--steps`` GRPO steps of ``uniform`` and of ``tor`` from that same warm start at
the pipeline's batch (16 prompts x 8 samples, 40 new tokens), alternating which goes first.
Each step's wall time and CPU time (the one-thread process and its reward worker, which it
waits for) are recorded; the first step of every run is dropped (warm-up). On a shared machine
the CPU time is the better estimate of the time a step would take idle; both are printed, with
the load average.

``--set key=value`` overrides a ``tor.grpo`` parameter (e.g. ``rollout={name: hf}`` and
``shared_prefix=false`` time the plain path); ``--vision-cache-bytes 0`` runs the frozen ViT
in every forward (``rollout.vision_cache``), for SFT and GRPO alike. The warm-start SFT is
timed too (``sft/*_per_step``: with ``--n-train 800 --sft-steps 400`` each picture is seen 8
times, as in the pipeline's 4,000 steps of 16 on 8,000 problems)::

    .venv/bin/python benchmarks/tor_step.py --rounds 3 --steps 6
    .venv/bin/python benchmarks/tor_step.py --set "rollout={name: hf}" --set shared_prefix=false
    .venv/bin/python benchmarks/tor_step.py --sft-steps 400 --rounds 1 --vision-cache-bytes 0
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

from creditflow.config.grpo import GRPOConfig
from creditflow.config.supervised import SFTConfig
from creditflow.pipelines.tor import nodes
from creditflow.rollout import as_visual_prompt
from creditflow.training.grpo import GRPOTrainer
from creditflow.training.grpo_runs import grpo_policy, strategy_config
from creditflow.training.rewards import BoundRewards
from creditflow.training.sft import train_sft

PHASES = ("time/rollout_s", "time/update_s", "time/no_image_pass_s", "time/tor_weights_s")


def cpu_seconds() -> float:
    """CPU time of this process and of its running children (the reward's math-verify worker
    answers every step synchronously, so an idle machine's step waits for its CPU time too);
    the children are read from /proc (Linux), else left out."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # it ended in between
                continue
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--n-train", type=int, default=800, help="synthetic training problems")
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="uniform/tor pairs")
    parser.add_argument("--set", action="append", default=[], help="tor.grpo key=value")
    parser.add_argument("--out", type=Path, default=None, help="append a JSON line here")
    parser.add_argument(
        "--vision-cache-bytes", type=int, default=None, help="0: the ViT in every forward"
    )
    return parser.parse_args()


def warm_start(model, processor, tasks, params, steps: int, cache_bytes: dict[str, int]):
    """The pipeline's SFT (the plain path, as ``run_sft`` runs it) for ``steps`` steps on
    a copy of ``model``; returns it and the SFT's wall and CPU seconds per step.
    ``cache_bytes``: ``VisionLanguagePolicy``'s cache budgets (empty: its defaults)."""
    config = SFTConfig.from_params(dict(params["sft"], steps=steps, checkpoint_every=0))
    model = copy.deepcopy(model)
    prompts = [as_visual_prompt(p) for p in nodes._train_prompts(tasks)]
    wall, cpu = time.perf_counter(), cpu_seconds()
    targets = nodes._sft_targets(tasks)
    train_sft(model, processor, prompts, targets, config, progress=False, cache_bytes=cache_bytes)
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    return model.eval(), {"wall_s_per_step": wall / steps, "cpu_s_per_step": cpu / steps}


def run(
    model, processor, tasks, params, name: str, seed: int, cache_bytes: dict[str, int]
) -> list[dict[str, float]]:
    """One GRPO run of strategy ``name``: per step (first dropped) the wall time, the CPU
    time and the engine's phase timings."""
    config, _ = strategy_config(params, params["strategies"][name])
    config = GRPOConfig(**{**config.to_dict(), "seed": seed})
    policy = grpo_policy(copy.deepcopy(model), processor, config, cache_bytes)
    rewards = BoundRewards(
        params["reward_functions"],
        list(tasks["question"]),
        list(tasks["answer"]),
        config.reward_options,
    )
    rows: list[dict[str, float]] = []
    clock = {"wall": time.perf_counter(), "cpu": cpu_seconds()}

    def record(step: int, metrics: dict[str, float]) -> None:
        wall, cpu = time.perf_counter(), cpu_seconds()
        rows.append(
            {
                "wall_s": wall - clock["wall"],
                "cpu_s": cpu - clock["cpu"],
                **{k: metrics.get(k, 0.0) for k in PHASES},
            }
        )
        clock.update(wall=wall, cpu=cpu)

    trainer = GRPOTrainer(
        policy,
        nodes._train_prompts(tasks),
        rewards,
        config,
        progress=False,
        step_callback=record,
    )
    clock.update(wall=time.perf_counter(), cpu=cpu_seconds())
    trainer.train()
    return rows[1:]


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    root = Path(__file__).resolve().parents[1]
    params = yaml.safe_load((root / "conf/base/parameters_tor.yml").read_text())["tor"]
    params["tasks"]["n_train"], params["tasks"]["n_eval"] = args.n_train, 10
    params["grpo"].update(steps=args.steps, checkpoint_every=0, log_samples_every=0)
    for setting in args.set:
        key, _, value = setting.partition("=")
        params["grpo"][key] = yaml.safe_load(value)
    load = os.getloadavg()
    tasks, _ = nodes.build_tor_tasks(None, params)
    processor = nodes.train_tor_processor(tasks, params)
    model = nodes._trainable_policy(nodes.build_tor_policy(processor, params), params)
    cache_bytes = {}
    if args.vision_cache_bytes is not None:
        cache_bytes["vision_cache_bytes"] = args.vision_cache_bytes
    model, sft = warm_start(model, processor, tasks, params, args.sft_steps, cache_bytes)
    model = nodes._trainable_policy(model, params)
    steps: dict[str, list[dict[str, float]]] = {"uniform": [], "tor": []}
    for round_ in range(args.rounds):
        order = ("uniform", "tor") if round_ % 2 == 0 else ("tor", "uniform")
        for name in order:
            steps[name] += run(model, processor, tasks, params, name, round_, cache_bytes)
    summary = {
        "settings": args.set,
        "vision_cache_bytes": args.vision_cache_bytes,
        "sft_steps": args.sft_steps,
        **{f"sft/{key}": round(value, 4) for key, value in sft.items()},
        "rounds": args.rounds,
        "steps_per_run": args.steps,
        "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    for name, rows in steps.items():
        for key in ("wall_s", "cpu_s", *PHASES):
            summary[f"{name}/{key}"] = round(statistics.median(r[key] for r in rows), 4)
    for key in ("wall_s", "cpu_s"):
        summary[f"ratio/{key}"] = round(summary[f"tor/{key}"] / summary[f"uniform/{key}"], 3)
    line = json.dumps(summary)
    sys.stdout.write(line + "\n")
    if args.out is not None:
        with args.out.open("a") as handle:
            handle.write(line + "\n")


if __name__ == "__main__":
    main()
