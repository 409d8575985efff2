"""Run ``grpo_step.py`` for creditflow and TRL N times, alternately, and compare them.

Each run is its own process (separate peak RSS, no shared caches). Runs alternate
(creditflow, trl, creditflow, trl, ...) so that slow drift in machine load hits both alike.
Prints one line per run, then the medians over the N runs and the ratio creditflow / TRL;
``--out FILE`` also keeps every JSON record.

Usage::

    .venv/bin/python benchmarks/compare.py --model-dir DIR --repeat 3 -- \\
        --group-size 8 --prompts 4 --max-new-tokens 64 --steps 5 --threads 2 --profile

Everything after ``--`` is passed to every ``grpo_step.py`` run unchanged. ``--rollouts hf
lean`` runs creditflow once per rollout backend in each round (labelled ``creditflow[hf]``,
``creditflow[lean]``), each compared with TRL. ``--labels`` names every run of a round
itself: ``IMPL[SETTING]@THREADS``, where SETTING is a rollout backend or a creditflow
``KEY=VALUE`` (``--creditflow-set``) and ``@THREADS`` overrides ``--threads`` for that run;
e.g. the one-step off-policy setting on one thread each for trainer and sampler against TRL
on two threads, beside both on one thread::

    .venv/bin/python benchmarks/compare.py --model-dir DIR --repeat 5 \
        --labels creditflow@1 "creditflow[max_staleness=1]@1" trl@1 trl@2 -- \
        --group-size 8 --prompts 4 --max-new-tokens 64 --steps 5 --profile

Every creditflow label is compared with every TRL label: the medians' ratio, and the
throughput ratio of each round's pair of runs (paired: the same round's load).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

GRPO_STEP = Path(__file__).with_name("grpo_step.py")
IMPLS = ("creditflow", "trl")
# (record key, column header, format): the medians printed for each implementation.
SUMMARY_COLUMNS = (
    ("s_per_step", "s/step (mean of run)", "{:.3f}"),
    ("median_step_s", "s/step (median step)", "{:.3f}"),
    ("cpu_s_per_step", "CPU s/step", "{:.3f}"),
    ("tokens_per_s", "completion tok/s", "{:.0f}"),
    ("peak_rss_mb", "peak RSS MB", "{:.0f}"),
    ("warmup_s", "warm-up step s", "{:.2f}"),
    ("load_s", "load s", "{:.2f}"),
)


def label_arguments(label: str) -> list[str]:
    """The ``grpo_step.py`` arguments a run label stands for (see the module docstring).

    >>> label_arguments("trl@2"), label_arguments("creditflow[lean]")
    (['--impl', 'trl', '--threads', '2'], ['--impl', 'creditflow', '--rollout', 'lean'])
    >>> label_arguments("creditflow[max_staleness=1]@1")
    ['--impl', 'creditflow', '--creditflow-set', 'max_staleness=1', '--threads', '1']
    """
    label, _, threads = label.partition("@")
    impl, _, setting = label.partition("[")
    setting = setting.removesuffix("]")
    arguments = ["--impl", impl]
    if setting:
        arguments += ["--creditflow-set" if "=" in setting else "--rollout", setting]
    return arguments + (["--threads", threads] if threads else [])


def run_once(label: str, model_dir: Path, step_args: Sequence[str]) -> dict[str, Any]:
    """One ``grpo_step.py`` process; its last stdout line is the JSON record. ``label``: see
    ``label_arguments``; its ``@THREADS`` comes after ``step_args``, so it wins."""
    arguments = label_arguments(label)
    split = arguments.index("--threads") if "--threads" in arguments else len(arguments)
    command = [
        sys.executable,
        str(GRPO_STEP),
        *arguments[:split],
        "--model-dir",
        str(model_dir),
        *step_args,
        *arguments[split:],
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def medians(records: list[dict[str, Any]]) -> dict[str, float]:
    """Median over runs of each summary column, plus the median of all measured steps pooled."""
    out = {key: statistics.median(r[key] for r in records) for key, _, _ in SUMMARY_COLUMNS}
    pooled = [s for r in records for s in r["step_s"][r["warmup_steps"] :]]
    out["pooled_median_step_s"] = statistics.median(pooled)
    return out


def summary_table(by_impl: dict[str, list[dict[str, Any]]]) -> str:
    """A markdown table: one row per implementation, then the creditflow / TRL ratio."""
    header = ["impl", *(title for _, title, _ in SUMMARY_COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    stats = {impl: medians(records) for impl, records in by_impl.items()}
    for impl, values in stats.items():
        cells = [fmt.format(values[key]) for key, _, fmt in SUMMARY_COLUMNS]
        lines.append(f"| {impl} | " + " | ".join(cells) + " |")
    for ours, theirs in _pairs(stats):
        ratios = [f"{stats[ours][key] / stats[theirs][key]:.2f}" for key, _, _ in SUMMARY_COLUMNS]
        lines.append(f"| {ours} / {theirs.replace('trl', 'TRL')} | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def _pairs(labels) -> list[tuple[str, str]]:
    """(creditflow label, TRL label) for every pair to compare."""
    return [
        (a, b) for a in labels if a.startswith("creditflow") for b in labels if b.startswith("trl")
    ]


def paired_ratios(by_impl: dict[str, list[dict[str, Any]]]) -> str:
    """Per pair of labels, each round's completion-token throughput ratio and their median."""
    lines = []
    for ours, theirs in _pairs(by_impl):
        ratios = [
            a["tokens_per_s"] / b["tokens_per_s"]
            for a, b in zip(by_impl[ours], by_impl[theirs], strict=True)
        ]
        rounds = ", ".join(f"{r:.2f}" for r in ratios)
        lines.append(
            f"{ours} / {theirs} tok/s by round: {rounds} (median {statistics.median(ratios):.2f})"
        )
    return "\n".join(lines)


