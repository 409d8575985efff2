"""Claim cards: published credit-assignment claims, each with its expected sign written down
before the run, replayed on the tapo and tor testbeds over several GRPO seeds.

Each card names two strategies of one testbed, a metric of the comparison's per-seed table
and the sign the claim predicts for ``policy - reference``. The runs are the pipelines'
own (``kedro run --pipelines <group>`` in a scratch copy of the project whose strategy list is
the cards' strategies, through ``benchmarks/seeds.py``'s machinery); the difference is paired
seed by seed (same GRPO seed, same evaluation draws) and its 95 % interval is a t interval over
the per-seed differences (``creditflow.reporting.stats.t_interval``), with the minimum
detectable effect at 80 % power of the same seeds (``minimum_detectable_effect``). Verdicts
(``verdict``):

- ``reproduced``: the interval excludes 0 on the expected side;
- ``contradicted``: it excludes 0 on the other side;
- ``not detectable at this budget (MDE x)``: it holds 0; an effect smaller than x could not
  have been seen with these seeds, so the claim is neither confirmed nor refuted;
- ``identical: no signal at this budget``: every seed's difference is exactly 0 (the two
  strategies trained the same policy, e.g. a budget so small that no group's rewards differ);
- ``no interval``: fewer than two seeds.

The shuffled-advantages cards are the testbed's positive control: GRPO must beat a policy
whose credit is unrelated to its reward. If that is not detected, no other verdict of the same
testbed and budget means anything.

The full run (``benchmarks/README.md``, "Claim cards")::

    .venv/bin/python benchmarks/claims.py --seeds 5 --scratch /tmp/claims \\
        --out benchmarks/results/claims.md

The Credit Gym's cards (``creditflow.reporting.credit_gym.GYM_CLAIMS``: TAPO against summed
GRPO along the reward conflict, ToR against uniform along perception dependence, top-20 %
entropy where forks are and are not high-entropy, random 20 % of tokens against full GRPO, and
the gym's two positive controls) are judged by ``kedro run --pipelines credit_gym`` itself
(``credit_gym_claims.csv``); ``--gym`` reads them again from a saved per-seed table::

    .venv/bin/python benchmarks/claims.py --gym data/08_reporting/credit_gym_per_seed.csv/<version>/credit_gym_per_seed.csv

tapo: 5 strategies x 5 seeds at the default budget (~75 s of GRPO + ~30 s of evaluation per
run on the idle 2-core reference machine: ~45 min); tor: 5 strategies x 5 seeds after its
4,000-step warm start (hours on 2 cores). ``--pipelines tapo`` runs one testbed; ``--params``
takes ``kedro run``'s syntax for overrides (e.g. a smaller budget).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from creditflow.reporting.credit_gym import GYM_CLAIMS, claim_cards
from creditflow.reporting.stats import interval_text, minimum_detectable_effect, t_interval

HERE = Path(__file__).resolve().parent
# The strategies each testbed runs for the cards (its tasks, warm start and budget are the
# pipeline's defaults), one YAML shared with seeds.py's --strategies.
STRATEGIES_FILE = HERE / "conf/claims.yml"
STRATEGIES: dict[str, dict[str, dict[str, Any]]] = yaml.safe_load(
    STRATEGIES_FILE.read_text(encoding="utf-8")
)
# The per-seed column each testbed's cards compare: tapo's expected evaluation reward under
# training-time sampling (translation + reasoning, seen languages), tor's sampled accuracy on
# the held-out synthetic problems (both what GRPO maximises, and the least noisy readings).
METRIC = {"tapo": "eval_reward_seen", "tor": "sampled_accuracy_synthetic"}


@dataclass(frozen=True)
class Claim:
    """``policy - reference`` on ``group``'s ``METRIC`` is expected to have sign ``expected``
    (+1 or -1); ``source`` says whose claim it is."""

    name: str
    group: str
    policy: str
    reference: str
    expected: int
    source: str


CLAIMS = (
    Claim("shuffled advantages < GRPO (positive control)", "tapo", "shuffled", "grpo_sum", -1,
          "the testbed itself: credit unrelated to reward must not learn"),
    Claim("TAPO > summed GRPO", "tapo", "tapo", "grpo_sum", +1,
          "TAPO: step-level advantages beat trajectory-level ones"),
    Claim("top-20 % entropy tokens >= all tokens", "tapo", "high_entropy_20", "grpo_sum", +1,
          "Wang et al. 2025: the high-entropy minority carries the learning"),
    Claim("bottom-80 % entropy tokens < all tokens", "tapo", "low_entropy_80", "grpo_sum", -1,
          "Wang et al. 2025: the low-entropy majority learns clearly less"),
    Claim("bottom-80 % < top-20 % entropy tokens", "tapo", "low_entropy_80", "high_entropy_20",
          -1, "Wang et al. 2025: the study's ordering"),
    Claim("shuffled advantages < GRPO (positive control)", "tor", "shuffled", "uniform", -1,
          "the testbed itself: credit unrelated to reward must not learn"),
    Claim("ToR > uniform GRPO", "tor", "tor", "uniform", +1,
          "ToR: reweighting reasoning and perception tokens beats uniform weights"),
    Claim("ToR perception-only < full ToR", "tor", "tor_perception_only", "tor", -1,
          "ToR's ablation: both token sets are needed"),
    Claim("ToR reasoning-only < full ToR", "tor", "tor_reasoning_only", "tor", -1,
          "ToR's ablation: both token sets are needed"),
)  # fmt: skip

REPRODUCED, CONTRADICTED, NO_INTERVAL = "reproduced", "contradicted", "no interval"
IDENTICAL = "identical: no signal at this budget"


def verdict(expected: int, low: float, high: float, mde: float) -> str:
    """The reading of a 95 % interval ``[low, high]`` of ``policy - reference`` against the
    expected sign (module docstring).

    >>> verdict(-1, -0.05, -0.01, 0.02), verdict(+1, -0.05, -0.01, 0.02)
    ('reproduced', 'contradicted')
    >>> verdict(+1, -0.01, 0.02, 0.031), verdict(+1, float("nan"), float("nan"), float("nan"))
    ('not detectable at this budget (MDE 0.031)', 'no interval')
    >>> verdict(-1, 0.0, 0.0, 0.0)
    'identical: no signal at this budget'
    """
    if pd.isna(low) or pd.isna(high):
        return NO_INTERVAL
    if low == high == 0.0:
        return IDENTICAL
    if low > 0 or high < 0:
        return REPRODUCED if (low > 0) == (expected > 0) else CONTRADICTED
    return f"not detectable at this budget (MDE {mde:.3f})"


def claim_row(claim: Claim, per_seed: pd.DataFrame) -> dict[str, Any]:
    """One row of the claim table from a comparison's per-seed table (one row per (policy,
    seed); the warm start's row has no seed): the per-seed differences ``policy - reference``
    of ``METRIC[claim.group]``, paired by seed, their mean, 95 % t interval, MDE and verdict."""
    metric = METRIC[claim.group]
    seeded = per_seed.dropna(subset=["seed"])
    wide = seeded.pivot_table(index="seed", columns="policy", values=metric, aggfunc="first")
    missing = sorted({claim.policy, claim.reference} - set(wide.columns))
    if missing:
        raise ValueError(f"{claim.name}: the per-seed table has no rows of {missing}")
    differences = (wide[claim.policy] - wide[claim.reference]).dropna()
    mean, se, low, high = t_interval(differences.to_numpy())
    mde = minimum_detectable_effect(se, len(differences))
    return {
        "claim": claim.name,
        "testbed": claim.group,
        "difference": f"{claim.policy} - {claim.reference} ({metric})",
        "expected": "> 0" if claim.expected > 0 else "< 0",
        "n_seeds": len(differences),
        "measured": interval_text(mean, low, high),
        "mean": mean,
        "ci_low": low,
        "ci_high": high,
        "mde": mde,
        "verdict": verdict(claim.expected, low, high, mde),
        "source": claim.source,
    }


NOT_RUN = "not run: a strategy of the card is absent from the per-seed table"


def claim_table(claims: list[Claim], per_seed: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per claim whose testbed has a per-seed table (``per_seed``: group -> table). A
    card whose strategies the table lacks (a run of only some of the cards' strategies, read
    with ``--per-seed``) is listed as not run, so the table says which claims were judged."""
    rows = []
    for claim in claims:
        if claim.group not in per_seed:
            continue
        policies = set(per_seed[claim.group]["policy"])
        if {claim.policy, claim.reference} <= policies:
            rows.append(claim_row(claim, per_seed[claim.group]))
        else:
            rows.append(not_run_row(claim))
    return pd.DataFrame(rows)


