"""benchmarks/claims.py: the claim table and its verdicts on hand-made per-seed tables; the
runs themselves are the tapo / tor pipelines (benchmarks/seeds.py's machinery)."""

import doctest
import importlib.util
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
pytestmark = pytest.mark.filterwarnings("ignore:register_new_resolver:UserWarning")


@pytest.fixture(scope="module")
def claims():
    spec = importlib.util.spec_from_file_location("bench_claims", BENCHMARKS / "claims.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _per_seed(values: dict[str, list[float]], metric: str = "eval_reward_seen") -> pd.DataFrame:
    """A per-seed comparison table: the warm start's row (no seed), then seeds 0.. per policy."""
    rows = [{"policy": "sft", "seed": pd.NA, metric: 0.1}]
    for policy, per_seed in values.items():
        rows += [{"policy": policy, "seed": s, metric: v} for s, v in enumerate(per_seed)]
    return pd.DataFrame(rows)


def test_the_doctests_hold(claims):
    assert doctest.testmod(claims).failed == 0


def test_a_detected_difference_on_the_expected_side_is_reproduced(claims):
    # shuffled - grpo_sum per seed: -0.10, -0.12, -0.08 -> mean -0.10, s = 0.02,
    # se = 0.02 / sqrt(3) = 0.011547, t(0.975, 2) = 4.3027 -> [-0.1497, -0.0503].
    table = _per_seed({"grpo_sum": [0.5, 0.6, 0.4], "shuffled": [0.4, 0.48, 0.32]})
    claim = claims.Claim("control", "tapo", "shuffled", "grpo_sum", -1, "x")
    row = claims.claim_row(claim, table)
    assert row["n_seeds"] == 3 and row["mean"] == pytest.approx(-0.10)
    assert row["ci_low"] == pytest.approx(-0.1497, abs=1e-4)
    assert row["ci_high"] == pytest.approx(-0.0503, abs=1e-4)
    assert row["verdict"] == "reproduced" and row["expected"] == "< 0"
    assert row["measured"] == "-0.100 [-0.150, -0.050]"


def test_the_other_side_contradicts_and_a_null_reports_its_mde(claims):
    table = _per_seed({"grpo_sum": [0.5, 0.6, 0.4], "shuffled": [0.4, 0.48, 0.32]})
    flipped = claims.Claim("c", "tapo", "shuffled", "grpo_sum", +1, "x")
    assert claims.claim_row(flipped, table)["verdict"] == "contradicted"
    # tapo - grpo_sum per seed: +0.02, -0.01, +0.02: mean 0.01, s = 0.017321, se = 0.01,
    # MDE = (t(0.975, 2) + t(0.8, 2)) * se = (4.3027 + 1.0607) * 0.01 = 0.0536.
    table = _per_seed({"grpo_sum": [0.5, 0.6, 0.4], "tapo": [0.52, 0.59, 0.42]})
    row = claims.claim_row(claims.Claim("t", "tapo", "tapo", "grpo_sum", +1, "x"), table)
    assert row["verdict"] == "not detectable at this budget (MDE 0.054)"
    assert row["mde"] == pytest.approx(0.0536, abs=1e-4)


def test_one_seed_gives_no_interval_and_a_missing_strategy_is_an_error(claims):
    row = claims.claim_row(
        claims.Claim("t", "tapo", "tapo", "grpo_sum", +1, "x"),
        _per_seed({"grpo_sum": [0.5], "tapo": [0.6]}),
    )
    assert row["verdict"] == "no interval" and math.isnan(row["ci_low"])
    same = _per_seed({"grpo_sum": [0.5, 0.6], "tapo": [0.5, 0.6]})
    row = claims.claim_row(claims.Claim("t", "tapo", "tapo", "grpo_sum", +1, "x"), same)
    assert row["verdict"] == "identical: no signal at this budget"
    with pytest.raises(ValueError, match="no rows of"):
        claims.claim_row(
            claims.Claim("t", "tapo", "tapo", "grpo_sum", +1, "x"), _per_seed({"tapo": [0.6]})
        )


def test_every_card_names_strategies_its_testbed_runs(claims):
    for claim in claims.CLAIMS:
        assert {claim.policy, claim.reference} <= set(claims.STRATEGIES[claim.group]), claim
        assert claim.expected in (-1, 1)
    table = claims.claim_table(
        list(claims.CLAIMS),
        {"tor": _per_seed({s: [0.1, 0.2] for s in claims.STRATEGIES["tor"]}, claims.METRIC["tor"])},
    )
    assert set(table["testbed"]) == {"tor"} and len(table) == 4
    assert claims.markdown(table).count("\n") == len(table) + 1


def test_the_cards_strategies_pass_the_pipelines_checks(claims, project_root):
    """Every strategy the cards run builds a valid GRPO config over its testbed's parameters,
    so a full run cannot fail after hours on a typo."""
    from kedro.config import OmegaConfigLoader  # noqa: PLC0415 - only this test needs Kedro

    from creditflow.training.grpo_runs import check_comparison_params  # noqa: PLC0415

    loader = OmegaConfigLoader(str(project_root / "conf"), base_env="base", default_run_env="base")
    for group, strategies in claims.STRATEGIES.items():
        params = {**loader["parameters"][group], "strategies": strategies}
        # The tor testbed's policy is vision-language: it has the no-image pass.
        check_comparison_params(group, params, has_image_pass=group == "tor")


def test_a_card_whose_strategies_were_not_run_is_listed_as_not_run(claims):
    # a tor run of only the positive control's two strategies
    table = _per_seed(
        {"uniform": [0.5, 0.6, 0.4], "shuffled": [0.4, 0.48, 0.32]}, "sampled_accuracy_synthetic"
    )
    cards = claims.claim_table(list(claims.CLAIMS), {"tor": table})
    assert set(cards["testbed"]) == {"tor"}
    judged = cards[cards["verdict"] != claims.NOT_RUN]
    assert list(judged["difference"]) == ["shuffled - uniform (sampled_accuracy_synthetic)"]
    assert judged["verdict"].iloc[0] == "reproduced"
    assert (cards["verdict"] == claims.NOT_RUN).sum() == 3


def test_batches_of_seeds_of_one_group_join_and_a_repeated_seed_is_refused(claims):
    first = _per_seed({"grpo_sum": [0.5, 0.6], "shuffled": [0.4, 0.48]})
    second = _per_seed({"grpo_sum": [0.7], "shuffled": [0.61]})
    second["seed"] = second["seed"].map(lambda s: s if pd.isna(s) else s + 2)
    joined = claims.joined_per_seed([("tapo", first), ("tapo", second)])
    row = claims.claim_row(claims.CLAIMS[0], joined["tapo"])
    assert row["n_seeds"] == 3 and row["mean"] == pytest.approx((-0.1 - 0.12 - 0.09) / 3)
    with pytest.raises(SystemExit, match="in several tables"):
        claims.joined_per_seed([("tapo", first), ("tapo", first)])


def _gym_per_seed(gains: dict[str, list[float]]) -> pd.DataFrame:
    """A gym per-seed table at the default point (knob conflict, dose 0.25) with the given
    final rewards per strategy and seed."""
    defaults = {"decisive_fraction": 0.2, "conflict": 0.25, "perception": 0.5,
                "fork_entropy": 0.5, "noise": 0.0}  # fmt: skip
    rows = [
        {
            "knob": "conflict",
            "dose": 0.25,
            "strategy": s,
            "seed": k,
            **defaults,
            "final_reward": v,
            "gain": v - 0.2,
        }  # fmt: skip
        for s, values in gains.items()
        for k, v in enumerate(values)
    ]
    return pd.DataFrame(rows)


def test_the_gym_cards_read_the_gym_table(claims):
    per_seed = _gym_per_seed(
        {
            "grpo": [0.40, 0.42, 0.44],
            "shuffled_advantages": [0.20, 0.21, 0.19],
            "oracle": [0.60, 0.61, 0.66],
            "tapo": [0.40, 0.42, 0.44],  # identical to grpo at every seed
        }
    )
    cards = claims.gym_cards(per_seed).set_index("claim")
    assert (
        cards.loc["shuffled advantages < uniform GRPO (positive control)", "verdict"]
        == "reproduced"
    )
    assert cards.loc["oracle weights > uniform GRPO (positive control)", "verdict"] == "reproduced"
    tapo = cards.loc["TAPO > summed GRPO once the conflict share is at least x"]
    assert tapo["verdict"] == "identical: no signal at this budget"
    assert math.isnan(tapo["threshold"])
    # ToR and the entropy selections were not in this sweep
    assert cards.loc[
        "ToR > uniform once perception dependence is at least y", "verdict"
    ].startswith("not run")
