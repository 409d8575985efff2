"""Time the ``hf`` and ``lean`` rollout backends sampling the GRPO benchmark's rollout.

Both backends get the same ``GenerationRequest``: the first P prompts of ``prompts.jsonl``
(chat-formatted, left-padded), G completions each (B = P * G), up to T new tokens, temperature
1, top-p 1, no top-k, the model's stop ids, float32. Repeats alternate hf, lean, hf, lean, ...
(so drift on the shared machine hits both alike), each pair seeded alike, after one untimed
warm-up call each. Prints one JSON line::

    {"hf_cpu_s", "lean_cpu_s", "cpu_ratio", "hf_wall_s", "lean_wall_s", "wall_ratio",
     "hf_tokens_per_s", "lean_tokens_per_s", "same_tokens", ...}

``*_cpu_s`` / ``*_wall_s``: medians over the repeats of this process's CPU time / wall time
per call; ``cpu_ratio`` = hf / lean; tokens/s = completion tokens (up to and including the
stop id) per median CPU second; ``same_tokens``: repeats in which the seeded lean sample equals
the seeded hf one token for token (``lean`` replays ``generate``'s random stream).

Usage::

    .venv/bin/python benchmarks/lean_decode.py            # builds the model in /tmp if needed
    .venv/bin/python benchmarks/lean_decode.py --model-dir data/06_models/bench_tiny \\
        --prompts 4 --group-size 8 --max-new-tokens 64 --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# Before torch is imported: tokenizers' thread pool would compete for the cores.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from creditflow.models import load_tokenizer  # noqa: E402
from creditflow.rollout.backends import GenerationRequest, completion_mask_from_eos  # noqa: E402
from creditflow.rollout.backends.hf import HFBackend  # noqa: E402
from creditflow.rollout.backends.lean import LeanBackend  # noqa: E402
from creditflow.rollout.language_policy import stop_token_ids  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_model import PROMPTS_FILE, make_tiny_model  # noqa: E402

DEFAULT_MODEL_DIR = Path("/tmp/creditflow_bench_tiny")


def build_request(model_dir: Path, model, n_prompts: int, group_size: int, max_new_tokens: int):
    """The rollout request of the GRPO benchmark's first ``n_prompts`` prompts."""
    tokenizer = load_tokenizer(model_dir)
    rows = [json.loads(line) for line in (model_dir / PROMPTS_FILE).read_text().splitlines()]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        for row in rows[:n_prompts]
    ]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return GenerationRequest(
        prompt_ids=enc["input_ids"],
        prompt_mask=enc["attention_mask"],
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        stop_ids=tuple(stop_token_ids(model, tokenizer)),
        pad_id=tokenizer.pad_token_id,
    )


def timed_call(
    backend, model, request: GenerationRequest, seed: int
) -> tuple[float, float, int, torch.Tensor]:
    """(CPU s, wall s, completion tokens) of one seeded ``generate``, and its ids."""
    torch.manual_seed(seed)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    generation = backend.generate(model, request)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    tokens = int(completion_mask_from_eos(generation.completion_ids, list(request.stop_ids)).sum())
    return cpu, wall, tokens, generation.completion_ids


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    if not (args.model_dir / "config.json").exists():
        make_tiny_model(args.model_dir, seed=args.seed)
    model = AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.float32, attn_implementation=args.attn
    ).eval()
    request = build_request(
        args.model_dir, model, args.prompts, args.group_size, args.max_new_tokens
    )
    backends = {"hf": HFBackend(), "lean": LeanBackend()}
    for backend in backends.values():  # warm-up: lazy inits, the lean weights cache
        timed_call(backend, model, request, args.seed)
    cpu = {name: [] for name in backends}
    wall = {name: [] for name in backends}
    tokens = {name: [] for name in backends}
    same = 0
    for repeat in range(args.repeats):
        ids = {}
        for name, backend in backends.items():
            c, w, n, ids[name] = timed_call(backend, model, request, args.seed + 1 + repeat)
            cpu[name].append(c)
            wall[name].append(w)
            tokens[name].append(n)
        same += ids["hf"].shape == ids["lean"].shape and bool((ids["hf"] == ids["lean"]).all())
    median = {name: statistics.median(cpu[name]) for name in backends}
    median_wall = {name: statistics.median(wall[name]) for name in backends}
    return {
        "model_dir": str(args.model_dir),
        "attn": args.attn,
        "threads": args.threads,
        "B": request.num_rows,
        "P_prompts": args.prompts,
        "G": args.group_size,
        "T": args.max_new_tokens,
        "prompt_len": request.prompt_ids.shape[1],
        "repeats": args.repeats,
        "hf_cpu_s": round(median["hf"], 4),
        "lean_cpu_s": round(median["lean"], 4),
        "cpu_ratio": round(median["hf"] / median["lean"], 2),
        "hf_wall_s": round(median_wall["hf"], 4),
        "lean_wall_s": round(median_wall["lean"], 4),
        "wall_ratio": round(median_wall["hf"] / median_wall["lean"], 2),
        "hf_tokens_per_s": round(statistics.mean(tokens["hf"]) / median["hf"], 1),
        "lean_tokens_per_s": round(statistics.mean(tokens["lean"]) / median["lean"], 1),
        "mean_completion_tokens": statistics.mean(tokens["lean"]),
        "same_tokens": f"{same}/{args.repeats}",
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=DEFAULT_MODEL_DIR,
        help="from make_tiny_model.py (built there with --seed when missing)",
    )
    parser.add_argument("--prompts", type=int, default=4, help="P prompts")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="T")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per backend (>= 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    args = parser.parse_args(argv)
    if args.repeats < 5:
        parser.error(f"--repeats must be >= 5 for a median, got {args.repeats}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    sys.stdout.write(json.dumps(run(parse_args(argv))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