def not_run_row(claim: Claim) -> dict[str, Any]:
    nan = float("nan")
    return {
        "claim": claim.name,
        "testbed": claim.group,
        "difference": f"{claim.policy} - {claim.reference} ({METRIC[claim.group]})",
        "expected": "> 0" if claim.expected > 0 else "< 0",
        "n_seeds": 0,
        "measured": "-",
        "mean": nan,
        "ci_low": nan,
        "ci_high": nan,
        "mde": nan,
        "verdict": NOT_RUN,
        "source": claim.source,
    }


def markdown(table: pd.DataFrame) -> str:
    columns = ["claim", "testbed", "difference", "expected", "n_seeds", "measured", "verdict"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for _, row in table.iterrows()]
    return "\n".join(lines)


GYM_DEFAULTS_FILE = HERE.parent / "conf/base/parameters_credit_gym.yml"


def gym_cards(per_seed: pd.DataFrame, defaults: dict[str, float] | None = None) -> pd.DataFrame:
    """The Credit Gym's cards (``GYM_CLAIMS``) from its per-seed table, the default point
    being the knob defaults of ``conf/base/parameters_credit_gym.yml`` unless given."""
    if defaults is None:
        conf = yaml.safe_load(GYM_DEFAULTS_FILE.read_text(encoding="utf-8"))
        defaults = conf["credit_gym"]["defaults"]
    return claim_cards(per_seed, defaults, GYM_CLAIMS)


