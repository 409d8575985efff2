"""What the token-level credit inspector costs a GRPO step: the tapo comparison's GRPO with the
inspector at its default setting (``{steps: null, rollouts: 4}``: the first, a middle and the
last step, 4 completions each) against the same run with it off.

The runs are the tapo pipeline's own nodes (``creditflow.pipelines.tapo.nodes``) at the
default ``conf/base/parameters_tapo.yml`` (tiny policy, 16 prompts x 8 completions, up to 80
new tokens, 25 steps), from one SFT warm start kept in ``--workdir`` (trained once, then
loaded). The inspector consumes no random numbers, so a run with it on samples exactly what the
run with it off does and the two can be compared step by step. The runs alternate (off, on,
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
busy machine. Both err on the costly side: the recorder's work is fixed (4 completions) while a
smaller batch makes the step it is compared with cheaper, and it grows with the recorded
completions' length, which a short warm start leaves near ``max_new_tokens``.

Printed: every pair's ratios, their medians, and the load average before and after.
Usage (``benchmarks/README.md``, "Cost of the credit inspector")::

    .venv/bin/python benchmarks/credit_overhead.py --repeats 3 --workdir /tmp/credit_overhead \
        --sft-steps 100 --steps 5 --prompts-per-step 4
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")

from kedro.config import OmegaConfigLoader  # noqa: E402

from creditflow.config.grpo import CreditInspection  # noqa: E402
from creditflow.pipelines.tapo import nodes  # noqa: E402
from creditflow.training.checkpoint import CheckpointStore  # noqa: E402
from creditflow.training.credit import CreditRecorder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INSPECTOR = {"steps": None, "rollouts": 4}


def tapo_params(grpo: dict[str, Any], sft: dict[str, Any]) -> dict[str, Any]:
    """``params:tapo`` of conf/base, with ``grpo`` and ``sft`` keys overridden."""
    loader = OmegaConfigLoader(str(ROOT / "conf"), base_env="base", default_run_env="base")
    params = copy.deepcopy(loader["parameters"]["tapo"])
    params["grpo"].update(grpo)
    params["sft"].update(sft)
    return params


def warm_start(params: dict[str, Any], workdir: Path) -> tuple[Any, Any, Any]:
    """(SFT policy, tokenizer, training tasks) of the tapo pipeline, the SFT resumed from (or
    saved to) ``workdir/sft``."""
    train_tasks, _ = nodes.build_tapo_tasks(None, params)
    tokenizer = nodes.train_tapo_tokenizer(train_tasks, params)
    initial = nodes.build_tapo_policy(tokenizer, params)
    policy, _ = nodes.warm_start_tapo_policy(
        initial, tokenizer, train_tasks, CheckpointStore(workdir / "sft"), params
    )
    return policy, tokenizer, train_tasks


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


def timed_run(setup: tuple, params: dict[str, Any], inspector: dict | None, strategy: str):
    """``time/step_s`` per step (a list) of one GRPO run, and its credit rows."""
    params = copy.deepcopy(params)
    params["grpo"]["credit_inspector"] = inspector
    params["grpo"]["checkpoint_every"] = 0
    policy, tokenizer, tasks = setup
    _, metrics, _, credit = nodes.train_tapo_policy(
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
    parser.add_argument("--strategy", default="tapo", help="a strategy of tapo.strategies")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: YAML's)")
    parser.add_argument("--sft-steps", type=int, default=None, help="default: YAML's")
    parser.add_argument("--prompts-per-step", type=int, default=None, help="default: YAML's")
    args = parser.parse_args()
    grpo = {"steps": args.steps, "prompts_per_step": args.prompts_per_step}
    params = tapo_params(
        {key: value for key, value in grpo.items() if value is not None},
        {} if args.sft_steps is None else {"steps": args.sft_steps},
    )
    say(f"load before: {os.getloadavg()}")
    setup = warm_start(params, args.workdir)
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
                times[mode], credit = timed_run(setup, params, inspector, args.strategy)
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
