"""Time GRPO steps of creditflow's engine or TRL's ``GRPOTrainer`` on the same tiny model.

One process runs one implementation (so peak RSS is its own) and prints one JSON line::

    {"impl", "steps", "warmup_steps", "wall_s", "s_per_step", "completion_tokens",
     "tokens_per_s", "peak_rss_mb", "load_s", "warmup_s", "step_s", "reward_mean", ...}

Both runs use the model, tokenizer and prompts written by ``make_tiny_model.py``: the first
P prompts of ``prompts.jsonl``, all of them in every step, G completions each (B = P * G),
sampled at temperature 1, top-p 1, no top-k, up to T new tokens; reward = the TAPO reasoning
reward (weight 1) plus the format reward (weight 0, logged only); no KL (beta = 0), one
optimisation pass and one optimizer step per rollout batch, clip 0.2, AdamW at a fixed
learning rate with 2 warm-up steps then cosine decay, float32, the same chat template.
``benchmarks/README.md`` lists every difference that remains.

Timing: a step's time is the wall clock between the end of the previous step (or the start
of training) and the end of this one, so everything a trainer does per step (logging,
data loading) counts. Model loading and trainer construction (``load_s``) and the first
``--warmup-steps`` steps (``warmup_s``) are reported but not part of ``wall_s``.

Usage::

    .venv/bin/python benchmarks/grpo_step.py --impl creditflow --model-dir DIR \\
        --group-size 8 --prompts 4 --max-new-tokens 64 --steps 5 --threads 2 --profile

A real checkpoint (a plain Hugging Face folder with its tokenizer and chat template, e.g. the
``creditflow fetch-model smollm2-135m-instruct`` one) runs the tiny model's prompts with
``--model-dir CHECKPOINT --prompts-file DIR/prompts.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Before torch is imported: tokenizers' thread pool would compete for the 2 cores.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
import yaml  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from creditflow.models import load_tokenizer  # noqa: E402
from creditflow.rewards import format_reward, reasoning_reward  # noqa: E402

PROMPTS_FILE = "prompts.jsonl"
# Shared by both implementations; named here once so the two configs cannot drift apart.
# name -> (score(B completions, B gold answers) -> B floats, weight in the scalar reward).
REWARDS: dict[str, tuple[Callable[[list[str], list[str]], list[float]], float]] = {
    "reasoning": (reasoning_reward, 1.0),
    "format": (lambda completions, answers: format_reward(completions), 0.0),  # logged only
}
CLIP_EPS = 0.2
LR_WARMUP_STEPS = 2  # creditflow's GRPOConfig default; TRL is told the same
MAX_GRAD_NORM = 1.0


# ---------------------------------------------------------------- shared pieces
@dataclass(frozen=True)
class Workload:
    """What both implementations are asked to do; see the module docstring."""

    model_dir: Path
    prompts: list[str]  # P user turns
    answers: list[str]  # P gold answers
    group_size: int  # G
    max_new_tokens: int  # T
    steps: int  # measured steps
    warmup_steps: int  # untimed steps before them
    learning_rate: float
    seed: int
    attn_implementation: str
    # "cpu" or "cuda": where the model trains (TRL: use_cpu on "cpu").
    device: str = "cpu"
    # bfloat16 autocast around the float32 model in both (creditflow: GRPOConfig.bf16; TRL:
    # its bf16 flag), as the GPU check measures; off for the CPU comparison.
    bf16: bool = False
    # creditflow only: GRPOConfig fields set on top of the shared settings (--creditflow-set),
    # e.g. the memory knobs (micro_batch_size, gradient_checkpointing, bf16).
    creditflow_overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    @property
    def batch_size(self) -> int:  # B
        return len(self.prompts) * self.group_size


@dataclass
class StepClock:
    """End time of every step; step k lasts from the end of step k-1 (or ``start``) to its end.

    Wall time (``perf_counter``) and this process's CPU time (``process_time``, all threads)
    are both kept: on a shared machine the wall time also counts the time other processes
    held the cores, while with one thread the CPU time is close to the work itself.
    """

    started: float = 0.0
    ends: list[float] = field(default_factory=list)
    cpu_started: float = 0.0
    cpu_ends: list[float] = field(default_factory=list)

    def start(self) -> None:
        self.started, self.cpu_started = time.perf_counter(), time.process_time()

    def lap(self) -> None:
        self.ends.append(time.perf_counter())
        self.cpu_ends.append(time.process_time())

    def durations(self) -> list[float]:
        return _differences([self.started, *self.ends])

    def cpu_durations(self) -> list[float]:
        return _differences([self.cpu_started, *self.cpu_ends])


def _differences(edges: list[float]) -> list[float]:
    return [b - a for a, b in zip(edges, edges[1:], strict=False)]


@dataclass
class PhaseTimer:
    """Seconds spent per named phase, per step (index = 0-based step)."""

    seconds: dict[str, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))

    def add(self, phase: str, step: int, seconds: float) -> None:
        self.seconds[phase][step] = self.seconds[phase].get(step, 0.0) + seconds

    def timed(self, phase: str, fn: Callable, step_of: Callable[[], int]) -> Callable:
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(phase, step_of(), time.perf_counter() - t0)

        return wrapper

    def mean_over(self, steps: range) -> dict[str, float]:
        """Mean seconds per step of each phase over ``steps`` (0 where a step had none)."""
        return {
            f"{phase}_s": statistics.fmean(per_step.get(s, 0.0) for s in steps)
            for phase, per_step in sorted(self.seconds.items())
        }


def read_prompts(path: Path, n_prompts: int) -> tuple[list[str], list[str]]:
    """The first ``n_prompts`` (prompt, answer) pairs of ``path``, a ``prompts.jsonl`` or a
    folder holding one."""
    if path.is_dir():
        path = path / PROMPTS_FILE
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    if len(rows) < n_prompts:
        raise ValueError(f"{path} has {len(rows)} prompts but --prompts asks for {n_prompts}")
    rows = rows[:n_prompts]
    return [r["prompt"] for r in rows], [str(r["answer"]) for r in rows]


def load_model(work: Workload):
    """The float32 model on ``work.device`` (train mode, as both trainers train it) and its
    tokenizer."""
    model = AutoModelForCausalLM.from_pretrained(
        work.model_dir, dtype=torch.float32, attn_implementation=work.attn_implementation
    ).to(work.device)
    tokenizer = load_tokenizer(work.model_dir)
    return model, tokenizer


def peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux; the reward worker (a child process) is not included.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_gpu_mb() -> float | None:
    """The most GPU memory torch's allocator held at once in this process (None on CPU)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def summarize(
    impl: str,
    work: Workload,
    clock: StepClock,
    load_s: float,
    completion_tokens: list[float],
    rewards: list[float],
    profile: dict[str, float] | None,
) -> dict[str, Any]:
    """The JSON record of one run. ``completion_tokens``/``rewards``: one value per step."""
    step_s = clock.durations()
    if len(step_s) != work.total_steps or len(completion_tokens) != work.total_steps:
        raise RuntimeError(
            f"{impl}: expected {work.total_steps} steps, timed {len(step_s)} and "
            f"counted tokens for {len(completion_tokens)}"
        )
    measured = slice(work.warmup_steps, None)
    wall_s = sum(step_s[measured])
    tokens = sum(completion_tokens[measured])
    record = {
        "impl": impl,
        "steps": work.steps,
        "warmup_steps": work.warmup_steps,
        "prompts": len(work.prompts),
        "group_size": work.group_size,
        "max_new_tokens": work.max_new_tokens,
        "threads": torch.get_num_threads(),
        "wall_s": wall_s,
        "s_per_step": wall_s / work.steps,
        "completion_tokens": int(round(tokens)),
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "peak_rss_mb": peak_rss_mb(),
        "peak_gpu_mb": peak_gpu_mb(),
        "device": work.device,
        "bf16": work.bf16,
        "load_s": load_s,
        "warmup_s": sum(step_s[: work.warmup_steps]),
        "median_step_s": statistics.median(step_s[measured]),
        "cpu_s_per_step": sum(clock.cpu_durations()[measured]) / work.steps,
        "step_s": step_s,
        "loadavg_1m": os.getloadavg()[0],  # other processes on the machine skew every number
        "reward_mean": statistics.fmean(rewards[measured]),
    }
    if impl == "creditflow" and work.creditflow_overrides:
        record["creditflow_overrides"] = work.creditflow_overrides
    if profile is not None:
        record["profile"] = profile
    return record