def gym_markdown(cards: pd.DataFrame) -> str:
    columns = ["claim", "knob", "dose", "n_seeds", "measured", "verdict"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += [
        "| " + " | ".join(str(row.get(c, "")) for c in columns) + " |"
        for _, row in cards.iterrows()
    ]
    return "\n".join(lines)


def _seeds_module():
    """benchmarks/seeds.py (its scratch project and session run), loaded by path: the
    benchmarks are scripts, not a package."""
    spec = importlib.util.spec_from_file_location("bench_seeds", HERE / "seeds.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="GRPO runs per strategy (>= 2)")
    parser.add_argument("--pipelines", nargs="+", choices=list(STRATEGIES), default=["tapo", "tor"])
    parser.add_argument("--params", default="", help="more overrides, as kedro run --params")
    parser.add_argument("--scratch", type=Path, help="the scratch project (runs the testbeds)")
    parser.add_argument("--out", type=Path, help="write the markdown table here (and a CSV)")
    parser.add_argument(
        "--per-seed",
        nargs="+",
        metavar="GROUP=CSV",
        help="read the cards from saved per-seed tables instead of running (a seeds.py --out "
        "<stem>_<group>_per_seed.csv holding the cards' strategies; a group named again adds "
        "a batch of seeds)",
    )
    parser.add_argument(
        "--gym",
        type=Path,
        metavar="CSV",
        help="print the Credit Gym's cards from its per-seed table (credit_gym_per_seed.csv)",
    )
    args = parser.parse_args()
    if args.gym:
        cards = gym_cards(pd.read_csv(args.gym))
        write(f"Credit Gym ({args.gym})\n\n{gym_markdown(cards)}\n", cards, args.out)
        return
    if args.per_seed:
        per_seed = joined_per_seed(per_seed_tables(args.per_seed))
        table = claim_table(list(CLAIMS), per_seed)
        seeds = ", ".join(f"{g} {int(t['seed'].nunique())} seeds" for g, t in per_seed.items())
        text = f"{seeds} (from {' '.join(args.per_seed)})\n\n{markdown(table)}\n"
        write(text, table, args.out)
        return
    if args.scratch is None:
        parser.error("give --scratch DIR to run the testbeds, or --per-seed GROUP=CSV")
    if args.seeds < 2:
        parser.error("--seeds must be >= 2: an interval over seeds needs two")
    logging.basicConfig(level=logging.WARNING)
    seeds = _seeds_module()
    project = seeds.scratch_project(args.scratch, args.pipelines)
    for group in args.pipelines:
        seeds.set_strategies(
            project, group, STRATEGIES[group], baseline=next(iter(STRATEGIES[group]))
        )
    # The pipelines read their strategy lists from the project at or above the working
    # directory (pipelines.comparison.project_root) when they are built: the scratch one.
    os.chdir(project)
    seeds.bootstrap_project(project)
    extra = seeds.parse_params(args.params)
    per_seed, minutes = {}, {}
    for group in args.pipelines:
        started = time.perf_counter()
        params = seeds.merged(extra, {group: {"comparison": {"n_seeds": args.seeds}}})
        tables = seeds.run_comparison(project, group, params)
        per_seed[group] = tables[f"{group}_per_seed_comparison"]
        minutes[group] = (time.perf_counter() - started) / 60
    table = claim_table(list(CLAIMS), per_seed)
    timing = ", ".join(f"{g} {m:.1f} min" for g, m in minutes.items())
    text = f"{args.seeds} seeds ({timing})\n\n{markdown(table)}\n"
    write(text, table, args.out)


def per_seed_tables(items: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """``GROUP=CSV`` arguments as (group, per-seed table) pairs."""
    out = []
    for item in items:
        group, sep, path = item.partition("=")
        if not sep or group not in STRATEGIES:
            raise SystemExit(
                f"--per-seed {item!r}: expected GROUP=CSV with GROUP in {list(STRATEGIES)}"
            )
        out.append((group, pd.read_csv(path)))
    return out


def joined_per_seed(tables: list[tuple[str, pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    """One per-seed table per group: a group named several times (batches of seeds run one
    after the other, ``seeds.py --params <group>.grpo.seed=K``) has its tables' rows joined; a
    (policy, seed) in two of them would count twice and is refused."""
    joined: dict[str, pd.DataFrame] = {}
    for group, table in tables:
        joined[group] = pd.concat([joined[group], table]) if group in joined else table
    for group, table in joined.items():
        seeded = table.dropna(subset=["seed"])
        repeated = seeded[seeded.duplicated(["policy", "seed"])]
        if not repeated.empty:
            pairs = sorted(set(zip(repeated["policy"], repeated["seed"].astype(int), strict=True)))
            raise SystemExit(f"--per-seed {group}: (policy, seed) {pairs} in several tables")
    return joined


def write(text: str, table: pd.DataFrame, out: Path | None) -> None:
    """Print the card table; with ``out``, write it as markdown (with its command) and CSV."""
    sys.stdout.write(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out.with_suffix(".csv"), index=False)
        command = " ".join(["benchmarks/claims.py", *sys.argv[1:]])
        out.write_text(f"`{command}`\n\n{text}", encoding="utf-8")


if __name__ == "__main__":
    main()
