"""The tapo and tor comparisons over several GRPO seeds, and their tables.

Runs ``kedro run --pipelines <group> --params <group>.comparison.n_seeds=N`` for each group
(a ``KedroSession`` in this process, with the project's hooks), then prints, and with
``--out`` writes as markdown, each comparison table's headline columns: per strategy the mean
over seeds and the 95 % intervals of the gain over the warm start and of the difference to the
baseline strategy (``creditflow.reporting.stats``), as ``mean [low, high]``. The full tables
are the run's versioned ``<group>_comparison`` / ``<group>_per_seed_comparison`` datasets;
``--out`` also writes them beside the markdown (``<stem>_<group>.csv``,
``<stem>_<group>_per_seed.csv``).

The measured tables of ``benchmarks/README.md`` ("Seeds and intervals") come from::

    .venv/bin/python benchmarks/seeds.py --seeds 5 --out benchmarks/results/seeds_5.md

at the default parameters: one warm start per group (loaded from its checkpoints when a run
with the same inputs finished before), then every strategy's GRPO five times. Each GRPO run
and its evaluation cost what they cost in a default run (README: tapo ~1:15 + 0:30 each, 3
strategies), so on the idle 2-core reference machine expect about 30 minutes for tapo; tor
(4,000 SFT steps, then 25 GRPO runs) took 35 minutes for 3 seeds on the shared machine at
load 5-13 (benchmarks/README.md, "Seeds and intervals"; ``pooled_seeds.py`` joins batches of
seeds run side by side). ``--params`` takes ``kedro run``'s syntax for more overrides;
``--scratch DIR`` runs in a copy of the project's configuration in DIR, with the ingested
tables the pipelines read (MGSM, TabMWP, MATH-Vision) copied there, so a trial run leaves the
project's ``data/`` (its newest versions and checkpoints) alone::

    .venv/bin/python benchmarks/seeds.py --seeds 2 --scratch /tmp/seeds_trial \\
        --params "tapo.sft.steps=5,tapo.grpo.steps=2,tor.sft.steps=5,tor.grpo.steps=2"

``--strategies FILE`` (with ``--scratch``) replaces a group's compared strategies in the
scratch copy by those of a YAML file (``{<group>: {<strategy>: <its overrides>}}``, the form of
``<group>.strategies``), e.g. ``benchmarks/conf/tapo_loss_types.yml``: the summed-reward
baseline beside the DAPO and GSPO loss types, without the strategies the question does not
need. (``conf/local`` could add strategies but not remove the defaults: parameters merge
key by key.)
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from kedro.framework.hooks import hook_impl
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from creditflow.reporting.stats import interval_text

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("tapo", "tor")
# The ingested tables each pipeline reads (data_ingest's outputs), copied into a --scratch
# project.
INPUT_TABLES = {
    "tapo": ["mgsm_problems.parquet"],
    "tor": ["tabmwp_problems.parquet", "mathvision_problems.parquet"],
}
# (metric, split) of the interval columns in each group's table, then plain columns shown.
HEADLINE = {
    "tapo": (
        [("eval_reward", "seen"), ("eval_reward", "unseen")],
        ["accuracy_seen", "accuracy_unseen", "train_sign_conflict_rate"],
    ),
    "tor": (
        [("accuracy", "synthetic"), ("sampled_accuracy", "synthetic")],
        ["accuracy_tabmwp", "accuracy_mathvision", "train_reward_first", "train_reward_last"],
    ),
}


def parse_params(text: str) -> dict[str, Any]:
    """``kedro run --params`` text (``a.b=1,c=x``) as a nested dict, values read as YAML.

    >>> parse_params("tapo.grpo.steps=2,tapo.grpo.beta=0.0,tor.sft.steps=5")
    {'tapo': {'grpo': {'steps': 2, 'beta': 0.0}}, 'tor': {'sft': {'steps': 5}}}
    """
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--params item {item!r} is not key=value")
        *path, last = key.strip().split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    return out


def merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in at every level of nesting."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


class KeepComparisons:
    """A hook keeping the comparison tables a run saves (``<group>_comparison`` and
    ``<group>_per_seed_comparison``), so they are read as this run wrote them, not as the
    newest version on disk (another run may have saved one since)."""

    def __init__(self) -> None:
        self.tables: dict[str, pd.DataFrame] = {}

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data: Any) -> None:
        if dataset_name.endswith("_comparison"):
            self.tables[dataset_name] = data


def scratch_project(directory: Path, groups: Sequence[str]) -> Path:
    """A copy of the project's ``conf/base`` and ``pyproject.toml`` in ``directory``, with the
    ingested tables ``groups`` read (the newest version of each), ready for a session."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("conf/base", "pyproject.toml"):
        target = directory / name
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, target, dirs_exist_ok=True)
        else:
            shutil.copy(ROOT / name, target)
    (directory / "conf/local").mkdir(exist_ok=True)
    (directory / "src").mkdir(exist_ok=True)  # bootstrap_project checks it; creditflow is installed
    # The ingested tables name their pictures by paths under data/01_raw (TabMWP's tables):
    # the scratch project reads the same raw folder.
    raw, linked = ROOT / "data/01_raw", directory / "data/01_raw"
    if raw.is_dir() and not linked.exists():
        linked.parent.mkdir(parents=True, exist_ok=True)
        linked.symlink_to(raw.resolve(), target_is_directory=True)
    for group in groups:
        for table in INPUT_TABLES[group]:
            source = ROOT / "data/03_primary" / table
            if not source.is_dir():
                raise FileNotFoundError(
                    f"{source} is missing: run `kedro run --pipelines data_ingest` in {ROOT}"
                )
            # The version folders (beside each, its <version>.sha256 digests: copied too).
            newest = sorted(p for p in source.iterdir() if p.is_dir())[-1]
            digests = newest.with_name(newest.name + ".sha256")
            if digests.is_file():
                (directory / "data/03_primary" / table).mkdir(parents=True, exist_ok=True)
                shutil.copy(digests, directory / "data/03_primary" / table / digests.name)
            shutil.copytree(
                newest, directory / "data/03_primary" / table / newest.name, dirs_exist_ok=True
            )
    return directory