# ---------------------------------------------------------------- creditflow
def run_creditflow(work: Workload, profile: bool) -> dict[str, Any]:
    from creditflow.algorithms import logprobs as logprobs_module  # noqa: PLC0415
    from creditflow.training import GRPOConfig, GRPOTrainer  # noqa: PLC0415
    from creditflow.training.grpo_runs import grpo_policy  # noqa: PLC0415

    t0 = time.perf_counter()
    model, tokenizer = load_model(work)

    def reward_fn(completions: list[str], prompt_index: torch.Tensor) -> dict[str, torch.Tensor]:
        gold = [work.answers[i] for i in prompt_index.tolist()]
        return {
            name: torch.tensor(score(completions, gold)) for name, (score, _) in REWARDS.items()
        }

    config = GRPOConfig(
        steps=work.total_steps,
        prompts_per_step=len(work.prompts),
        group_size=work.group_size,
        num_iterations=1,
        minibatch_size=None,  # one optimizer step per rollout batch
        learning_rate=work.learning_rate,
        weight_decay=0.0,
        max_grad_norm=MAX_GRAD_NORM,
        warmup_steps=LR_WARMUP_STEPS,
        clip_low=CLIP_EPS,
        clip_high=CLIP_EPS,
        beta=0.0,
        agg="seq-mean-token-mean",  # = TRL loss_type="grpo" (docs/methods/grpo.md)
        max_new_tokens=work.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        rewards={name: weight for name, (_, weight) in REWARDS.items()},
        seed=work.seed,
        log_samples_every=0,
        bf16=work.bf16,
    )
    config = GRPOConfig.from_params({**config.to_dict(), **work.creditflow_overrides})
    # The rollout backend config.rollout names (--rollout), as a Kedro run builds it.
    policy = grpo_policy(model, tokenizer, config)
    trainer = GRPOTrainer(policy, work.prompts, reward_fn, config, checkpoints=None, progress=False)
    load_s = time.perf_counter() - t0

    clock = StepClock()
    current = {"step": 0}
    timer = PhaseTimer()
    step = trainer.step

    def timed_step(index: int) -> dict[str, float]:
        current["step"] = index
        try:
            return step(index)
        finally:
            clock.lap()

    # Instance attributes shadow the methods the loop calls; the engine itself is untouched.
    trainer.step = timed_step
    if profile:

        def step_of() -> int:
            return current["step"]

        # The policy's generate wraps whichever backend samples (hf, lean, vllm).
        policy.generate = timer.timed("generate", policy.generate, step_of)
        logprobs = policy.completion_logprobs

        def split_logprobs(batch, with_entropy=False):
            phase = "update_forward" if torch.is_grad_enabled() else "old_logp"
            return timer.timed(phase, logprobs, step_of)(batch, with_entropy)

        policy.completion_logprobs = split_logprobs
        logprobs_module.topp_entropy = timer.timed("entropy", logprobs_module.topp_entropy, step_of)
        trainer.reward_fn = timer.timed("reward", reward_fn, step_of)

    clock.start()
    result = trainer.train()
    history = result.history
    B = work.batch_size
    tokens = [row["completion/length"] * B for row in history]
    rewards = [row["reward/total"] for row in history]

    phases = None
    if profile:
        measured = range(work.warmup_steps, work.total_steps)
        for index, row in enumerate(history):
            timer.add("rollout", index, row["time/rollout_s"])
            timer.add("update", index, row["time/update_s"])
        phases = timer.mean_over(measured)
        # completion_logprobs includes the top-p entropy; report the forward pass alone.
        # (Absent when the rollout skips its scoring pass: one optimizer step per rollout.)
        phases["old_logp_s"] = phases.get("old_logp_s", 0.0) - phases.get("entropy_s", 0.0)
        phases["backward_optimizer_s"] = phases["update_s"] - phases["update_forward_s"]
    return summarize("creditflow", work, clock, load_s, tokens, rewards, phases)