def profile_table(by_impl: dict[str, list[dict[str, Any]]]) -> str:
    """Median seconds per step of each profiled phase (runs made with ``--profile``)."""
    lines = []
    for impl, records in by_impl.items():
        phases = sorted({p for r in records for p in r.get("profile", {})})
        if not phases:
            continue
        values = {p: statistics.median(r["profile"].get(p, 0.0) for r in records) for p in phases}
        lines.append(f"{impl}: " + ", ".join(f"{p}={v:.3f}" for p, v in values.items()))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3, help="runs per implementation")
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--out", type=Path, help="also write every JSON record here")
    parser.add_argument(
        "--labels",
        nargs="+",
        default=None,
        metavar="LABEL",
        help="the runs of a round, IMPL[SETTING]@THREADS (overrides --impls and --rollouts)",
    )
    parser.add_argument(
        "--rollouts",
        nargs="+",
        default=None,
        metavar="NAME",
        help="creditflow rollout backends to run side by side (e.g. hf lean)",
    )
    args = parser.parse_args(argv[:split])
    if args.rollouts:
        args.impls = [
            label
            for impl in args.impls
            for label in (
                [f"creditflow[{name}]" for name in args.rollouts]
                if impl == "creditflow"
                else [impl]
            )
        ]
    if args.labels:
        args.impls = args.labels
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    return args, argv[split + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    args, step_args = parse_args(argv)
    by_impl: dict[str, list[dict[str, Any]]] = {impl: [] for impl in args.impls}
    log = sys.stdout
    for repeat in range(args.repeat):
        for impl in args.impls:
            record = run_once(impl, args.model_dir, step_args)
            by_impl[impl].append(record)
            log.write(
                f"run {repeat + 1}/{args.repeat} {impl:>16}: {record['s_per_step']:.3f} s/step, "
                f"median step {record['median_step_s']:.3f} s, CPU {record['cpu_s_per_step']:.3f} s/step, "
                f"{record['tokens_per_s']:.0f} tok/s, "
                f"peak RSS {record['peak_rss_mb']:.0f} MB, load avg {record['loadavg_1m']:.2f}\n"
            )
            log.flush()
            if args.out is not None:
                with args.out.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
    log.write("\n" + summary_table(by_impl) + "\n")
    log.write("\n" + paired_ratios(by_impl) + "\n")
    profile = profile_table(by_impl)
    if profile:
        log.write("\nmedian seconds per step by phase:\n" + profile + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
