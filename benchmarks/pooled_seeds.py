"""The tapo or tor comparison over GRPO seeds run in several batches: one table.

``seeds.py --seeds N --pipelines <group>`` trains every strategy N times from one warm start.
The seeds can run as batches, in parallel on a shared machine or one after the other when a
session's time runs out, each in its own scratch project or the same one (the warm start is
deterministic, so each batch trains the same one), e.g.::

    .venv/bin/python benchmarks/seeds.py --seeds 3 --pipelines tor --scratch /tmp/ts/a \\
        --params "tracking.enabled=false" --out /tmp/ts/results/a.md
    .venv/bin/python benchmarks/seeds.py --seeds 2 --pipelines tor --scratch /tmp/ts/b \\
        --params "tracking.enabled=false,tor.grpo.seed=3" --out /tmp/ts/results/b.md
    .venv/bin/python benchmarks/pooled_seeds.py --group tor --tables /tmp/ts/results

This script reads every ``*_<group>_per_seed.csv`` seeds.py wrote (one per batch), checks that
the warm start scored the same in each (else the batches did not share it), and writes per
strategy each metric of ``GROUPS[group]`` (tor: the greedy accuracy on the held-out synthetic
problems and, where the evaluation sampled, the accuracy of the completions sampled as in
training; tapo: the sampled evaluation reward on the seen and the unseen languages), its gain
over the warm start and its difference to the group's baseline, each as mean over all seeds
with a 95 % t interval over seeds (``creditflow.reporting.stats.t_interval``). Every policy is
scored on the same problems (with the same evaluation draws), so a run's value minus the warm
start's is its paired mean difference: these are the comparison table's intervals with the
batches pooled.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from creditflow.reporting.stats import interval_text, minimum_detectable_effect, t_interval

WARM_START = "sft"


@dataclass(frozen=True)
class Group:
    """What a group's pooled table shows: its baseline strategy and, per per-seed column, the
    heading of its value."""

    baseline: str
    metrics: dict[str, str]


GROUPS = {
    "tor": Group(
        "uniform",
        {
            "accuracy_synthetic": "greedy accuracy",
            "sampled_accuracy_synthetic": "sampled accuracy",
        },
    ),
    "tapo": Group(
        "grpo_sum",
        {"eval_reward_seen": "eval reward seen", "eval_reward_unseen": "eval reward unseen"},
    ),
}


def interval_cell(values: list[float]) -> str:
    """``mean [low, high]`` of the 95 % t interval over ``values``, a null with its minimum
    detectable effect (``reporting.stats.interval_text``).

    >>> interval_cell([0.02, 0.04, 0.06])  # se = 0.01155, t(2) = 4.3027, t_0.8(2) = 1.0607
    '+0.040 [-0.010, +0.090] not detectable (MDE 0.062)'
    >>> interval_cell([0.02, 0.03, 0.04])
    '+0.030 [+0.005, +0.055]'
    """
    mean, se, low, high = t_interval(values)
    return interval_text(mean, low, high, minimum_detectable_effect(se, len(values)))


def pooled_per_seed(tables: Path, group: str = "tor") -> pd.DataFrame:
    """Every batch's per-seed rows of ``group``, ``batch`` naming the file they came from."""
    paths = sorted(tables.glob(f"*_{group}_per_seed.csv"))
    if not paths:
        raise FileNotFoundError(f"no *_{group}_per_seed.csv in {tables}: run seeds.py --out")
    return pd.concat(
        [pd.read_csv(path).assign(batch=path.name) for path in paths], ignore_index=True
    )


def pooled_table(per_seed: pd.DataFrame, group: str = "tor") -> str:
    """The markdown table: the warm start's row, then one row per trained strategy; per metric
    of ``GROUPS[group]`` the per-seed tables have, the mean, the gain over the warm start and
    the difference to the group's baseline.

    Raises:
        ValueError: the batches' warm starts scored differently, or two batches trained the
            same seed (they would count twice).
    """
    baseline_policy = GROUPS[group].baseline
    metrics = {c: name for c, name in GROUPS[group].metrics.items() if c in per_seed}
    warm = per_seed[per_seed["policy"] == WARM_START]
    for column in metrics:
        if warm[column].nunique() != 1:
            scores = dict(zip(warm["batch"], warm[column], strict=True))
            raise ValueError(
                f"the batches' warm starts differ ({column}: {scores}): pool only one warm start"
            )
    runs = per_seed[per_seed["policy"] != WARM_START]
    repeated = runs.duplicated(["policy", "seed"])
    if repeated.any():
        seeds = sorted(int(seed) for seed in runs.loc[repeated, "seed"].unique())
        raise ValueError(f"seeds {seeds} occur in several batches: give each batch its own")
    sft = {column: float(warm[column].iloc[0]) for column in metrics}
    # The baseline first, then the strategies in the order seeds.py wrote them.
    policies = [baseline_policy, *(p for p in runs["policy"].unique() if p != baseline_policy)]
    runs = runs.set_index(["policy", "seed"]).sort_index()
    header = ["policy", "n seeds"]
    for name in metrics.values():
        header += [name, "gain over sft [95 % CI]", f"vs {baseline_policy} [95 % CI]"]
    header.append("train reward first / last")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    warm_cells = [WARM_START, "-"]
    for column in metrics:
        warm_cells += [f"{sft[column]:.3f}", "-", "-"]
    lines.append("| " + " | ".join([*warm_cells, "-"]) + " |")
    for policy in policies:
        run = runs.loc[policy]
        cells = [policy, str(len(run))]
        for column in metrics:
            # Paired by seed: the same seed of every strategy starts from the same warm start.
            baseline = runs.loc[baseline_policy, column]
            vs = (
                "-"
                if policy == baseline_policy
                else interval_cell((run[column] - baseline).to_list())
            )
            cells += [
                f"{run[column].mean():.3f}",
                interval_cell((run[column] - sft[column]).to_list()),
                vs,
            ]
        cells.append(
            f"{run['train_reward_first'].mean():.3f} / {run['train_reward_last'].mean():.3f}"
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=Path, required=True, help="seeds.py --out's folder")
    parser.add_argument("--group", choices=list(GROUPS), default="tor")
    args = parser.parse_args()
    table = pooled_table(pooled_per_seed(args.tables, args.group), args.group)
    sys.stdout.write(table + "\n")


if __name__ == "__main__":
    main()
