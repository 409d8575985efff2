"""TAPO against GRPO-sum by task variant: one table from seeds.py's.

``tapo.tasks.variant: conflict`` adds to every synthetic problem a distractor sentence that a
faithful translation keeps and a correct answer ignores (``creditflow.tasks.tapo``), so the
translation and reasoning rewards disagree more often. Run the tapo comparison at N seeds once
per variant, each in its own scratch copy of the project (``seeds.py --scratch``), e.g.::

    for v in standard conflict; do
      .venv/bin/python benchmarks/seeds.py --seeds 3 --pipelines tapo --scratch /tmp/tc/$v \\
          --params "tapo.tasks.variant=$v,..." --out /tmp/tc/results/$v.md
    done
    .venv/bin/python benchmarks/tapo_conflict.py --tables /tmp/tc/results

More seeds can come in later batches from the same warm start (the scratch project keeps its
SFT checkpoint): ``--params "...,tapo.grpo.seed=3" --out /tmp/tc/results/<variant>_b.md``
trains GRPO seeds 3, 4, 5. This script reads every ``<variant>*_tapo_per_seed.csv`` seeds.py
wrote (one file per batch) and writes one markdown table: per variant and strategy the
sign-conflict rate in training (each run's mean over its steps), the sampled evaluation
reward's gain over the warm start and its difference to ``grpo_sum`` on seen languages, each as
mean over seeds and 95 % t interval over seeds (``creditflow.reporting.stats.t_interval``).
A run's gain is its paired mean difference over the same evaluation problems and draws, so
these are the comparison table's intervals with the batches pooled.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from creditflow.reporting.stats import t_interval

VARIANTS = ("standard", "conflict")
BASELINE = "grpo_sum"
WARM_START = "sft"
CONFLICT = "train_sign_conflict_rate"
GAIN = "eval_reward_gain_seen"


def interval_cell(values: list[float], signed: bool = True) -> str:
    """``mean [low, high]`` of the 95 % t interval over ``values``.

    >>> interval_cell([1.0, 2.0, 3.0])  # t(2) = 4.3027, se = 0.5774
    '+2.000 [-0.484, +4.484]'
    """
    mean, _, low, high = t_interval(values)
    form = "+.3f" if signed else ".3f"
    if pd.isna(mean):
        return "-"
    if pd.isna(low):
        return f"{mean:{form}} [no interval]"
    return f"{mean:{form}} [{low:{form}}, {high:{form}}]"


def pooled_per_seed(tables: Path, variant: str) -> pd.DataFrame:
    """Every batch's per-seed rows of one variant, ``batch`` naming the file they came from."""
    paths = sorted(tables.glob(f"{variant}*_tapo_per_seed.csv"))
    if not paths:
        raise FileNotFoundError(f"no {variant}*_tapo_per_seed.csv in {tables}: run seeds.py --out")
    return pd.concat(
        [pd.read_csv(path).assign(batch=path.name) for path in paths], ignore_index=True
    )


def variant_rows(variant: str, per_seed: pd.DataFrame) -> list[list[str]]:
    """The warm start's row, then one row per trained strategy of one variant."""
    warm = per_seed[per_seed["policy"] == WARM_START]
    rows = [[variant, "sft (warm start)", "-", "-", *_sampled(warm), "-", "-"]]
    runs = per_seed[per_seed["policy"] != WARM_START].set_index(["policy", "batch", "seed"])
    runs = runs.sort_index()
    baseline = runs.loc[BASELINE, GAIN]
    for policy in per_seed.loc[per_seed["policy"] != WARM_START, "policy"].unique():
        run = runs.loc[policy]
        vs = "-"
        if policy != BASELINE:
            # Paired by run: the same batch and seed index start from the same warm start.
            vs = interval_cell((run[GAIN] - baseline).dropna().to_list())
        rows.append(
            [
                variant,
                policy,
                str(len(run)),
                interval_cell(run[CONFLICT].to_list(), signed=False),
                *_sampled(run),
                interval_cell(run[GAIN].to_list()),
                vs,
            ]
        )
    return rows


def _sampled(rows: pd.DataFrame) -> list[str]:
    """Means over seeds of the sampled evaluation: reward, and its chrF++ / accuracy."""
    return [
        f"{rows['eval_reward_seen'].mean():.3f}",
        f"{rows['sampled_chrf_seen'].mean():.3f} / {rows['sampled_accuracy_seen'].mean():.3f}",
    ]


def conflict_table(tables: Path, variants: list[str]) -> str:
    header = [
        "variant",
        "strategy",
        "n seeds",
        "sign-conflict rate [95 % CI]",
        "eval reward, seen",
        "its chrF++ / accuracy",
        "gain over warm start [95 % CI]",
        f"minus {BASELINE} [95 % CI]",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for variant in variants:
        for cells in variant_rows(variant, pooled_per_seed(tables, variant)):
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=Path, required=True, help="seeds.py --out's folder")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args()
    sys.stdout.write(conflict_table(args.tables, args.variants) + "\n")


if __name__ == "__main__":
    main()
