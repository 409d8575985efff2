"""benchmarks/tor_settings.py: its --set parsing and the paired summary it writes; the run itself
calls the tor pipeline's nodes (tests/pipelines/tor)."""

import doctest
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tor_settings.py"
spec = importlib.util.spec_from_file_location("bench_tor_settings", SCRIPT)
tor_settings = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = tor_settings
spec.loader.exec_module(tor_settings)


def test_doctests():
    assert doctest.testmod(tor_settings).failed == 0


def test_settings_are_key_value_pairs():
    assert tor_settings.parse_setting("beta=0.1") == ("beta", 0.1)
    assert tor_settings.parse_setting("agg=seq-mean-token-sum") == ("agg", "seq-mean-token-sum")
    with pytest.raises(ValueError, match="not key=value"):
        tor_settings.parse_setting("steps")


def test_the_summary_pairs_problem_by_problem():
    base = pd.DataFrame(
        {"reward/reasoning": [1.0, 0.0, 0.0], "sampled/reward/reasoning": [0.5, 0.25, 0.0]}
    )
    run = pd.DataFrame(
        {"reward/reasoning": [0.0, 1.0, 1.0], "sampled/reward/reasoning": [0.75, 0.25, 0.5]}
    )
    summary = tor_settings.paired_summary(base, run)
    # greedy gains -1, +1, +1: mean 1/3, sd 1.1547, se 0.6667; sampled +0.25, 0, +0.5.
    assert summary["greedy"] == pytest.approx(2 / 3)
    assert summary["greedy_gain"] == pytest.approx(1 / 3)
    assert summary["greedy_gain_se"] == pytest.approx(2 / 3)
    assert summary["sampled_gain"] == pytest.approx(0.25)
    assert summary["sampled_gain_se"] == pytest.approx(0.25 / 3**0.5)
