"""benchmarks/credit_overhead.py: its ratio and the recorder clock; the timed runs are the tapo
pipeline's nodes (tests/pipelines/tapo)."""

import doctest
import importlib.util
import sys
from pathlib import Path

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
