"""TAPO against GRPO-sum by task variant (issue 17, item 3): one table from seeds.py's.

``tapo.tasks.variant: conflict`` adds to every synthetic problem a distractor sentence that a
faithful translation keeps and a correct answer ignores (``creditflow.tasks.tapo``), so the
translation and reasoning rewards disagree more often. Run the tapo comparison at N seeds once
per variant, each in its own scratch copy of the project (``seeds.py --scratch``), e.g.::

    for v in standard conflict; do
      .venv/bin/python benchmarks/seeds.py --seeds 3 --pipelines tapo --scratch /tmp/tc/$v \\
          --params "tapo.tasks.variant=$v,..." --out /tmp/tc/results/$v.md
    done
    .venv/bin/python benchmarks/tapo_conflict.py --tables /tmp/tc/results

and this script joins the ``<variant>_tapo.csv`` / ``<variant>_tapo_per_seed.csv`` tables
seeds.py wrote into one markdown table: per variant and strategy the sign-conflict rate in
training (mean over seeds of each run's mean over steps, with its 95 % t interval over seeds),
the sampled evaluation reward's gain over the warm start and the difference to ``grpo_sum``
on seen languages, each ``mean [95 % CI]`` as the comparison table computed them (paired by
problem and seed, t over seeds; ``creditflow.reporting_stats``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from creditflow.reporting_stats import t_interval

VARIANTS = ("standard", "conflict")
CONFLICT = "train_sign_conflict_rate"


def interval_cell(mean: float, low: float, high: float) -> str:
    """``+0.024 [-0.003, +0.051]``; ``-`` without a mean.

    >>> interval_cell(0.024, -0.003, 0.051)
    '+0.024 [-0.003, +0.051]'
    """
    if pd.isna(mean):
        return "-"
    if pd.isna(low) or pd.isna(high):
        return f"{mean:+.3f} [no interval]"
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def column(row: pd.Series, stem: str, split: str = "seen") -> str:
    """An interval column of the comparison table (``<stem>_<split>`` and its bounds)."""
    return interval_cell(
        row.get(f"{stem}_{split}"),
        row.get(f"{stem}_ci_low_{split}"),
        row.get(f"{stem}_ci_high_{split}"),
    )


def variant_rows(variant: str, table: pd.DataFrame, per_seed: pd.DataFrame) -> list[list[str]]:
    """One markdown row per trained strategy of one variant's comparison tables."""
    rows = []
    for _, row in table[table["policy"] != "sft"].iterrows():
        rates = per_seed.loc[per_seed["policy"] == row["policy"], CONFLICT].dropna()
        mean, _, low, high = t_interval(rates.to_list())
        conflict = "-" if pd.isna(mean) else f"{mean:.3f} [{low:.3f}, {high:.3f}]"

        rows.append(
            [
                variant,
                str(row["policy"]),
                str(int(row["n_seeds"])),
                conflict,
                f"{row['eval_reward_seen']:.3f}",
                column(row, "eval_reward_gain"),
                column(row, "eval_reward_vs_baseline"),
                f"{row['accuracy_seen']:.3f}",
            ]
        )
    return rows


def conflict_table(tables: Path, variants: list[str]) -> str:
    header = [
        "variant",
        "strategy",
        "n seeds",
        "sign-conflict rate [95 % CI]",
        "eval reward, seen",
        "gain over warm start [95 % CI]",
        "minus grpo_sum [95 % CI]",
        "greedy accuracy, seen",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for variant in variants:
        table = pd.read_csv(tables / f"{variant}_tapo.csv")
        per_seed = pd.read_csv(tables / f"{variant}_tapo_per_seed.csv")
        warm = table.loc[table["policy"] == "sft"].iloc[0]
        lines.append(
            f"| {variant} | sft (warm start) | - | - | {warm['eval_reward_seen']:.3f} | - | - "
            f"| {warm['accuracy_seen']:.3f} |"
        )
        lines += [
            "| " + " | ".join(cells) + " |" for cells in variant_rows(variant, table, per_seed)
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=Path, required=True, help="seeds.py --out's folder")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args()
    sys.stdout.write(conflict_table(args.tables, args.variants) + "\n")


if __name__ == "__main__":
    main()
