"""Wall time of the reasoning reward on hostile batches, with and without the
screen and the batch budget.

    .venv/bin/python benchmarks/reasoning_hostile.py --batch nine
    .venv/bin/python benchmarks/reasoning_hostile.py --batch hostile128 --uncapped

Batches: ``nine`` (the nine hostile completions of the issue), ``hostile128`` (128 distinct
variants of them), ``slow128`` (128 distinct answers that pass the screen but that sympy
never finishes: only the budget bounds them) and ``ordinary128`` (GSM8K gold answers, 3/4
of them wrong). ``--uncapped`` turns the screen and the budget off: the reward as it was
before them (one check at a time, each up to ``--timeout-s``; only equal checks are shared,
and the hostile128 variants are all distinct). Prints one JSON line: the
wall time and the count of each outcome.
"""

import argparse
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

from creditflow.rewards import reasoning, reasoning_outcomes

NINE = [
    "9^{9^{9^{9}}}",
    "9^9^9^9",
    "(10^{10})!",
    "100000000000!",
    "{" * 100_000 + "}" * 100_000,
    "9" * 100_000,
    None,  # the 1.5 MB completion, below
    "\\frac{1}{" * 2000 + "2" + "}" * 2000,
    "10^{10^{10}}",
]


def _boxed(answer: str) -> str:
    return f"<translation>Q</translation> so \\boxed{{{answer}}}."


def _nine() -> list[str]:
    big = "x" * 1_000_000 + "\\boxed{" + "1" * 500_000 + "}"
    return [big if a is None else _boxed(a) for a in NINE]


def _hostile128() -> list[str]:
    # Distinct, so no check is shared: each variant changes one number of a hostile answer.
    variants = [
        lambda k: f"{9 + k}^{{9^{{9^{{9}}}}}}",
        lambda k: f"(10^{{{10 + k}}})!",
        lambda k: f"{10**11 + k}!",
        lambda k: "{" * (100_000 + k) + "}" * (100_000 + k),
        lambda k: "9" * (100_000 + k),
        lambda k: "\\frac{1}{" * (2000 + k) + "2" + "}" * (2000 + k),
        lambda k: f"10^{{10^{{{10 + k}}}}}",
        lambda k: "\\frac{1}{" * 20 + str(k) + "}" * 20,
    ]
    return [_boxed(variants[i % len(variants)](i)) for i in range(128)]


def _slow128() -> list[str]:
    return [_boxed(f"(x+{k + 1})^{{100000}}") for k in range(128)]


def _ordinary128() -> list[str]:
    data = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test_shared.jsonl"
    with open(data, encoding="utf-8") as f:
        golds = [json.loads(line)["answer"].split("#### ")[-1].strip() for line in f][:32]
    return [_boxed(g if k == 0 else f"{g}{k}") for g in golds for k in range(4)]


BATCHES = {
    "nine": _nine,
    "hostile128": _hostile128,
    "slow128": _slow128,
    "ordinary128": _ordinary128,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", choices=sorted(BATCHES), required=True)
    parser.add_argument("--uncapped", action="store_true", help="no screen, no budget")
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--budget-s", type=float, default=30.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    completions = BATCHES[args.batch]()
    answers = ["5"] * len(completions)
    if args.batch == "ordinary128":
        answers = [c.split("boxed{")[1].split("}")[0] for c in completions[::4] for _ in range(4)]
    options = {"timeout_s": args.timeout_s, "budget_s": args.budget_s}
    if args.uncapped:
        options = {"timeout_s": args.timeout_s, "budget_s": None, "max_answer_chars": 10**12}
        reasoning.screen_answer = lambda *_, **__: None  # every answer reaches sympy
    reasoning_outcomes(["\\boxed{1}"], ["1"])  # start the worker: time the batch only
    start = time.perf_counter()
    outcomes = reasoning_outcomes(completions, answers, **options)
    wall_s = time.perf_counter() - start
    summary = {
        "batch": args.batch,
        "completions": len(completions),
        "uncapped": args.uncapped,
        **options,
        "wall_s": round(wall_s, 2),
        "outcomes": dict(Counter(outcomes)),
    }
    sys.stdout.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