def set_strategies(
    project: Path, group: str, strategies: dict[str, Any], baseline: str | None = None
) -> None:
    """The scratch ``project``'s ``<group>.strategies``: exactly ``strategies`` (the pipeline
    reads the list from the files when it is built; ``--params`` cannot add one), and its
    comparison baseline when ``baseline`` is given."""
    path = project / f"conf/base/parameters_{group}.yml"
    parameters = yaml.safe_load(path.read_text(encoding="utf-8"))
    parameters[group]["strategies"] = strategies
    if baseline is not None:
        parameters[group].setdefault("comparison", {})["baseline"] = baseline
    path.write_text(yaml.safe_dump(parameters, sort_keys=False), encoding="utf-8")


def replace_strategies(
    project: Path, strategies_files: Sequence[Path], groups: Sequence[str] = GROUPS
) -> None:
    """Replace ``<group>.strategies`` in the scratch ``project``'s ``conf/base``, for each of
    ``groups`` that the files name, by the strategies the files list for it: several files join
    their strategies in order (the first one listed is the group's baseline); a name two files
    define differently is an error."""
    joined: dict[str, dict[str, Any]] = {}
    for path in strategies_files:
        replacements = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for group, strategies in replacements.items():
            if group not in GROUPS or not isinstance(strategies, dict) or not strategies:
                raise SystemExit(
                    f"{path}: expected {{<group>: {{<strategy>: ...}}}} with a group of "
                    f"{list(GROUPS)} and at least one strategy; got {group!r}"
                )
            into = joined.setdefault(group, {})
            for name, spec in strategies.items():
                if name in into and into[name] != spec:
                    raise SystemExit(f"{path}: {group}.{name} is defined differently before it")
                into[name] = spec
    for group, strategies in joined.items():
        if group in groups:
            set_strategies(project, group, strategies, baseline=next(iter(strategies)))


