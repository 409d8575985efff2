"""The comparison intervals (creditflow.reporting.stats): hand-computed cases, the
scipy interval against a slow reference formula, the pairing by problem and seed."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from creditflow.reporting.stats import (
    PROBLEMS_BASIS,
    SEEDS_BASIS,
    comparison_intervals,
    difference_interval,
    interval_basis,
    minimum_detectable_effect,
    paired_differences,
    t_interval,
)

# t_{0.975} with 2 and 4 degrees of freedom, from a printed table of Student's t.
T_975_DF2, T_975_DF4 = 4.302653, 2.776445


def _student_t_quantile(p: float, df: int) -> float:
    """The slow reference: Student's t density integrated by Simpson's rule from 0, and the
    quantile found by bisection on the CDF (no scipy)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))

    def cdf(x: float, n: int = 20_000) -> float:  # n even; the density is symmetric about 0
        h = x / n
        total = sum(
            (1 if i in (0, n) else 4 if i % 2 else 2)
            * c
            * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2)
            for i in range(n + 1)
        )
        return 0.5 + total * h / 3

    low, high = 0.0, 100.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def _reference_interval(values, confidence=0.95):
    x = [float(v) for v in values]
    n = len(x)
    mean = sum(x) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
    half = _student_t_quantile((1 + confidence) / 2, n - 1) * s / math.sqrt(n)
    return mean, s / math.sqrt(n), mean - half, mean + half


def test_three_seed_toy_has_the_hand_computed_t_interval():
    # Per-seed mean differences 1, 2, 3: mean 2, s = 1, se = 1 / sqrt(3) = 0.57735;
    # half width t_{0.975, 2} * se = 4.302653 * 0.57735 = 2.48414 -> [-0.48414, 4.48414].
    mean, se, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0)
    assert se == pytest.approx(1 / math.sqrt(3))
    assert (low, high) == pytest.approx(
        (2 - T_975_DF2 / math.sqrt(3), 2 + T_975_DF2 / math.sqrt(3))
    )
    assert (low, high) == pytest.approx((-0.48414, 4.48414), abs=1e-5)


def test_three_seed_toy_from_a_score_table():
    # Two problems; the warm start scores (0, 1). Seeds 0, 1, 2 of "s" score each problem
    # 1, 2, 3 above it: per-seed mean differences 1, 2, 3, the interval above.
    warm = [("sft", np.nan, p, v) for p, v in (("a", 0.0), ("b", 1.0))]
    trained = [
        ("s", seed, p, v + seed + 1) for seed in (0, 1, 2) for p, v in (("a", 0.0), ("b", 1.0))
    ]
    scores = pd.DataFrame(warm + trained, columns=["policy", "seed", "id", "value"])
    interval = difference_interval(paired_differences(scores, "s", "sft", ["id"]))
    assert interval.basis == SEEDS_BASIS and interval.n == 3
    assert interval.mean == pytest.approx(2.0)
    half = T_975_DF2 / math.sqrt(3)
    assert (interval.low, interval.high) == pytest.approx((2 - half, 2 + half))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("n", "confidence"), [(2, 0.95), (5, 0.95), (5, 0.9), (12, 0.99)])
def test_scipy_interval_matches_the_slow_reference_formula(seed, n, confidence):
    values = np.random.default_rng(seed).normal(0.02, 0.05, size=n)
    assert t_interval(values, confidence) == pytest.approx(
        _reference_interval(values, confidence), rel=1e-6, abs=1e-9
    )


def test_the_reference_quantile_is_the_printed_table():
    assert _student_t_quantile(0.975, 2) == pytest.approx(T_975_DF2, abs=1e-5)
    assert _student_t_quantile(0.975, 4) == pytest.approx(T_975_DF4, abs=1e-5)


def test_too_few_values_give_no_interval_and_equal_values_a_point():
    assert all(math.isnan(v) for v in t_interval([]))
    mean, se, low, high = t_interval([0.3])
    assert mean == 0.3 and all(math.isnan(v) for v in (se, low, high))
    assert t_interval([0.5, 0.5, 0.5]) == (0.5, 0.0, 0.5, 0.5)
    with pytest.raises(ValueError, match="confidence"):
        t_interval([1.0, 2.0], confidence=95)


def test_one_seed_falls_back_to_a_paired_interval_over_problems():
    # One seed, three problems: differences (0.3, 0.0, 0.1), the t interval over them.
    scores = pd.DataFrame(
        {
            "policy": ["sft"] * 3 + ["s"] * 3,
            "seed": [np.nan] * 3 + [0] * 3,
            "id": ["a", "b", "c", "c", "a", "b"],  # another order: pairing goes by id
            "value": [0.5, 0.2, 0.8, 0.9, 0.8, 0.2],
        }
    )
    interval = difference_interval(paired_differences(scores, "s", "sft", ["id"]))
    assert interval.basis == PROBLEMS_BASIS and interval.n == 3
    expected = _reference_interval([0.3, 0.0, 0.1])
    assert (interval.mean, interval.se, interval.low, interval.high) == pytest.approx(expected)
    assert interval_basis(1) == PROBLEMS_BASIS and interval_basis(2) == SEEDS_BASIS


