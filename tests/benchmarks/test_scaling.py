"""The scaling benchmark: its slope arithmetic, and its quick mode end to end on one factor."""

import doctest
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


scaling = _load("scaling")


def test_slope_is_the_power_law_exponent():
    assert doctest.testmod(scaling).failed == 0
    # y = 2 x^0.5 at x = 1, 4, 16: log-log slope 0.5 exactly
    assert scaling.slope([1, 4, 16], [2, 4, 8]) == pytest.approx(0.5)


def test_every_factor_grows_from_the_base_one_at_a_time():
    grid = scaling.Grid()
    for factor, values in grid.values.items():
        points = grid.points(factor)
        assert [value for value, _ in points] == values
        # Exactly one field differs from the base, except at the base's own value.
        for _, point in points:
            changed = [k for k, v in vars(point).items() if v != getattr(grid.base, k)]
            assert len(changed) <= 1, (factor, changed)
    assert grid.values["group_size"] == [4, 8, 16, 32]
    assert grid.values["vocabulary"][-1] == 151936


def _row(factor, value, impl, seconds, rss):
    return {"factor": factor, "value": value, "impl": impl, "parameters": value,
            "cpu_s_per_step": seconds, "median_step_s": 2 * seconds, "peak_rss_mb": rss,
            "loadavg_1m": 1.0}  # fmt: skip


def test_table_has_both_implementations_per_point_and_their_slopes():
    # creditflow: time 1 -> 2 (slope 1), TRL: time 3 -> 12 (slope 2) when G doubles.
    rows = [
        _row("group_size", 4, "creditflow", 1.0, 100.0),
        _row("group_size", 4, "trl", 3.0, 200.0),
        _row("group_size", 8, "creditflow", 2.0, 100.0),
        _row("group_size", 8, "trl", 12.0, 400.0),
    ]
    table = scaling.markdown(rows)
    assert "| group_size | 4 | 1.000 | 3.000 | 3.00 | 2.000 | 6.000 | 100 | 200 | 1.0 |" in table
    assert "| group_size | 1.00 | 2.00 | 0.00 | 1.00 |" in table


@pytest.mark.slow
def test_quick_mode_runs_both_implementations_and_plots(tmp_path):
    records = tmp_path / "records.jsonl"
    assert scaling.main([
        "--workdir", str(tmp_path / "models"), "--quick", "--factors", "group_size",
        "--out", str(records), "--plot", str(tmp_path / "scaling.png"),
        "--markdown", str(tmp_path / "scaling.md"),
    ]) == 0  # fmt: skip
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert [(r["value"], r["impl"]) for r in rows] == [
        (2, "creditflow"),
        (2, "trl"),
        (4, "creditflow"),
        (4, "trl"),
    ]
    assert all(r["cpu_s_per_step"] > 0 and r["peak_rss_mb"] > 0 for r in rows)
    assert (tmp_path / "scaling.png").stat().st_size > 0
    assert "| group_size | " in (tmp_path / "scaling.md").read_text()
