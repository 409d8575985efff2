"""One leaderboard of every strategy across the benches (``creditflow.reporting.leaderboard``):
per bench and method, the gain over uniform GRPO with its 95 % interval and minimum detectable
effect, the robust aggregates over the Credit Gym's sweep points (interquartile mean,
probability of improvement; stratified bootstrap), the credit recovery on the gym, the step
time relative to GRPO on the gym, and the verdicts of the claim cards naming the method.

It reads the benches' own per-seed tables, so the runs are the pipelines' (the same seeds for
every method of a bench):

- ``--gym``: ``credit_gym_per_seed.csv`` of ``kedro run --pipelines credit_gym`` (every shipped
  strategy of ``conf/base/parameters_credit_gym.yml``), judged against its knob defaults;
- ``--testbed GROUP=CSV`` (repeatable; a group named again adds a batch of seeds): a tapo or
  tor per-seed table of ``benchmarks/claims.py`` / ``seeds.py``, compared on ``claims.METRIC``
  with its first strategy of ``benchmarks/conf/claims.yml`` as the baseline.

``--step-time-repeats N`` times each gym strategy's run at the default point (seed 0) N times,
alternating strategies, and reports the median ratio of its time to GRPO's (0: skipped).

    .venv/bin/python benchmarks/leaderboard.py \\
        --gym data/08_reporting/credit_gym_per_seed.csv/<version>/credit_gym_per_seed.csv \\
        --testbed tapo=benchmarks/results/claims_tapo_5_tapo_per_seed.csv \\
        --step-time-repeats 3 --out benchmarks/results/leaderboard.md
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from creditflow.reporting.credit_gym import claim_cards
from creditflow.reporting.leaderboard import gym_leaderboard, markdown, testbed_leaderboard
from creditflow.tasks.credit_gym import GymKnobs
from creditflow.training.gym import GymSetup, run_strategy

HERE = Path(__file__).resolve().parent
GYM_CONF = HERE.parent / "conf/base/parameters_credit_gym.yml"


def _claims_module():
    """benchmarks/claims.py (its cards and testbed metrics), loaded by path."""
    spec = importlib.util.spec_from_file_location("bench_claims", HERE / "claims.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def gym_step_time_ratios(params: dict, repeats: int) -> dict[str, float]:
    """Per active gym strategy, the median over ``repeats`` alternating rounds of its run's
    wall time at the default point (seed 0) over uniform GRPO's in the same round."""
    torch.set_num_threads(params.get("torch_threads") or 1)
    setup = GymSetup.from_params(params)
    knobs = GymKnobs(**params["defaults"])
    strategies = {n: s for n, s in params["strategies"].items() if s is not None}
    ratios: dict[str, list[float]] = {name: [] for name in strategies}
    for round_ in range(repeats):
        order = list(strategies) if round_ % 2 == 0 else list(reversed(strategies))
        seconds = {}
        for name in order:
            started = time.perf_counter()
            run_strategy(setup, knobs, params["seed"], name, strategies[name])
            seconds[name] = time.perf_counter() - started
        for name in strategies:
            ratios[name].append(seconds[name] / seconds[params["baseline"]])
    return {name: statistics.median(values) for name, values in ratios.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gym", type=Path, help="the Credit Gym's per-seed table")
    parser.add_argument("--testbed", nargs="*", default=[], metavar="GROUP=CSV")
    parser.add_argument("--step-time-repeats", type=int, default=0)
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--out", type=Path, help="write the markdown here (and a CSV beside)")
    args = parser.parse_args()
    if args.gym is None and not args.testbed:
        parser.error("give --gym CSV and/or --testbed GROUP=CSV")
    parts = []
    if args.gym is not None:
        params = yaml.safe_load(GYM_CONF.read_text(encoding="utf-8"))["credit_gym"]
        per_seed = pd.read_csv(args.gym)
        cards = claim_cards(per_seed, params["defaults"])
        ratios = (
            gym_step_time_ratios(params, args.step_time_repeats) if args.step_time_repeats else None
        )
        parts.append(
            gym_leaderboard(
                per_seed, params["defaults"], params["baseline"], cards, ratios, args.reps
            )
        )
    if args.testbed:
        claims = _claims_module()
        tables = claims.joined_per_seed(claims.per_seed_tables(args.testbed))
        cards = claims.claim_table(list(claims.CLAIMS), tables)
        for group, table in tables.items():
            baseline = next(iter(claims.STRATEGIES[group]))
            mine = cards[cards["testbed"] == group] if not cards.empty else cards
            parts.append(testbed_leaderboard(group, table, claims.METRIC[group], baseline, mine))
    board = pd.concat(parts, ignore_index=True)
    text = markdown(board)
    sys.stdout.write(text + "\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        board.to_csv(args.out.with_suffix(".csv"), index=False)
        command = " ".join(["benchmarks/leaderboard.py", *sys.argv[1:]])
        args.out.write_text(f"`{command}`\n\n{text}\n", encoding="utf-8")


if __name__ == "__main__":
    main()