def test_a_seeded_reference_pairs_seed_by_seed_and_the_warm_start_every_seed():
    scores = pd.DataFrame(
        {
            "policy": ["sft", "base", "base", "s", "s"],
            "seed": [np.nan, 0, 1, 0, 1],
            "id": "a",
            "value": [0.1, 0.2, 0.5, 0.4, 0.6],
        }
    )
    vs_base = paired_differences(scores, "s", "base", ["id"]).set_index("seed")["diff"]
    assert vs_base.to_dict() == pytest.approx({0: 0.2, 1: 0.1})  # 0.4 - 0.2, 0.6 - 0.5
    vs_warm = paired_differences(scores, "s", "sft", ["id"]).set_index("seed")["diff"]
    assert vs_warm.to_dict() == pytest.approx({0: 0.3, 1: 0.5})
    doubled = pd.concat([scores, scores.iloc[[0]]])
    with pytest.raises(ValueError, match="several scores"):
        paired_differences(doubled, "s", "sft", ["id"])


def test_with_several_seeds_the_interval_is_over_seed_means_not_pooled_pairs():
    # Seed 0 gains 0.1 on each of 50 problems, seed 1 gains 0.3: pooled pairs would give a
    # narrow interval around 0.2; over the two seed means it is 0.2 +- t(1) * 0.1 (12.7x).
    ids = [f"p{i}" for i in range(50)]
    rows = [("sft", np.nan, i, 0.0) for i in ids]
    rows += [("s", seed, i, gain) for seed, gain in ((0, 0.1), (1, 0.3)) for i in ids]
    scores = pd.DataFrame(rows, columns=["policy", "seed", "id", "value"])
    interval = difference_interval(paired_differences(scores, "s", "sft", ["id"]))
    assert interval.n == 2 and interval.se == pytest.approx(0.1)
    assert interval.high - interval.mean == pytest.approx(12.706205 * 0.1, rel=1e-6)


def test_comparison_intervals_columns_and_no_interval_for_the_baseline_itself():
    ids = ["a", "b", "c"]
    rows = [("sft", np.nan, i, 0.0) for i in ids]
    for policy, offset in (("base", 0.1), ("s", 0.3)):
        rows += [
            (policy, seed, i, offset + 0.05 * seed + 0.01 * k)
            for seed in (0, 1, 2)
            for k, i in enumerate(ids)
        ]
    scores = pd.DataFrame(rows, columns=["policy", "seed", "id", "value"])
    table = comparison_intervals(scores, ["id"], "sft", "base", "eval_reward", "seen")
    assert table.index.tolist() == ["base", "s"]
    assert list(table.columns) == [
        f"eval_reward_{what}{stat}_seen"
        for what in ("gain", "vs_baseline")
        for stat in ("", "_se", "_ci_low", "_ci_high", "_mde")
    ]
    # s - base = 0.2 on every (problem, seed): a zero-width interval at 0.2.
    assert table.loc[
        "s", ["eval_reward_vs_baseline_ci_low_seen", "eval_reward_vs_baseline_ci_high_seen"]
    ].tolist() == pytest.approx([0.2, 0.2])
    # Gain of s over the warm start (0): per-seed means 0.3 + 0.05 seed + 0.01 = 0.31, 0.36, 0.41.
    gain = _reference_interval([0.31, 0.36, 0.41])
    assert table.loc[
        "s",
        [
            "eval_reward_gain_seen",
            "eval_reward_gain_se_seen",
            "eval_reward_gain_ci_low_seen",
            "eval_reward_gain_ci_high_seen",
        ],
    ].tolist() == (pytest.approx(list(gain)))
    assert table.loc["base", [c for c in table.columns if "vs_baseline" in c]].isna().all()
    no_baseline = comparison_intervals(scores, ["id"], "sft", None, "eval_reward", "seen")
    assert no_baseline.filter(like="vs_baseline").isna().all().all()
    assert comparison_intervals(
        scores[scores["policy"] != "sft"], ["id"], "sft", "base", "eval_reward", "seen"
    ).empty


def test_the_minimum_detectable_effect_by_hand_and_its_power():
    # n = 5: (t(0.975, 4) + t(0.8, 4)) * se = (2.7764 + 0.9410) * 0.01
    assert minimum_detectable_effect(0.01, 5) == pytest.approx(0.037174, abs=1e-6)
    assert np.isnan(minimum_detectable_effect(0.01, 1))
    assert np.isnan(minimum_detectable_effect(float("nan"), 5))
    # A true effect of one MDE (se known) is detected by the two-sided t test with about 80 %
    # probability: the exact power from the noncentral t, 0.79 at n = 5, 0.80 at n = 40.
    for n, expected in ((5, 0.791), (40, 0.800)):
        df, d = n - 1, minimum_detectable_effect(1.0, n)
        critical = stats.t.ppf(0.975, df)
        power = 1 - stats.nct.cdf(critical, df, d) + stats.nct.cdf(-critical, df, d)
        assert power == pytest.approx(expected, abs=0.002)


def test_the_comparison_table_carries_the_mde_of_each_difference():
    ids = ["a", "b"]
    rows = [("sft", np.nan, i, 0.0) for i in ids]
    rows += [("s", seed, i, 0.1 + 0.02 * seed) for seed in (0, 1, 2, 3) for i in ids]
    scores = pd.DataFrame(rows, columns=["policy", "seed", "id", "value"])
    table = comparison_intervals(scores, ["id"], "sft", None, "eval_reward", "seen")
    se = table.loc["s", "eval_reward_gain_se_seen"]
    assert table.loc["s", "eval_reward_gain_mde_seen"] == pytest.approx(
        minimum_detectable_effect(se, 4)
    )
