"""The fetched SmolLM2-135M-Instruct's held-out accuracy before any training, on candidate
prompt sets: which one leaves GRPO room to learn (sampled accuracy between 10 % and 70 %).

Each candidate is a synthetic prompt kind of the ``grpo`` pipeline
(``creditflow.tasks.prompts``), evaluated exactly as the pipeline evaluates a policy
(``api.evaluate``: the checkpoint's chat template, greedy and sampled completions) with the
two rewards the smollm2 bench trains on: ``number_format`` (the number alone) and
``final_number`` (the last number written is the gold answer).

    python benchmarks/smollm2_baseline.py --kinds add sub max count --n 64 --samples 4
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from creditflow import api
from creditflow.tasks.prompts import reward_dataset, synthetic_prompt_split

CHECKPOINT = Path(__file__).resolve().parents[1] / "data/06_models/pretrained/smollm2-135m-instruct"
REWARDS = ["number_format", "final_number"]


def say(*parts: object) -> None:
    """A line of the report on stdout."""
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["add", "sub", "max", "count"])
    parser.add_argument("--max-operand", type=int, default=99)
    parser.add_argument("--n", type=int, default=64, help="held-out prompts per kind")
    parser.add_argument("--samples", type=int, default=4, help="sampled completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not CHECKPOINT.is_dir():
        raise SystemExit("no checkpoint: run creditflow fetch-model smollm2-135m-instruct")
    torch.set_num_threads(args.threads)
    model, tokenizer = api.build_policy(str(CHECKPOINT))
    for kind in args.kinds:
        # The grpo pipeline's split (seed 0): these are the held-out prompts it evaluates.
        _, heldout = synthetic_prompt_split(
            3000, args.n, seed=0, kinds=[kind], max_operand=args.max_operand
        )
        started = time.monotonic()
        table = api.evaluate(
            model,
            tokenizer,
            reward_dataset(heldout),
            REWARDS,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.n,
            samples_per_problem=args.samples,
            seed=0,
        )
        scores = " ".join(
            f"{prefix}{name}={table[f'{prefix}reward/{name}'].mean():.3f}"
            for prefix in ("", "sampled/")
            for name in REWARDS
        )
        say(f"{kind} (n={len(table)}, {time.monotonic() - started:.0f} s): {scores}")
        for completion in table["completion"].head(4):
            say("   ", repr(completion))


if __name__ == "__main__":
    main()
