"""Scaling curves: GRPO step time and peak RSS of creditflow and TRL as one factor grows.

From a base workload (G 8, P 2, T 64, the benchmark's tiny Qwen2: hidden 128, 4 layers,
V = 1026), one factor at a time is grown while the others stay at the base:

- ``group_size``: G in 4, 8, 16, 32 (B = P * G rows);
- ``completion_length``: T (max new tokens) in 32, 64, 128, 256, 512;
- ``model``: width and depth together, ``MODELS`` (0.2 M to ~50 M parameters);
- ``vocabulary``: the embedding / LM head padded to V in 1,026, 8,192, 32,768, 151,936
  (``make_tiny_model.py --pad-vocab-to``; the tokenizer is unchanged).

Every point runs ``grpo_step.py`` once per implementation, each in its own process (so the
peak RSS is that implementation's), alternating creditflow and TRL, on one thread. The step
cost is the process's CPU seconds per measured step (``grpo_step.py``'s ``cpu_s_per_step``):
with one thread it is the work itself, while the wall time also counts the time other
processes of a shared machine held the core (both are in the table). The output: one
markdown table (CPU and wall seconds per step, peak RSS, the TRL / creditflow CPU ratio per
point), the slope of each curve on log-log axes (least squares of log CPU time, and of log
peak RSS, on log factor: 1 = linear), a log-log plot (``--plot``) and every JSON record
(``--out``).

Usage::

    .venv/bin/python benchmarks/scaling.py --workdir /tmp/scaling --out benchmarks/results/scaling.jsonl \\
        --plot benchmarks/results/scaling.png --markdown benchmarks/results/scaling.md
    # one factor, its first two points, tiny sizes, in this process: seconds (the tests)
    .venv/bin/python benchmarks/scaling.py --workdir /tmp/scaling_quick --quick --factors group_size
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

HERE = Path(__file__).resolve().parent
GRPO_STEP = HERE / "grpo_step.py"
IMPLS = ("creditflow", "trl")

# (hidden, layers, heads, kv heads): MLP 4 x hidden, V = 1026 (parameters counted per run).
MODELS: dict[str, tuple[int, int, int, int]] = {
    "h64-L2": (64, 2, 4, 2),
    "h128-L4": (128, 4, 4, 2),  # the base: the GRPO step benchmark's model
    "h256-L6": (256, 6, 8, 2),
    "h512-L8": (512, 8, 8, 2),
    "h640-L10": (640, 10, 10, 2),
}


@dataclass(frozen=True)
class Point:
    """One workload: the base with one factor changed."""

    group_size: int = 8
    prompts: int = 2
    max_new_tokens: int = 64
    model: str = "h128-L4"
    vocabulary: int = 1026

    def model_key(self) -> tuple[str, int]:
        return self.model, self.vocabulary


@dataclass
class Grid:
    """The factors and their values (the base value of each is among them)."""

    base: Point = Point()
    values: dict[str, list[Any]] = field(
        default_factory=lambda: {
            "group_size": [4, 8, 16, 32],
            "completion_length": [32, 64, 128, 256, 512],
            "model": list(MODELS),
            "vocabulary": [1026, 8192, 32768, 151936],
        }
    )

    def points(self, factor: str) -> list[tuple[Any, Point]]:
        """(factor value, workload) for every value of ``factor``."""
        attribute = {"completion_length": "max_new_tokens"}.get(factor, factor)
        return [(value, replace(self.base, **{attribute: value})) for value in self.values[factor]]


QUICK = Grid(
    base=Point(group_size=2, prompts=1, max_new_tokens=4, model="h64-L2"),
    values={
        "group_size": [2, 4],
        "completion_length": [2, 4],
        "model": ["h64-L2", "h128-L4"],
        "vocabulary": [1026, 2048],
    },
)


def _load(name: str):
    # benchmarks/ holds scripts, not a package: import them from their files.
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def model_dir(workdir: Path, key: tuple[str, int], quick: bool) -> Path:
    """The benchmark model of ``key`` (built once, then reused from ``workdir``)."""
    name, vocabulary = key
    out = workdir / f"{name}-V{vocabulary}"
    if (out / "config.json").exists():
        return out
    hidden, layers, heads, kv_heads = MODELS[name]
    if quick:  # tiny sizes keep the quick mode in seconds
        hidden, layers, heads, kv_heads = hidden // 4, 1, 2, 1
    _load("make_tiny_model").make_tiny_model(
        out,
        n_problems=2 if quick else 32,
        vocab_size=300 if quick else 1024,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=4 * hidden,
        pad_vocab_to=None if vocabulary <= 1026 else vocabulary,
    )
    return out


def step_arguments(point: Point, steps: int, warmup_steps: int) -> list[str]:
    return [
        "--group-size", str(point.group_size),
        "--prompts", str(point.prompts),
        "--max-new-tokens", str(point.max_new_tokens),
        "--steps", str(steps),
        "--warmup-steps", str(warmup_steps),
        "--threads", "1",
    ]  # fmt: skip


def run_point(impl: str, directory: Path, arguments: list[str], in_process: bool) -> dict[str, Any]:
    """One ``grpo_step.py`` run's record (in its own process unless ``in_process``)."""
    arguments = ["--impl", impl, "--model-dir", str(directory), *arguments]
    if in_process:
        grpo_step = _load("grpo_step")
        args = grpo_step.parse_args(arguments)
        prompts, answers = grpo_step.read_prompts(args.model_dir, args.prompts)
        work = grpo_step.Workload(
            model_dir=args.model_dir, prompts=prompts, answers=answers,
            group_size=args.group_size, max_new_tokens=args.max_new_tokens, steps=args.steps,
            warmup_steps=args.warmup_steps, learning_rate=args.lr, seed=args.seed,
            attn_implementation=args.attn,
        )  # fmt: skip
        previous = torch.get_num_threads()
        torch.set_num_threads(args.threads)
        try:
            return grpo_step.IMPLEMENTATIONS[impl](work, False)
        finally:
            torch.set_num_threads(previous)
    done = subprocess.run(
        [sys.executable, str(GRPO_STEP), *arguments], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"grpo_step.py {' '.join(arguments)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parameter_count(directory: Path) -> int:
    """Parameters of the saved model (tied embedding counted once), from its config."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    return sum(p.numel() for p in model.parameters())


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) on log(x): the exponent of a power law y ~ x^k.

    >>> round(slope([1, 2, 4], [3, 6, 12]), 6), round(slope([1, 10], [5, 500]), 6)
    (1.0, 2.0)
    """
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def x_value(row: dict[str, Any]) -> float:
    """The factor's number on the x axis (a model's parameter count)."""
    return row["parameters"] if row["factor"] == "model" else row["value"]


def slopes(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """(factor, impl) -> slopes of the median step time and of the peak RSS."""
    out = {}
    for factor in dict.fromkeys(r["factor"] for r in rows):
        for impl in IMPLS:
            mine = [r for r in rows if r["factor"] == factor and r["impl"] == impl]
            if len(mine) < 2:
                continue
            xs = [x_value(r) for r in mine]
            out[factor, impl] = {
                "time": slope(xs, [r["cpu_s_per_step"] for r in mine]),
                "rss": slope(xs, [r["peak_rss_mb"] for r in mine]),
            }
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table of every point, then the slopes."""
    lines = [
        "| factor | value | creditflow CPU s/step | TRL CPU s/step | TRL / creditflow CPU "
        "| creditflow wall s/step | TRL wall s/step | creditflow peak RSS MB | TRL peak RSS MB "
        "| load 1 min |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_point: dict[tuple[str, Any], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_point.setdefault((r["factor"], r["value"]), {})[r["impl"]] = r
    for (factor, value), pair in by_point.items():
        ours, theirs = pair.get("creditflow"), pair.get("trl")
        if ours is None or theirs is None:
            continue
        shown = f"{value} ({ours['parameters'] / 1e6:.1f} M)" if factor == "model" else value
        lines.append(
            f"| {factor} | {shown} | {ours['cpu_s_per_step']:.3f} | {theirs['cpu_s_per_step']:.3f}"
            f" | {theirs['cpu_s_per_step'] / ours['cpu_s_per_step']:.2f}"
            f" | {ours['median_step_s']:.3f} | {theirs['median_step_s']:.3f}"
            f" | {ours['peak_rss_mb']:.0f} | {theirs['peak_rss_mb']:.0f}"
            f" | {max(ours['loadavg_1m'], theirs['loadavg_1m']):.1f} |"
        )
    lines += ["", "| factor | creditflow CPU-time slope | TRL CPU-time slope | creditflow RSS slope "
              "| TRL RSS slope |", "|---|---|---|---|---|"]  # fmt: skip
    fitted = slopes(rows)
    for factor in dict.fromkeys(r["factor"] for r in rows):
        if (factor, "creditflow") in fitted and (factor, "trl") in fitted:
            a, b = fitted[factor, "creditflow"], fitted[factor, "trl"]
            lines.append(
                f"| {factor} | {a['time']:.2f} | {b['time']:.2f} | {a['rss']:.2f} | {b['rss']:.2f} |"
            )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """One log-log panel per factor: CPU seconds per step of both implementations (solid)
    and peak RSS (dashed, right axis)."""
    import matplotlib  # noqa: PLC0415 - only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    factors = list(dict.fromkeys(r["factor"] for r in rows))
    figure, axes = plt.subplots(1, len(factors), figsize=(4.2 * len(factors), 3.6), squeeze=False)
    fitted = slopes(rows)
    for ax, factor in zip(axes[0], factors, strict=True):
        memory = ax.twinx()
        for impl, color in zip(IMPLS, ("tab:blue", "tab:orange"), strict=True):
            mine = [r for r in rows if r["factor"] == factor and r["impl"] == impl]
            xs = [x_value(r) for r in mine]
            k = fitted.get((factor, impl), {}).get("time", float("nan"))
            ax.plot(xs, [r["cpu_s_per_step"] for r in mine], "o-", color=color,
                    label=f"{impl} time (slope {k:.2f})")  # fmt: skip
            memory.plot(xs, [r["peak_rss_mb"] for r in mine], "s--", color=color, alpha=0.5)
        for axis in (ax, memory):
            axis.set_xscale("log")
            axis.set_yscale("log")
        if factor != "model":  # the measured values as the ticks (log ticks crowd 3 x 10^1 ...)
            ticks = sorted({x_value(r) for r in rows if r["factor"] == factor})
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.minorticks_off()
        ax.set_xlabel("parameters" if factor == "model" else factor)
        ax.set_ylabel("CPU s / step (solid)")
        memory.set_ylabel("peak RSS MB (dashed)")
        ax.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="models are built here")
    parser.add_argument("--factors", nargs="+", default=None, help="default: all four")
    parser.add_argument(
        "--values",
        nargs="+",
        default=[],
        metavar="FACTOR=V1,V2",
        help="a reduced grid, e.g. completion_length=32,64,128 (values read as the factor's type)",
    )
    parser.add_argument("--steps", type=int, default=2, help="measured steps per run")
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="tiny models, two points per factor, 1 step, in this process")  # fmt: skip
    parser.add_argument("--out", type=Path, help="append every JSON record here")
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    parser.add_argument("--plot", type=Path, help="write the log-log plot here (PNG)")
    parser.add_argument(
        "--from-records", type=Path, help="tables and plot from an --out file; nothing runs"
    )
    args = parser.parse_args(argv)
    grid = QUICK if args.quick else Grid()
    for text in args.values:
        factor, _, values = text.partition("=")
        if factor not in grid.values or not values:
            parser.error(
                f"--values {text!r}: expected FACTOR=V1,V2 with FACTOR in {sorted(grid.values)}"
            )
        kind = type(grid.values[factor][0])
        grid.values[factor] = [kind(v) for v in values.split(",")]
    args.grid = grid
    args.factors = args.factors or list(grid.values)
    unknown = sorted(set(args.factors) - set(grid.values))
    if unknown:
        parser.error(f"unknown factor(s) {unknown}; valid: {sorted(grid.values)}")
    if args.quick:
        args.steps, args.warmup_steps = 1, 0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    if args.from_records is not None:
        lines = args.from_records.read_text(encoding="utf-8").splitlines()
        rows = [row for row in map(json.loads, lines) if row["factor"] in args.factors]
        args.factors = []
    for factor in args.factors:
        for value, point in args.grid.points(factor):
            directory = model_dir(args.workdir, point.model_key(), args.quick)
            arguments = step_arguments(point, args.steps, args.warmup_steps)
            for impl in IMPLS:
                t0 = time.perf_counter()
                record = run_point(impl, directory, arguments, in_process=args.quick)
                row = {
                    "factor": factor,
                    "value": value,
                    "impl": impl,
                    "parameters": parameter_count(directory),
                    "run_s": time.perf_counter() - t0,
                    **{k: v for k, v in record.items() if k != "impl"},
                }
                rows.append(row)
                sys.stderr.write(
                    f"{factor}={value} {impl}: {row['cpu_s_per_step']:.3f} CPU s/step, "
                    f"{row['peak_rss_mb']:.0f} MB, load {row['loadavg_1m']:.1f}\n"
                )
                if args.out is not None:
                    with args.out.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(row) + "\n")
    table = markdown(rows)
    sys.stdout.write(table + "\n")
    if args.markdown is not None:
        args.markdown.write_text(table + "\n", encoding="utf-8")
    if args.plot is not None:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