# ---------------------------------------------------------------- TRL
def _completion_text(completion: Any) -> str:
    # Conversational datasets give [{"role": "assistant", "content": ...}], plain ones a str.
    return completion if isinstance(completion, str) else completion[-1]["content"]


def trl_reward_function(name: str) -> Callable[..., list[float]]:
    """``REWARDS[name]`` with TRL's signature; TRL passes the dataset's ``answer`` column as a
    keyword and names the reward's metrics after ``__name__``."""
    score, _ = REWARDS[name]

    def reward(prompts: list, completions: list, answer: list[str], **kwargs: Any) -> list[float]:
        return score([_completion_text(c) for c in completions], answer)

    reward.__name__ = name
    return reward


def run_trl(work: Workload, profile: bool) -> dict[str, Any]:
    from transformers import TrainerCallback  # noqa: PLC0415
    from trl import GRPOConfig as TRLGRPOConfig  # noqa: PLC0415
    from trl import GRPOTrainer as TRLGRPOTrainer  # noqa: PLC0415
    from trl.extras import profiling  # noqa: PLC0415

    from datasets import Dataset  # noqa: PLC0415

    clock = StepClock()
    timer = PhaseTimer()
    step_logs: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.start()

        def on_step_end(self, args, state, control, **kwargs):
            clock.lap()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:  # the per-step training log, not the final summary
                step_logs.append(dict(logs))

    if profile:
        # TRL times its phases with ProfilingContext but only reports them to wandb/mlflow/
        # trackio; collect them here instead, keyed by the step they ran in (0-based).
        def collect(self, duration: float) -> None:
            phase = self.name.split(".", 1)[-1]
            timer.add(phase, self.step, duration)

        profiling.ProfilingContext._log_metrics = collect

    with tempfile.TemporaryDirectory(prefix="trl-grpo-bench-") as output_dir:
        args = TRLGRPOConfig(
            output_dir=output_dir,
            per_device_train_batch_size=work.batch_size,
            gradient_accumulation_steps=1,
            num_generations=work.group_size,
            max_completion_length=work.max_new_tokens,
            beta=0.0,
            num_iterations=1,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            learning_rate=work.learning_rate,
            lr_scheduler_type="cosine",
            warmup_steps=LR_WARMUP_STEPS,
            weight_decay=0.0,
            max_grad_norm=MAX_GRAD_NORM,
            optim="adamw_torch",  # creditflow's plain torch.optim.AdamW (TRL's default is the fused one)
            epsilon=CLIP_EPS,
            epsilon_high=CLIP_EPS,
            loss_type="grpo",
            scale_rewards="group",
            reward_weights=[weight for _, weight in REWARDS.values()],
            max_steps=work.total_steps,
            logging_steps=1,
            report_to="none",
            use_cpu=work.device == "cpu",
            bf16=work.bf16,  # TRL defaults to bf16 autocast; creditflow's bf16 is the same
            fp16=False,
            activation_checkpointing=False,  # TRL defaults to True; creditflow never checkpoints
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=work.seed,
        )
        t0 = time.perf_counter()
        model, tokenizer = load_model(work)
        dataset = Dataset.from_list(
            [
                {"prompt": [{"role": "user", "content": p}], "answer": a}
                for p, a in zip(work.prompts, work.answers, strict=True)
            ]
        )
        trainer = TRLGRPOTrainer(
            model=model,
            reward_funcs=[trl_reward_function(name) for name in REWARDS],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Clock()],
        )
        load_s = time.perf_counter() - t0
        precision = "bf16" if work.bf16 else "no"
        if (
            trainer.accelerator.mixed_precision != precision
            or trainer.args.activation_checkpointing
        ):
            raise RuntimeError(
                f"TRL must train with mixed precision {precision!r} and without activation "
                f"checkpointing"
            )
        trainer.train()

    B = work.batch_size
    tokens = [row["completions/mean_length"] * B for row in step_logs]
    rewards = [row["reward"] for row in step_logs]
    phases = None
    if profile:
        measured = range(work.warmup_steps, work.total_steps)
        step_s = clock.durations()
        for index, seconds in enumerate(step_s):
            timer.add("step", index, seconds)
        phases = timer.mean_over(measured)
        # The same keys as creditflow's profile, from TRL's own phase names. _prepare_inputs =
        # generation + rewards + advantages: TRL's whole rollout. TRL computes no old_logp
        # when strictly on-policy (it uses the training forward's logp.detach()).
        phases["generate_s"] = phases.get("transformers.generate_s", 0.0)
        phases["reward_s"] = phases.get("_calculate_rewards_s", 0.0)
        phases["old_logp_s"] = 0.0
        phases["rollout_s"] = phases.get("_prepare_inputs_s", 0.0)
        phases["update_s"] = phases["step_s"] - phases["rollout_s"]
        phases["update_forward_s"] = phases.get("compute_loss_s", 0.0)
        phases["backward_optimizer_s"] = phases["update_s"] - phases["update_forward_s"]
    return summarize("trl", work, clock, load_s, tokens, rewards, phases)


