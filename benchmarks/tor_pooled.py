"""The tor comparison over GRPO seeds run in several batches (issue 17, item 2): one table.

``seeds.py --seeds N --pipelines tor`` trains every strategy N times from one warm start. On a
shared machine the seeds can run as batches in parallel, each in its own scratch project
(the warm start is deterministic, so each batch trains the same one), e.g.::

    .venv/bin/python benchmarks/seeds.py --seeds 3 --pipelines tor --scratch /tmp/ts/a \\
        --params "tracking.enabled=false" --out /tmp/ts/results/a.md
    .venv/bin/python benchmarks/seeds.py --seeds 2 --pipelines tor --scratch /tmp/ts/b \\
        --params "tracking.enabled=false,tor.grpo.seed=3" --out /tmp/ts/results/b.md
    .venv/bin/python benchmarks/tor_pooled.py --tables /tmp/ts/results

This script reads every ``*_tor_per_seed.csv`` seeds.py wrote (one per batch), checks that
the warm start scored the same in each (else the batches did not share it), and writes per
strategy the greedy accuracy on the held-out synthetic problems, its gain over the warm start
and its difference to ``uniform``, each as mean over all seeds with a 95 % t interval over
seeds (``creditflow.reporting_stats.t_interval``). Every policy is scored on the same
problems, so a run's accuracy minus the warm start's is its paired mean difference: these are
the comparison table's intervals with the batches pooled.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from creditflow.reporting_stats import t_interval

BASELINE = "uniform"
WARM_START = "sft"
ACCURACY = "accuracy_synthetic"


def interval_cell(values: list[float]) -> str:
    """``mean [low, high]`` of the 95 % t interval over ``values``.

    >>> interval_cell([0.02, 0.04, 0.06])  # se = 0.01155, t(2) = 4.3027
    '+0.040 [-0.010, +0.090]'
    """
    mean, _, low, high = t_interval(values)
    if pd.isna(mean):
        return "-"
    if pd.isna(low):
        return f"{mean:+.3f} [no interval]"
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def pooled_per_seed(tables: Path) -> pd.DataFrame:
    """Every batch's per-seed rows, ``batch`` naming the file they came from."""
    paths = sorted(tables.glob("*_tor_per_seed.csv"))
    if not paths:
        raise FileNotFoundError(f"no *_tor_per_seed.csv in {tables}: run seeds.py --out")
    return pd.concat(
        [pd.read_csv(path).assign(batch=path.name) for path in paths], ignore_index=True
    )


def pooled_table(per_seed: pd.DataFrame) -> str:
    """The markdown table: the warm start's row, then one row per trained strategy.

    Raises:
        ValueError: the batches' warm starts scored differently, or two batches trained the
            same seed (they would count twice).
    """
    warm = per_seed[per_seed["policy"] == WARM_START]
    if warm[ACCURACY].nunique() != 1:
        scores = dict(zip(warm["batch"], warm[ACCURACY], strict=True))
        raise ValueError(f"the batches' warm starts differ ({scores}): pool only one warm start")
    runs = per_seed[per_seed["policy"] != WARM_START]
    repeated = runs.duplicated(["policy", "seed"])
    if repeated.any():
        seeds = sorted(int(seed) for seed in runs.loc[repeated, "seed"].unique())
        raise ValueError(f"seeds {seeds} occur in several batches: give each batch its own")
    sft = float(warm[ACCURACY].iloc[0])
    # The baseline first, then the strategies in the order seeds.py wrote them.
    policies = [BASELINE, *(p for p in runs["policy"].unique() if p != BASELINE)]
    runs = runs.set_index(["policy", "seed"]).sort_index()
    baseline = runs.loc[BASELINE, ACCURACY]
    header = [
        "policy",
        "n seeds",
        "accuracy",
        "gain over sft [95 % CI]",
        f"vs {BASELINE} [95 % CI]",
        "train reward first / last",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.append(f"| {WARM_START} | - | {sft:.3f} | - | - | - |")
    for policy in policies:
        run = runs.loc[policy]
        # Paired by seed: the same seed of every strategy starts from the same warm start.
        vs = "-" if policy == BASELINE else interval_cell((run[ACCURACY] - baseline).to_list())
        reward = f"{run['train_reward_first'].mean():.3f} / {run['train_reward_last'].mean():.3f}"
        cells = [policy, str(len(run)), f"{run[ACCURACY].mean():.3f}"]
        cells += [interval_cell((run[ACCURACY] - sft).to_list()), vs, reward]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=Path, required=True, help="seeds.py --out's folder")
    args = parser.parse_args()
    sys.stdout.write(pooled_table(pooled_per_seed(args.tables)) + "\n")


if __name__ == "__main__":
    main()
