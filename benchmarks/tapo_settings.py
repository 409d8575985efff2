"""One GRPO setting of the tapo pipeline, trained from a saved warm start and scored with
paired sampled evaluation: the script behind README's "Measured on the way" table.

The pipeline trains three strategies per run; trying a learning rate, KL weight or minibatch
size that way costs 7 minutes. This runs one strategy from an existing SFT policy (the
pipeline's ``tapo_sft_policy`` dataset) and scores it on held-out synthetic problems with
``samples`` completions each, as in training; ``--save-rewards`` / ``--paired-with`` keep
and compare the per-problem rewards, so a setting's gain over the warm start comes with its
standard error.

    python benchmarks/tapo_settings.py --warm-start data/06_models/tapo_sft_policy/<version>/tapo_sft_policy \
        --tokenizer data/06_models/tapo_tokenizer/<version>/tapo_tokenizer \
        --strategy none --save-rewards /tmp/sft.npy
    python benchmarks/tapo_settings.py --warm-start ... --tokenizer ... --strategy tapo \
        --set learning_rate=3e-4 --set beta=0.1 --set minibatch_size=32 --paired-with /tmp/sft.npy

``--set`` overrides any ``tapo.grpo`` parameter (conf/base/parameters_tapo.yml); a dotted
key overrides the strategy's own settings (``tapo.strategies.<strategy>``), e.g.
``--set advantage.scale_by_std=false``. Each ``generate`` call of the evaluation is seeded on
its own, so runs with the same ``--sampling-seed`` share their random numbers and their
paired gain is less noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from transformers import AutoModelForCausalLM

from creditflow.models import load_tokenizer
from creditflow.pipelines.tapo.nodes import build_tapo_tasks, train_tapo_policy
from creditflow.tasks.tapo import tapo_prompt
from creditflow.training.evaluation import evaluate_policy_sampled

PARAMETERS = Path(__file__).resolve().parents[1] / "conf/base/parameters_tapo.yml"


def parse_value(text: str):
    """``--set key=value``: the value read as YAML (numbers, booleans, null, lists).

    YAML 1.1 reads ``1e-3`` (no dot) as a string; such a value is taken as the float it
    spells, so ``--set learning_rate=1e-3`` means what it says.

    >>> parse_value("1e-3"), parse_value("0.1"), parse_value("null"), parse_value("tapo")
    (0.001, 0.1, None, 'tapo')
    """
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_override(params: dict, strategy: str, key: str, value) -> None:
    """``--set key=value`` into ``params`` (the ``tapo`` parameters): a plain key into
    ``grpo``, a dotted one (``advantage.alpha``) into ``strategies.<strategy>``, whose
    settings win over ``grpo``'s.

    >>> p = {"grpo": {"beta": 0.1}, "strategies": {"tapo": {"advantage": {"alpha": 0.5}}}}
    >>> apply_override(p, "tapo", "beta", 0.0)
    >>> apply_override(p, "tapo", "advantage.alpha", 0.7)
    >>> p["grpo"]["beta"], p["strategies"]["tapo"]["advantage"]["alpha"]
    (0.0, 0.7)
    """
    *path, last = key.split(".")
    target = params["strategies"][strategy] if path else params["grpo"]
    for part in path:
        target = target.setdefault(part, {})
    target[last] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm-start", required=True, help="directory of the SFT policy")
    parser.add_argument(
        "--tokenizer", required=True, help="directory of its tokenizer (tapo_tokenizer)"
    )
    parser.add_argument("--strategy", default="tapo", help="a tapo.strategies name, or none")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--eval-per-language", type=int, default=60)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--sampling-seed", type=int, default=123)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--save-rewards", type=Path, help="write per-problem rewards (.npy)")
    parser.add_argument("--paired-with", type=Path, help="per-problem rewards to compare with")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    params = yaml.safe_load(PARAMETERS.read_text())["tapo"]
    params["torch_threads"] = args.threads
    tasks = params["tasks"]
    names = params["reward_functions"]
    model = AutoModelForCausalLM.from_pretrained(args.warm_start, attn_implementation="eager")
    tokenizer = load_tokenizer(args.tokenizer)

    # The pipeline's own training and evaluation problems (tapo.tasks), the latter resized.
    params["tasks"]["n_eval_per_language"] = args.eval_per_language
    train, held_out = build_tapo_tasks(None, params)  # tapo.tasks.source: synthetic
    seconds = None
    if args.strategy != "none" and args.strategy not in params["strategies"]:
        parser.error(
            f"--strategy {args.strategy!r}: use none or one of {sorted(params['strategies'])}"
        )
    if args.strategy != "none":
        for item in args.set:
            key, _, value = item.partition("=")
            apply_override(params, args.strategy, key, parse_value(value))
        started = time.perf_counter()
        strategy = params["strategies"][args.strategy]
        model, _, _ = train_tapo_policy(model, tokenizer, train, None, params, strategy)
        seconds = round(time.perf_counter() - started, 1)

    grpo = params["grpo"]
    scores = evaluate_policy_sampled(
        model,
        tokenizer,
        [tapo_prompt(q) for q in held_out["question"]],
        list(held_out["question_en"]),
        list(held_out["answer"]),
        names,
        max_new_tokens=grpo["max_new_tokens"],
        samples_per_prompt=args.samples,
        temperature=grpo["temperature"],
        top_p=grpo["top_p"],
        batch_size=16,
        seed=args.sampling_seed,
    )
    reward = (scores["reward/translation"] + scores["reward/reasoning"]).to_numpy()
    unseen = held_out["language"].isin(tasks["holdout_languages"]).to_numpy()
    report = {
        "strategy": args.strategy,
        "overrides": args.set,
        "grpo_seconds": seconds,
        "eval_reward_seen": float(reward[~unseen].mean()),
        "eval_reward_unseen": float(reward[unseen].mean()),
    }
    if args.paired_with:
        diff = reward - np.load(args.paired_with)
        report["gain_all"] = float(diff.mean())
        report["gain_all_se"] = float(diff.std(ddof=1) / np.sqrt(len(diff)))
    if args.save_rewards:
        np.save(args.save_rewards, reward)
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