IMPLEMENTATIONS: dict[str, Callable[[Workload, bool], dict[str, Any]]] = {
    "creditflow": run_creditflow,
    "trl": run_trl,
}


# ---------------------------------------------------------------- CLI
def parse_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(KEY, VALUE read as YAML)``.

    >>> parse_setting("micro_batch_size=8"), parse_setting("bf16=true")
    (('micro_batch_size', 8), ('bf16', True))
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", required=True, choices=sorted(IMPLEMENTATIONS))
    parser.add_argument("--model-dir", type=Path, required=True, help="from make_tiny_model.py")
    parser.add_argument(
        "--prompts-file",
        type=Path,
        default=None,
        help="the prompts.jsonl to read (default: the one in --model-dir); lets a real "
        "checkpoint, e.g. the fetched SmolLM2-135M-Instruct, run make_tiny_model.py's prompts",
    )
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument("--prompts", type=int, default=4, help="P prompts per step")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="T")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    parser.add_argument("--profile", action="store_true", help="add per-phase seconds per step")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--bf16", action="store_true", help="bfloat16 autocast in both (float32 weights)"
    )
    parser.add_argument(
        "--creditflow-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a creditflow GRPOConfig field (VALUE read as YAML), e.g. micro_batch_size=8",
    )
    parser.add_argument(
        "--rollout",
        default=None,
        help="creditflow's rollout backend by name (hf, lean, vllm): short for "
        "--creditflow-set 'rollout={name: NAME}'",
    )
    args = parser.parse_args(argv)
    for name in ("group_size", "prompts", "max_new_tokens", "steps", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.group_size < 2:
        parser.error("--group-size must be >= 2 (group-relative advantages)")
    if args.warmup_steps < 0:
        parser.error("--warmup-steps must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    prompts, answers = read_prompts(args.prompts_file or args.model_dir, args.prompts)
    work = Workload(
        model_dir=args.model_dir,
        prompts=prompts,
        answers=answers,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        learning_rate=args.lr,
        seed=args.seed,
        attn_implementation=args.attn,
        device=args.device,
        bf16=args.bf16,
        creditflow_overrides={
            **dict(parse_setting(text) for text in args.creditflow_set),
            **({"rollout": {"name": args.rollout}} if args.rollout else {}),
        },
    )
    # Trainers print their logs; stdout carries only the JSON record.
    with contextlib.redirect_stdout(sys.stderr):
        record = IMPLEMENTATIONS[args.impl](work, args.profile)
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
