"""What the token-level credit inspector costs a GRPO step: a comparison's GRPO with the
inspector at its default setting (``{steps: null, rollouts: 4}``: the first, a middle and the
last step, 4 completions each) against the same run with it off.

``--pipeline tapo`` (the default) runs the tapo pipeline's own nodes
(``creditflow.pipelines.tapo.nodes``) at the default ``conf/base/parameters_tapo.yml`` (tiny
text policy, 16 prompts x 8 completions, up to 80 new tokens, 25 steps), strategy ``tapo``;
``--pipeline tor`` the tor pipeline's (``creditflow.pipelines.tor.nodes``) at
``conf/base/parameters_tor.yml`` (tiny Qwen2.5-VL, 16 prompts x 8, up to 40 new tokens, 200
steps), strategy ``tor``, whose inspector also scores the recorded completions without the
image (one no-image forward over the 4 recorded rows). Either from one SFT warm start kept in
``--workdir`` (trained once, then loaded). The inspector consumes no random numbers, so a run
with it on samples exactly what the run with it off does and the two can be compared step by
step. The runs alternate (off, on,
then on, off, ...) so drifting load hits both alike; each pair gives two ratios:

- ``run``: mean ``time/step_s`` over all steps, on / off (what the default setting costs a run);
- ``recorded``: mean ``time/step_s`` over the recorded steps only, on / off (what recording
  costs the step it records);
- ``other``: the same over the steps it does not record (what the inspector costs there: 0
  but noise).

On a busy machine the difference of two runs is noisy, so the runs with the inspector on also
time the recorder itself (its ``begin``, ``observe`` and ``finish``, wrapped here): ``direct``
is that time over the recorded steps' own ``time/step_s``, the added share of a recorded step
measured inside one run.

``--sft-steps``, ``--steps`` and ``--prompts-per-step`` shrink the warm start and the run on a
busy machine; ``--train-problems`` the training problems drawn (and the tokenizer trained on)
before the warm start (tor's ``tasks.n_train``, 8,000; tapo's ``tasks.n_train_per_language``). Both err on the costly side: the recorder's work is fixed (4 completions) while a
smaller batch makes the step it is compared with cheaper, and it grows with the recorded
completions' length, which a short warm start leaves near ``max_new_tokens``.

Printed: every pair's ratios, their medians, and the load average before and after.
Usage (``benchmarks/README.md``, "Cost of the credit inspector")::

    .venv/bin/python benchmarks/credit_overhead.py --repeats 3 --workdir /tmp/credit_overhead \
        --sft-steps 100 --steps 5 --prompts-per-step 4
    .venv/bin/python benchmarks/credit_overhead.py --pipeline tor --repeats 2 \
        --workdir /tmp/credit_overhead --sft-steps 100 --steps 5 --prompts-per-step 4
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")

from kedro.config import OmegaConfigLoader  # noqa: E402

from creditflow.config.grpo import CreditInspection  # noqa: E402
from creditflow.pipelines.tapo import nodes as tapo_nodes  # noqa: E402
from creditflow.pipelines.tor import nodes as tor_nodes  # noqa: E402
from creditflow.training.checkpoint import CheckpointStore  # noqa: E402
from creditflow.training.credit import CreditRecorder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INSPECTOR = {"steps": None, "rollouts": 4}


def pipeline_params(group: str, grpo: dict[str, Any], sft: dict[str, Any]) -> dict[str, Any]:
    """``params:<group>`` of conf/base, with ``grpo`` and ``sft`` keys overridden."""
    loader = OmegaConfigLoader(str(ROOT / "conf"), base_env="base", default_run_env="base")
    params = copy.deepcopy(loader["parameters"][group])
    params["grpo"].update(grpo)
    params["sft"].update(sft)
    return params


# (SFT policy, tokenizer or processor, training tasks): what a pipeline's GRPO node starts from.
Setup = tuple[Any, Any, Any]


def tapo_warm_start(params: dict[str, Any], workdir: Path) -> Setup:
    """(SFT policy, tokenizer, training tasks) of the tapo pipeline, the SFT resumed from (or
    saved to) ``workdir/sft``."""
    train_tasks, _ = tapo_nodes.build_tapo_tasks(None, params)
    tokenizer = tapo_nodes.train_tapo_tokenizer(train_tasks, params)
    initial = tapo_nodes.build_tapo_policy(tokenizer, params)
    policy, _ = tapo_nodes.warm_start_tapo_policy(
        initial, tokenizer, train_tasks, CheckpointStore(workdir / "sft"), params
    )
    return policy, tokenizer, train_tasks


def tor_warm_start(params: dict[str, Any], workdir: Path) -> Setup:
    """(SFT policy, processor, training tasks) of the tor pipeline, the SFT resumed from (or
    saved to) ``workdir/sft`` (each SFT run keeps its own subdirectory there)."""
    train_tasks, _ = tor_nodes.build_tor_tasks(None, params)
    processor = tor_nodes.train_tor_processor(train_tasks, params)
    initial = tor_nodes.build_tor_policy(processor, params)
    policy, _ = tor_nodes.warm_start_tor_policy(
        initial, processor, train_tasks, CheckpointStore(workdir / "sft"), params
    )
    return policy, processor, train_tasks


@dataclass(frozen=True)
class Testbed:
    """A comparison pipeline as this benchmark runs it: its warm start, its one-seed GRPO node
    (``(policy, tokenizer, tasks, checkpoints, params, strategy) -> (model, metrics, samples,
    credit)``) and the ``tasks`` key of its number of training problems."""

    warm_start: Callable[[dict[str, Any], Path], Setup]
    train: Callable[..., tuple[Any, Any, Any, Any]]
    problems_key: str


TESTBEDS = {
    "tapo": Testbed(tapo_warm_start, tapo_nodes.train_tapo_policy, "n_train_per_language"),
    "tor": Testbed(tor_warm_start, tor_nodes.train_tor_policy, "n_train"),
}


class RecorderClock:
    """Seconds spent in ``CreditRecorder``'s methods while it is installed (a benchmark-only
    wrapper: the engine is not instrumented)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._originals = {}

    def __enter__(self) -> RecorderClock:
        for name in ("begin", "observe", "finish"):
            original = getattr(CreditRecorder, name)
            self._originals[name] = original

            def timed(recorder, *args, _original=original, **kwargs):
                started = time.perf_counter()
                try:
                    return _original(recorder, *args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - started

            setattr(CreditRecorder, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._originals.items():
            setattr(CreditRecorder, name, original)


def timed_run(
    testbed: Testbed,
    setup: Setup,
    params: dict[str, Any],
    inspector: dict | None,
    strategy: str,
):
    """``time/step_s`` per step (a list) of one GRPO run, and its credit rows."""
    params = copy.deepcopy(params)
    params["grpo"]["credit_inspector"] = inspector
    params["grpo"]["checkpoint_every"] = 0
    policy, tokenizer, tasks = setup
    _, metrics, _, credit = testbed.train(
        policy, tokenizer, tasks, None, params, params["strategies"][strategy]
    )
    return metrics["time/step_s"].tolist(), credit


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def ratio(on: list[float], off: list[float], steps: list[int]) -> float:
    """Mean time of ``steps`` (0-based) with the inspector on over the same steps off.

    >>> ratio([1.0, 2.2, 1.0], [1.0, 2.0, 1.0], [1])
    1.1
    """
    return round(sum(on[s] for s in steps) / sum(off[s] for s in steps), 6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="(off, on) pairs")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/credit_overhead"))
    parser.add_argument("--pipeline", choices=sorted(TESTBEDS), default="tapo")
    parser.add_argument(
        "--strategy",
        default=None,
        help="one of <pipeline>.strategies (default: the pipeline's name)",
    )
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: YAML's)")
    parser.add_argument("--sft-steps", type=int, default=None, help="default: YAML's")
    parser.add_argument("--prompts-per-step", type=int, default=None, help="default: YAML's")
    parser.add_argument(
        "--train-problems",
        type=int,
        default=None,
        help="tor: tasks.n_train, tapo: tasks.n_train_per_language (default: YAML's)",
    )
    args = parser.parse_args()
    testbed, strategy = TESTBEDS[args.pipeline], args.strategy or args.pipeline
    grpo = {"steps": args.steps, "prompts_per_step": args.prompts_per_step}
    params = pipeline_params(
        args.pipeline,
        {key: value for key, value in grpo.items() if value is not None},
        {} if args.sft_steps is None else {"steps": args.sft_steps},
    )
    if args.train_problems is not None:
        params["tasks"][testbed.problems_key] = args.train_problems
    if strategy not in params["strategies"]:
        parser.error(
            f"--strategy {strategy!r}: {args.pipeline}.strategies has {list(params['strategies'])}"
        )
    say(f"{args.pipeline} / {strategy}; load before: {os.getloadavg()}")
    setup = testbed.warm_start(params, args.workdir)
    total = params["grpo"]["steps"]
    recorded = sorted(s - 1 for s in CreditInspection(**DEFAULT_INSPECTOR).recorded_steps(total))
    others = [s for s in range(total) if s not in recorded]
    run_ratios, recorded_ratios, other_ratios, direct = [], [], [], []
    for pair in range(args.repeats):
        times = {}
        for mode in ("off", "on") if pair % 2 == 0 else ("on", "off"):
            started = time.perf_counter()
            inspector = DEFAULT_INSPECTOR if mode == "on" else None
            with RecorderClock() as clock:
                times[mode], credit = timed_run(testbed, setup, params, inspector, strategy)
            if mode == "on":
                direct.append(clock.seconds / sum(times["on"][s] for s in recorded))
            say(
                f"pair {pair + 1} {mode}: {time.perf_counter() - started:.1f} s, "
                f"{len(credit)} credit rows, recorder {clock.seconds:.3f} s, "
                f"load {os.getloadavg()[0]:.2f}"
            )
        run_ratios.append(ratio(times["on"], times["off"], list(range(total))))
        recorded_ratios.append(ratio(times["on"], times["off"], recorded))
        other_ratios.append(ratio(times["on"], times["off"], others) if others else float("nan"))
        say(
            f"pair {pair + 1}: run {run_ratios[-1]:.4f}, recorded steps "
            f"{recorded_ratios[-1]:.4f}, other steps {other_ratios[-1]:.4f}, "
            f"direct {direct[-1]:.4f}"
        )
    say(
        f"median on/off over {args.repeats} pairs: run {statistics.median(run_ratios):.4f} "
        f"(all {total} steps), recorded steps {statistics.median(recorded_ratios):.4f} "
        f"(steps {[s + 1 for s in recorded]}), other steps {statistics.median(other_ratios):.4f}"
        f"; direct: recorder / recorded steps {statistics.median(direct):.4f}"
        f"; load after: {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
