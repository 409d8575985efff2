"""benchmarks/credit_overhead.py: its ratio, the recorder clock and how each pipeline is set up;
the timed runs are the tapo and tor pipelines' nodes (tests/pipelines/tapo, tests/pipelines/tor)."""

import doctest
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from creditflow.training.credit import CreditRecorder

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def overhead():
    spec = importlib.util.spec_from_file_location(
        "bench_overhead", BENCHMARKS / "credit_overhead.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_doctests_hold(overhead):
    assert doctest.testmod(overhead).failed == 0


def test_the_recorder_clock_times_the_recorder_and_restores_it(overhead):
    original = CreditRecorder.finish
    recorder = object.__new__(CreditRecorder)
    recorder._active = None  # finish() of an idle recorder returns no rows
    with overhead.RecorderClock() as clock:
        assert CreditRecorder.finish is not original
        assert recorder.finish() == []
    assert CreditRecorder.finish is original and clock.seconds > 0


@pytest.mark.parametrize("group", ["tapo", "tor"])
def test_each_pipeline_is_measured_at_its_conf_with_the_overrides(overhead, group):
    params = overhead.pipeline_params(group, {"steps": 5, "prompts_per_step": 4}, {"steps": 100})
    assert params["grpo"]["steps"] == 5 and params["grpo"]["prompts_per_step"] == 4
    assert params["sft"]["steps"] == 100
    # The "on" runs time the conf's own inspector setting; the default strategy is the method.
    assert params["grpo"]["credit_inspector"] == overhead.DEFAULT_INSPECTOR
    kind = "token_weights" if group == "tor" else "advantage"
    assert params["strategies"][group][kind]["name"] == group
    assert overhead.TESTBEDS[group].problems_key in params["tasks"]


def test_the_tor_testbed_runs_the_tor_pipelines_nodes(overhead, monkeypatch, tmp_path):
    """The warm start chains the tor nodes (tasks -> processor -> policy -> SFT, resumed from
    the workdir), and a timed run is train_tor_policy with the inspector set and no
    checkpoints."""
    calls = []
    nodes = overhead.tor_nodes

    def node(name, result):
        def fake(*args):
            calls.append((name, args))
            return result

        monkeypatch.setattr(nodes, name, fake)

    node("build_tor_tasks", ("train", "eval"))
    node("train_tor_processor", "processor")
    node("build_tor_policy", "initial")
    node("warm_start_tor_policy", ("sft policy", "sft metrics"))
    params = overhead.pipeline_params("tor", {"steps": 3}, {})
    setup = overhead.TESTBEDS["tor"].warm_start(params, tmp_path)
    assert setup == ("sft policy", "processor", "train")
    assert [name for name, _ in calls] == [
        "build_tor_tasks",
        "train_tor_processor",
        "build_tor_policy",
        "warm_start_tor_policy",
    ]
    store = calls[-1][1][3]
    assert (
        calls[-1][1][:3] == ("initial", "processor", "train")
        and store.directory == tmp_path / "sft"
    )

    seen = {}

    def train(policy, processor, tasks, checkpoints, run_params, strategy):
        seen.update(args=(policy, processor, tasks, checkpoints), params=run_params, spec=strategy)
        return None, pd.DataFrame({"time/step_s": [1.0, 2.0, 3.0]}), None, pd.DataFrame()

    testbed = overhead.Testbed(overhead.tor_warm_start, train, "n_train")
    times, _ = overhead.timed_run(testbed, setup, params, overhead.DEFAULT_INSPECTOR, "tor")
    assert times == [1.0, 2.0, 3.0]
    assert seen["args"] == ("sft policy", "processor", "train", None)
    assert seen["params"]["grpo"]["credit_inspector"] == overhead.DEFAULT_INSPECTOR
    assert seen["params"]["grpo"]["checkpoint_every"] == 0
    assert seen["spec"] == params["strategies"]["tor"]
    assert params["grpo"]["checkpoint_every"] != 0  # the caller's params are left as they were