def run_comparison(project: Path, group: str, params: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """One ``kedro run --pipelines <group>`` with ``params`` as its ``--params``; the
    comparison tables it saved."""
    keep = KeepComparisons()
    with KedroSession.create(project_path=project, runtime_params=params) as session:
        session._hook_manager.register(keep)  # noqa: SLF001 - the tables this run saves
        session.run(pipeline_names=[group])
    return keep.tables


def cell(table: pd.Series, column: str) -> str:
    """``mean [low, high]`` of an interval column (``+0.024 [-0.003, +0.051]``); ``-`` where
    there is no interval (NaN bounds are shown as missing, never filled in). An interval that
    holds 0 is a null: it says so with the minimum detectable effect at 80 % power, when the
    table has it (``+0.002 [-0.010, +0.014] not detectable (MDE 0.017)``)."""
    stem, _, split = column.rpartition("_")
    return interval_text(
        table.get(column),
        table.get(f"{stem}_ci_low_{split}"),
        table.get(f"{stem}_ci_high_{split}"),
        table.get(f"{stem}_mde_{split}", float("nan")),
    )


def markdown_table(group: str, table: pd.DataFrame) -> str:
    """The headline columns of one comparison table as markdown."""
    intervals, plain = HEADLINE[group]
    # A metric the run did not measure (tor without evaluation.samples_per_problem) is left out.
    intervals = [(m, split) for m, split in intervals if f"{m}_{split}" in table.columns]
    keys = [k for k in ("policy", "language") if k in table.columns]
    header = [*keys, "n_seeds", "ci_basis"]
    for metric, split in intervals:
        header += [f"{metric}_{split}", f"gain over sft, {split}", f"vs baseline, {split}"]
    header += [c for c in plain if c in table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in table.iterrows():
        cells = [str(row[k]) for k in keys]
        cells += [_text(row.get("n_seeds")), _text(row.get("ci_basis"))]
        for metric, split in intervals:
            cells += [
                _number(row.get(f"{metric}_{split}")),
                cell(row, f"{metric}_gain_{split}"),
                cell(row, f"{metric}_vs_baseline_{split}"),
            ]
        cells += [_number(row[c]) for c in plain if c in table.columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _text(value: Any) -> str:
    return "" if value is None or pd.isna(value) else str(value)


def _number(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="GRPO runs per strategy")
    parser.add_argument("--pipelines", nargs="+", choices=GROUPS, default=list(GROUPS))
    parser.add_argument("--params", default="", help="more overrides, as kedro run --params")
    parser.add_argument("--scratch", type=Path, help="run in a copy of the project here")
    parser.add_argument("--out", type=Path, help="write the markdown tables here (and CSVs)")
    parser.add_argument(
        "--strategies",
        type=Path,
        nargs="+",
        help="YAML files {group: strategies} replacing them (with --scratch); several files "
        "join their strategies, in order",
    )
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if args.strategies and not args.scratch:
        parser.error("--strategies edits the scratch copy's configuration: give --scratch DIR")
    logging.basicConfig(level=logging.WARNING)
    project = scratch_project(args.scratch, args.pipelines) if args.scratch else ROOT
    if args.strategies:
        replace_strategies(project, args.strategies, args.pipelines)
    if args.out:
        args.out = args.out.resolve()
    # The pipelines read their strategy list from the project at the working directory
    # (creditflow.pipelines.comparison.project_root), so a scratch project is run from there.
    os.chdir(project)
    bootstrap_project(project)
    extra = parse_params(args.params)
    sections = []
    for group in args.pipelines:
        params = merged(extra, {group: {"comparison": {"n_seeds": args.seeds}}})
        started = time.perf_counter()
        tables = run_comparison(project, group, params)
        minutes = (time.perf_counter() - started) / 60
        table = tables[f"{group}_comparison"]
        section = (
            f"### {group}: {args.seeds} seeds ({minutes:.1f} min)\n\n"
            f"{markdown_table(group, table)}\n"
        )
        sys.stdout.write(section + "\n")
        sys.stdout.flush()
        sections.append(section)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            table.to_csv(args.out.with_name(f"{args.out.stem}_{group}.csv"), index=False)
            tables[f"{group}_per_seed_comparison"].to_csv(
                args.out.with_name(f"{args.out.stem}_{group}_per_seed.csv"), index=False
            )
    if args.out:
        command = " ".join(["benchmarks/seeds.py", *sys.argv[1:]])
        args.out.write_text(f"`{command}`\n\n" + "\n".join(sections), encoding="utf-8")


if __name__ == "__main__":
    main()
