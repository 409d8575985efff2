"""benchmarks/experience_ab_seeds.py: its per-unit values and the paired intervals over seeds;
the runs themselves call the chain's nodes (tests/pipelines)."""

import doctest
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from creditflow.chain.ab_test import controls
from creditflow.chain.ab_test.simulated_ab import CLICKS, LONG_VIEWS
from creditflow.chain.reranker.data import LOGGED

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "experience_ab_seeds.py"
spec = importlib.util.spec_from_file_location("bench_experience_ab_seeds", SCRIPT)
seeds = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = seeds
spec.loader.exec_module(seeds)


def test_doctests():
    assert doctest.testmod(seeds).failed == 0


def test_the_shuffle_and_the_session_contrasts_are_the_chains():
    # One home: the chain's reranker_ab contrast rows and this script share them
    # (tests/chain/ab_test/test_controls.py tests them).
    assert seeds.shuffled_scores is controls.shuffled_scores
    assert seeds.session_differences is controls.session_differences
    assert seeds.contrast_rows is controls.contrast_rows


def test_unit_values_are_ratios_and_differences_against_the_logged_order():
    per_session = pd.DataFrame(
        {
            "ranker": [LOGGED, LOGGED, "a", "a"],
            CLICKS: [1.0, 3.0, 1.0, 5.0],  # means 2 and 3: +50 %
            LONG_VIEWS: [1.0, 1.0, 0.5, 0.5],  # means 1 and 0.5: -50 %
            seeds.NDCG: [0.5, 0.7, 0.6, 0.9],  # means 0.6 and 0.75: +0.15
        }
    )
    row = seeds.unit_values(per_session).set_index("ranker").loc["a"]
    assert row["ctr_change"] == pytest.approx(0.5)
    assert row["long_view_change"] == pytest.approx(-0.5)
    assert row["true_ndcg_diff"] == pytest.approx(0.15)


def test_contrasts_pair_unit_by_unit():
    # page_grpo - page_grpo_r_old_only per unit: ctr +0.01, +0.03, +0.02 -> mean 0.02, sd 0.01,
    # se 0.00577, t(0.975, 2) = 4.3027 -> [-0.0048, +0.0448]: a null, with its MDE.
    rows = []
    for unit, (a, b) in enumerate([(0.01, 0.0), (0.05, 0.02), (0.04, 0.02)]):
        for ranker, ctr in (("page_grpo", a), ("page_grpo_r_old_only", b)):
            rows.append(
                {
                    "expmodel_seed": unit,
                    "grpo_seed": 0,
                    "ranker": ranker,
                    "ctr_change": ctr,
                    "long_view_change": 0.0,
                    "true_ndcg_diff": 0.0,
                }
            )
    table = seeds.summarise_units(pd.DataFrame(rows)).set_index("row")
    contrast = table.loc["page_grpo - page_grpo_r_old_only"]
    assert contrast["units"] == 3
    assert contrast["ctr_change"] == pytest.approx(0.02)
    assert contrast["ctr_change_low"] == pytest.approx(0.02 - 4.3027 * 0.01 / 3**0.5, abs=1e-4)
    assert "not detectable (MDE" in contrast["ctr_change_text"]


def test_one_unit_is_paired_over_sessions():
    # Two sessions; logged clicks 1 and 3 (mean 2). a - b clicks: +0.2, +0.6 -> over the
    # logged mean: +0.1, +0.3, mean 0.2 = a's CTR change (+0.3) - b's (+0.1).
    per_session = pd.DataFrame(
        {
            "ranker": [
                LOGGED,
                LOGGED,
                "page_grpo",
                "page_grpo",
                "page_grpo_with_oracle",
                "page_grpo_with_oracle",
            ],
            "session_id": [0, 1] * 3,
            CLICKS: [1.0, 3.0, 1.4, 3.8, 1.2, 3.2],
            LONG_VIEWS: [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
            seeds.NDCG: [0.5, 0.5, 0.6, 0.6, 0.7, 0.7],
        }
    )
    table = seeds.summarise_sessions(per_session).set_index("row")
    assert table.loc["page_grpo", "ctr_change"] == pytest.approx(0.3)
    contrast = table.loc["page_grpo_with_oracle - page_grpo"]
    assert contrast["ctr_change"] == pytest.approx(-0.2)
    assert contrast["true_ndcg_diff"] == pytest.approx(0.1)
    assert (table["basis"] == "sessions (1 seed)").all()
