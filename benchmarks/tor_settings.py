"""One GRPO setting of the tor pipeline, trained from a project's saved warm start and scored
greedily and with samples, paired with the warm start problem by problem: the script behind
benchmarks/README.md's "Greedy and sampled accuracy" table.

The pipeline trains five strategies per run; trying a learning rate or a budget that way costs
five GRPO runs. This runs one strategy (``uniform`` unless ``--strategy``) from the newest
``tor_sft_policy`` of a project that ran ``kedro run --pipelines tor`` (or a ``seeds.py
--scratch`` copy of it), on that project's synthetic tasks, and scores it on the held-out
synthetic problems as ``evaluate_tor_policy`` does (greedy, plus
``tor.evaluation.samples_per_problem`` samples per problem from one seed, common random
numbers with the warm start's draw). The warm start's scores are computed once and kept in
``--out``::

    .venv/bin/python benchmarks/tor_settings.py --project /tmp/tor_seeds/a --name lr1e-4 \\
        --set learning_rate=1e-4 --set steps=200 --set prompts_per_step=16 --out /tmp/tor_settings

``--set`` overrides any ``tor.grpo`` parameter. One JSON line per run is appended to
``<out>/runs.jsonl``: training time, greedy and sampled accuracy, their mean paired gains over
the warm start with standard errors over problems (one GRPO seed: evaluation noise only), and
the training reward over the first and last 5 steps.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from creditflow.pipelines.tor import nodes
from creditflow.training.checkpoint import CheckpointStore

GREEDY, SAMPLED = "reward/reasoning", "sampled/reward/reasoning"


def parse_setting(text: str) -> tuple[str, Any]:
    """``key=value`` with the value read as YAML, and a number in any float syntax.

    >>> parse_setting("learning_rate=1e-4"), parse_setting("steps=200")
    (('learning_rate', 0.0001), ('steps', 200))
    """
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--set {text!r} is not key=value")
    value = yaml.safe_load(raw)
    if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    return key, value


def paired_summary(base: pd.DataFrame, scored: pd.DataFrame) -> dict[str, float]:
    """Greedy and sampled accuracy of ``scored`` and their mean paired gains over ``base``
    (the same problems, row by row), with standard errors over problems."""
    out: dict[str, float] = {}
    for name, column in (("greedy", GREEDY), ("sampled", SAMPLED)):
        gain = scored[column].to_numpy() - base[column].to_numpy()
        out[name] = float(scored[column].mean())
        out[f"{name}_gain"] = float(gain.mean())
        out[f"{name}_gain_se"] = float(pd.Series(gain).sem())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, required=True, help="a project with a tor run")
    parser.add_argument("--name", required=True, help="this run's label in runs.jsonl")
    parser.add_argument("--strategy", default="uniform", help="a tor.strategies entry")
    parser.add_argument("--set", action="append", default=[], help="tor.grpo key=value")
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    args = parser.parse_args()

    bootstrap_project(args.project)
    with KedroSession.create(project_path=args.project) as session:
        context = session.load_context()
        params = copy.deepcopy(context.params["tor"])
        sft = context.catalog.load("tor_sft_policy")
        processor = context.catalog.load("tor_processor")
    for key, value in map(parse_setting, args.set):
        params["grpo"][key] = value
    # Held-out synthetic problems only: the real sets are not what the setting is tuned on.
    params["evaluation"].update(tabmwp_max=0, mathvision_max=0)
    if params["tasks"]["source"] != "synthetic":
        parser.error("tor_settings.py runs on the synthetic tasks (tor.tasks.source: synthetic)")
    train, held_out = nodes.build_tor_tasks(None, params)
    no_rows = pd.DataFrame(columns=["id", "image_path", "question", "answer", "choices"])

    def evaluate(model) -> pd.DataFrame:
        return nodes.evaluate_tor_policy(model, processor, held_out, no_rows, no_rows, params)

    args.out.mkdir(parents=True, exist_ok=True)
    warm_file = args.out / "sft.parquet"
    if not warm_file.exists():
        evaluate(sft).to_parquet(warm_file)
    base = pd.read_parquet(warm_file)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as checkpoints:
        model, metrics, _ = nodes.train_tor_policy(
            sft,
            processor,
            train,
            CheckpointStore(checkpoints),
            params,
            params["strategies"][args.strategy],
        )
    train_s = time.perf_counter() - start
    scored = evaluate(model)
    scored.to_parquet(args.out / f"{args.name}.parquet")
    reward = metrics["reward/total"].to_numpy()
    row = {
        "name": args.name,
        "strategy": args.strategy,
        "settings": " ".join(args.set),
        "train_s": round(train_s, 1),
        **paired_summary(base, scored),
        "train_reward_first": float(reward[:5].mean()),
        "train_reward_last": float(reward[-5:].mean()),
    }
    with open(args.out / "runs.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
    sys.stdout.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
