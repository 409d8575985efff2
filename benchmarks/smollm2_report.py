"""Held-out accuracy of one ``KEDRO_ENV=smollm2 kedro run --pipelines grpo`` run, per
strategy, before (the checkpoint: the ``sft`` row) and after training, with 95 % Student t
intervals of the gain paired over the held-out prompts (``reporting.stats.t_interval``).

    python benchmarks/smollm2_report.py 2026-12-04T03.55.03.635Z

Accuracy is the ``final_number`` reward (the last number written is the right one) and
``exact_match`` (the right number alone); ``number_format`` is the asked format. ``greedy``
scores the greedy completion, ``sampled`` the mean over the sampled ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from creditflow.reporting.stats import t_interval

OUTPUT = Path(__file__).resolve().parents[1] / "data/07_model_output"
REWARDS = ("final_number", "exact_match", "number_format")


def results(policy: str, version: str) -> pd.DataFrame:
    name = f"grpo_results_{policy}"
    return pd.read_parquet(OUTPUT / f"{name}.parquet" / version / f"{name}.parquet")


def say(*parts: object) -> None:
    """A line of the report on stdout."""
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the run's dataset version (its run manifest's name)")
    parser.add_argument("--strategies", nargs="+", default=["grpo", "high_entropy_20", "random_20"])
    args = parser.parse_args()
    before = results("sft", args.version).set_index("id")
    say("| policy | score | before | after | gain [95 % interval, paired over prompts] |")
    say("|---|---|---|---|---|")
    for strategy in args.strategies:
        after = results(strategy, args.version)
        after = after[after["seed"] == after["seed"].min()].set_index("id").loc[before.index]
        for reward in REWARDS:
            for mode, column in (
                ("greedy", f"reward/{reward}"),
                ("sampled", f"sampled/reward/{reward}"),
            ):
                gain, _, low, high = t_interval((after[column] - before[column]).tolist())
                say(
                    f"| {strategy} | {mode} {reward} | {before[column].mean():.3f} | "
                    f"{after[column].mean():.3f} | {gain:+.3f} [{low:+.3f}, {high:+.3f}] |"
                )


if __name__ == "__main__":
    main()
