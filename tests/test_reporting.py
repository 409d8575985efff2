"""Reporting helpers: per-step metrics tables, the TAPO comparison table and the
experience-model evaluation (Kendall's tau, tables, plots)."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from matplotlib.figure import Figure
from scipy.stats import kendalltau

from creditflow.chain.ab_test.reporting import (
    EXPERIENCE_TARGETS,
    evaluate_experience_scores,
    kendall_tau,
    plot_metrics_by_band,
    summarise_rankers_by_band,
)
from creditflow.chain.annotation.schema import DIMENSIONS
from creditflow.chain.expmodel.data import split_items
from creditflow.reporting.stats import PROBLEMS_BASIS, SEEDS_BASIS, t_interval
from creditflow.reporting.tables import (
    metrics_frame,
    plot_reward_curves,
    summarise_over_seeds,
    summarise_per_seed,
    summarise_tapo_by_language,
    summarise_tapo_evaluations,
    tapo_intervals,
    training_reward_ends,
)


def test_metrics_frame_makes_steps_integers():
    frame = metrics_frame([{"step": 1.0, "loss": 0.5}, {"step": 2.0, "loss": 0.25}])
    assert frame["step"].dtype == "int64" and frame["step"].tolist() == [1, 2]
    assert frame["loss"].tolist() == [0.5, 0.25]


def test_kendall_tau_hand_case_with_ties():
    # x = [1, 1, 2], y = [1, 2, 3]: pairs (0,1) tied in x, (0,2) +, (1,2) +; n0 = 3, ties_x = 1,
    # ties_y = 0: tau_b = 2 / sqrt((3 - 1) * 3) = 0.8165.
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))
    assert math.isnan(kendall_tau([1], [2]))
    with pytest.raises(ValueError, match="one length"):
        kendall_tau([1, 2], [1, 2, 3])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_kendall_tau_matches_scipy_on_tied_data(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 6, 80), rng.integers(0, 4, 80) + 0.3 * rng.integers(0, 6, 80)
    assert kendall_tau(x, y) == pytest.approx(kendalltau(x, y).statistic, abs=1e-12)


@given(st.lists(st.integers(-5, 5), min_size=2, max_size=30), st.randoms(use_true_random=False))
def test_kendall_tau_is_symmetric_and_sign_flips(values, rnd):
    other = [rnd.randint(-3, 3) for _ in values]
    tau = kendall_tau(values, other)
    if math.isnan(tau):
        return
    assert -1.0 - 1e-12 <= tau <= 1.0 + 1e-12
    assert kendall_tau(other, values) == pytest.approx(tau)
    assert kendall_tau(values, [-v for v in other]) == pytest.approx(-tau)


@pytest.fixture
def per_session() -> pd.DataFrame:
    # Two rankers over three sessions (two head, one tail).
    return pd.DataFrame(
        {
            "ranker": ["a", "a", "a", "b", "b", "b"],
            "session_id": [0, 1, 2, 0, 1, 2],
            "query_frequency_band": ["head", "tail", "head"] * 2,
            "true_ndcg": [0.2, 0.5, 0.4, 1.0, 0.0, 0.5],
            "click_ndcg": [1.0, 0.0, 0.5, 0.0, 0.0, 0.25],
        }
    )


def test_summarise_rankers_by_band_means_per_band_and_overall(per_session):
    table = summarise_rankers_by_band(per_session)
    assert list(table.columns[:3]) == ["ranker", "band", "sessions"]
    assert table[["ranker", "band"]].values.tolist() == [
        ["a", "head"],
        ["a", "tail"],
        ["a", "all"],
        ["b", "head"],
        ["b", "tail"],
        ["b", "all"],
    ]
    # Ranker a: head true_ndcg (0.2 + 0.4) / 2 = 0.3, tail 0.5, all (0.2 + 0.5 + 0.4) / 3.
    np.testing.assert_allclose(table["true_ndcg"][:3], [0.3, 0.5, 1.1 / 3])
    np.testing.assert_allclose(table["click_ndcg"][3:], [0.125, 0.0, 0.25 / 3])
    assert table["sessions"].tolist() == [2, 1, 3, 2, 1, 3]


def test_plot_metrics_by_band_draws_one_bar_per_ranker_and_band(per_session):
    figure = plot_metrics_by_band(
        summarise_rankers_by_band(per_session), ["true_ndcg", "click_ndcg"]
    )
    assert isinstance(figure, Figure) and len(figure.axes) == 2
    for ax in figure.axes:
        assert len(ax.patches) == 2 * 3  # rankers x (head, tail, all)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["head", "tail", "all"]
        assert ax.get_title().endswith("(±1 s.e.)")
        # One error bar per ranker (matplotlib's ErrorbarContainer among the containers).
        assert sum(type(c).__name__ == "ErrorbarContainer" for c in ax.containers) == 2


def test_summarise_tapo_evaluations_hand_case_with_sampled_rewards():
    # Two seen problems (de) and one unseen (sw) for one policy; MGSM row ignored by the
    # synthetic columns. Sampled columns are per-problem means over samples.
    evaluations = pd.DataFrame(
        {
            "policy": ["sft"] * 4,
            "dataset": ["synthetic", "synthetic", "synthetic", "mgsm"],
            "language": ["de", "de", "sw", "de"],
            "reward/format": [1.0, 0.0, 1.0, 1.0],
            "reward/translation": [0.5, 0.3, 0.2, 0.1],
            "reward/reasoning": [1.0, 0.0, 0.0, 0.0],
            "sampled/reward/translation": [0.4, 0.2, 0.1, np.nan],
            "sampled/reward/reasoning": [0.5, 0.25, 0.0, np.nan],
            "sampled/reward/format": [1.0, 0.75, 0.5, np.nan],
        }
    )
    metrics = pd.DataFrame(columns=["strategy", "step", "reward/total"])
    row = summarise_tapo_evaluations(evaluations, metrics, ["sw"]).iloc[0]
    assert row["sampled_format_rate"] == pytest.approx(0.75)  # synthetic rows, MGSM not sampled
    assert row["accuracy_seen"] == pytest.approx(0.5)
    assert row["chrf_seen"] == pytest.approx(0.4)
    assert row["format_rate"] == pytest.approx(2 / 3)
    # eval_reward = sampled translation + reasoning: seen ((0.4+0.5) + (0.2+0.25)) / 2
    assert row["eval_reward_seen"] == pytest.approx(0.675)
    assert row["sampled_accuracy_seen"] == pytest.approx(0.375)
    assert row["sampled_chrf_seen"] == pytest.approx(0.3)
    assert row["eval_reward_unseen"] == pytest.approx(0.1)
    # Without sampled columns the table has no eval_reward columns (and does not fail).
    greedy_only = evaluations.drop(
        columns=["sampled/reward/translation", "sampled/reward/reasoning", "sampled/reward/format"]
    )
    assert "eval_reward_seen" not in summarise_tapo_evaluations(greedy_only, metrics, ["sw"])


def test_summarise_tapo_evaluations_paired_gain_over_the_warm_start():
    # Problems a, b, c (seen) and u (unseen); the GRPO policy's rows come in another order,
    # so the pairing must go by id. Sampled reward = translation + reasoning.
    sft = {"a": 0.5, "b": 0.2, "c": 0.8, "u": 0.1}
    grpo = {"c": 0.9, "a": 0.8, "b": 0.2, "u": 0.4}
    rows = [("sft", i, r) for i, r in sft.items()] + [("grpo", i, r) for i, r in grpo.items()]
    evaluations = pd.DataFrame(
        {
            "policy": [p for p, _, _ in rows],
            "id": [i for _, i, _ in rows],
            "dataset": "synthetic",
            "language": ["sw" if i == "u" else "de" for _, i, _ in rows],
            "reward/format": 1.0,
            "reward/translation": 0.0,
            "reward/reasoning": 0.0,
            "sampled/reward/translation": [r / 2 for _, _, r in rows],
            "sampled/reward/reasoning": [r / 2 for _, _, r in rows],
        }
    )
    metrics = pd.DataFrame(columns=["strategy", "step", "reward/total"])
    table = summarise_tapo_evaluations(evaluations, metrics, ["sw"]).set_index("policy")
    # Seen differences (a, b, c) = (0.3, 0.0, 0.1): mean 0.4/3; sample std
    # sqrt(((0.3-m)^2 + m^2 + (0.1-m)^2) / 2); se = std / sqrt(3).
    diffs = np.array([0.3, 0.0, 0.1])
    assert table.loc["grpo", "eval_reward_gain_seen"] == pytest.approx(diffs.mean())
    assert table.loc["grpo", "eval_reward_gain_se_seen"] == pytest.approx(
        diffs.std(ddof=1) / np.sqrt(3)
    )
    assert table.loc["grpo", "eval_reward_gain_unseen"] == pytest.approx(0.3)
    assert np.isnan(table.loc["grpo", "eval_reward_gain_se_unseen"])  # one problem
    assert np.isnan(table.loc["sft", "eval_reward_gain_seen"])  # the baseline itself
    # No baseline in the table (or baseline=None): no gain columns, no failure.
    only_grpo = evaluations[evaluations["policy"] == "grpo"]
    assert "eval_reward_gain_seen" not in summarise_tapo_evaluations(only_grpo, metrics, ["sw"])
    assert "eval_reward_gain_seen" not in summarise_tapo_evaluations(
        evaluations, metrics, ["sw"], baseline=None
    )


def test_a_multilingual_source_pairs_by_id_and_language_and_adds_rows_per_language():
    # One problem id "p" in de and zh (a catalog source such as MGSM: ids repeat across
    # languages), held out and evaluated as dataset "mgsm". Sampled reward = r (all reasoning).
    rewards = {("sft", "de"): 0.2, ("sft", "zh"): 0.6, ("grpo", "zh"): 0.7, ("grpo", "de"): 0.5}
    evaluations = pd.DataFrame(
        {
            "policy": [p for p, _ in rewards],
            "id": "p",
            "dataset": "mgsm",
            "language": [lang for _, lang in rewards],
            "reward/format": 1.0,
            "reward/translation": 0.0,
            "reward/reasoning": [1.0, 0.0, 1.0, 1.0],
            "sampled/reward/translation": 0.0,
            "sampled/reward/reasoning": list(rewards.values()),
        }
    )
    metrics = pd.DataFrame({"strategy": ["grpo"], "step": [1], "reward/total": [0.3]})
    table = summarise_tapo_by_language(evaluations, metrics, "mgsm")
    assert table[["policy", "language"]].values.tolist() == [
        ["sft", "all"],
        ["sft", "de"],
        ["sft", "zh"],
        ["grpo", "all"],
        ["grpo", "de"],
        ["grpo", "zh"],
    ]
    by = table.set_index(["policy", "language"])
    # Paired by (id, language): de 0.5 - 0.2, zh 0.7 - 0.6 -> mean 0.2 over both.
    assert by.loc[("grpo", "all"), "eval_reward_gain_seen"] == pytest.approx(0.2)
    assert by.loc[("grpo", "de"), "eval_reward_gain_seen"] == pytest.approx(0.3)
    assert by.loc[("sft", "zh"), "accuracy_seen"] == 0.0
    # The held-out MGSM rows are both the task rows and the MGSM evaluation.
    assert by.loc[("sft", "all"), "mgsm_accuracy"] == by.loc[("sft", "all"), "accuracy_seen"]
    assert by["accuracy_unseen"].isna().all()  # a catalog source's languages are all seen
    assert by.loc[("grpo", "all"), "train_reward_first"] == pytest.approx(0.3)
    assert np.isnan(by.loc[("grpo", "de"), "train_reward_first"])  # training mixes languages
    # One language: the table of summarise_tapo_evaluations, without a language column.
    english = evaluations.assign(language="en", id=[f"q{i}" for i in range(4)])
    assert "language" not in summarise_tapo_by_language(english, metrics, "mgsm")


def test_training_reward_ends_average_the_first_and_last_window_by_step():
    # Steps arrive out of order; rewards 0.0, 0.1, ..., 0.6 at steps 0..6.
    trained = pd.DataFrame(
        {"step": [3, 0, 6, 1, 5, 2, 4], "reward/total": [0.3, 0.0, 0.6, 0.1, 0.5, 0.2, 0.4]}
    )
    ends = training_reward_ends(trained, window=2)
    assert ends["train_reward_first"] == pytest.approx(0.05)  # steps 0, 1
    assert ends["train_reward_last"] == pytest.approx(0.55)  # steps 5, 6
    # A run shorter than the window: both ends are the whole run's mean.
    short = training_reward_ends(trained.head(3), window=5)  # steps 3, 0, 6
    assert short["train_reward_first"] == pytest.approx(0.3)
    assert short["train_reward_last"] == pytest.approx(0.3)


def _seeded_tapo_evaluations(gains: dict[str, list[float]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The warm start (sampled reward 0.2 + 0.1 k on seen problems k = 0, 1, 2 and 0.1 on an
    unseen one) and, per strategy, one evaluation per seed that adds that seed's gain to
    every problem; training metrics of two steps per (strategy, seed)."""
    problems = [("a", "de", 0.2), ("b", "de", 0.3), ("c", "de", 0.4), ("u", "sw", 0.1)]
    rows = [("sft", np.nan, i, lang, r) for i, lang, r in problems]
    metrics = []
    for strategy, per_seed in gains.items():
        for seed, gain in enumerate(per_seed):
            rows += [(strategy, seed, i, lang, r + gain) for i, lang, r in problems]
            metrics += [(strategy, seed, step, gain * step) for step in (1, 2)]
    evaluations = pd.DataFrame(rows, columns=["policy", "seed", "id", "language", "r"])
    evaluations = evaluations.assign(
        dataset="synthetic",
        **{
            "reward/format": 1.0,
            "reward/translation": 0.0,
            "reward/reasoning": 0.0,
            "sampled/reward/translation": 0.0,
            "sampled/reward/reasoning": evaluations["r"],
        },
    ).drop(columns="r")
    return evaluations, pd.DataFrame(metrics, columns=["strategy", "seed", "step", "reward/total"])


def test_per_seed_table_has_a_row_per_strategy_and_seed_and_the_warm_start_once():
    evaluations, metrics = _seeded_tapo_evaluations({"base": [0.0, 0.1], "s": [0.1, 0.3]})
    per_seed = summarise_per_seed(
        evaluations, metrics, lambda e, m: summarise_tapo_evaluations(e, m, ["sw"])
    )
    assert per_seed["policy"].tolist() == ["sft", "base", "base", "s", "s"]
    assert pd.isna(per_seed["seed"].iloc[0]) and per_seed["seed"].iloc[1:].tolist() == [0, 1, 0, 1]
    by = per_seed.set_index(["policy", "seed"])
    assert by.loc[("s", 1), "eval_reward_gain_seen"] == pytest.approx(0.3)
    assert by.loc[("s", 1), "train_reward_last"] == pytest.approx(0.45)  # (0.3 + 0.6) / 2


def test_table_over_seeds_means_the_seeds_and_recomputes_the_standard_errors():
    evaluations, metrics = _seeded_tapo_evaluations({"base": [0.0, 0.1, 0.2], "s": [0.1, 0.3, 0.2]})
    per_seed = summarise_per_seed(
        evaluations, metrics, lambda e, m: summarise_tapo_evaluations(e, m, ["sw"])
    )
    intervals = tapo_intervals(evaluations, ["sw"], "synthetic", "base")
    table = summarise_over_seeds(per_seed, intervals).set_index("policy")
    assert table.loc["s", "n_seeds"] == 3 and table.loc["s", "ci_basis"] == SEEDS_BASIS
    assert pd.isna(table.loc["sft", "n_seeds"]) and pd.isna(table.loc["sft", "ci_basis"])
    assert table.loc["s", "eval_reward_seen"] == pytest.approx(0.3 + 0.2)  # 0.3 + mean gain
    # Gain of s over the warm start: seeds 0.1, 0.3, 0.2 -> t interval over the three.
    mean, se, low, high = t_interval([0.1, 0.3, 0.2])
    columns = ["eval_reward_gain_seen", "eval_reward_gain_se_seen"]
    assert table.loc["s", columns].tolist() == pytest.approx([mean, se])
    assert table.loc["s", "eval_reward_gain_ci_low_seen"] == pytest.approx(low)
    assert table.loc["s", "eval_reward_gain_ci_high_unseen"] == pytest.approx(high)
    # Versus the baseline, seed by seed: 0.1, 0.2, 0.0.
    _, _, low, high = t_interval([0.1, 0.2, 0.0])
    assert table.loc["s", "eval_reward_vs_baseline_ci_low_seen"] == pytest.approx(low)
    assert table.loc["s", "eval_reward_vs_baseline_ci_high_seen"] == pytest.approx(high)
    assert np.isnan(table.loc["base", "eval_reward_vs_baseline_seen"])


def test_one_seed_says_its_intervals_are_over_problems():
    evaluations, metrics = _seeded_tapo_evaluations({"s": [0.1]})
    evaluations.loc[
        evaluations["id"].eq("a") & evaluations["policy"].eq("s"), "sampled/reward/reasoning"
    ] += 0.3
    per_seed = summarise_per_seed(
        evaluations, metrics, lambda e, m: summarise_tapo_evaluations(e, m, ["sw"])
    )
    table = summarise_over_seeds(per_seed, tapo_intervals(evaluations, ["sw"], "synthetic", None))
    row = table.set_index("policy").loc["s"]
    assert row["ci_basis"] == PROBLEMS_BASIS and row["n_seeds"] == 1
    # Seen differences (0.4, 0.1, 0.1): the paired interval over the three problems.
    _, se, low, high = t_interval([0.4, 0.1, 0.1])
    assert row[["eval_reward_gain_se_seen", "eval_reward_gain_ci_low_seen"]].tolist() == (
        pytest.approx([se, low])
    )
    assert np.isnan(row["eval_reward_gain_ci_low_unseen"])  # one unseen problem: no interval


def test_reward_curves_draw_the_seed_mean_and_a_band_named_in_the_legend():
    _, metrics = _seeded_tapo_evaluations({"base": [0.0, 0.2], "s": [0.1, 0.3]})
    figure = plot_reward_curves(metrics, ["reward/total"])
    ax = figure.axes[0]
    base = next(line for line in ax.get_lines() if line.get_label() == "base")
    assert base.get_ydata().tolist() == pytest.approx([0.1, 0.2])  # mean of 0, 0.2 at step 1
    assert len(ax.collections) == 2  # one band per strategy
    assert ax.get_legend().get_title().get_text() == "mean of 2 seeds, band ±1 s.e."
    single = plot_reward_curves(metrics[metrics["seed"] == 0], ["reward/total"]).axes[0]
    assert not single.collections and single.get_legend().get_title().get_text() == ""


def _experience_world(seed: int = 0, n: int = 12):
    """A catalogue with hidden truth, ok annotations, scores, a split and pairs, all random."""
    rng = np.random.default_rng(seed)
    ids = list(range(10, 10 + n))
    truth = {f"true_{d}": rng.uniform(size=n) for d in DIMENSIONS}
    catalogue = pd.DataFrame({"item_id": ids, "true_quality": rng.uniform(size=n), **truth})
    annotations = pd.DataFrame(
        {
            "item_id": ids,
            "status": ["ok"] * (n - 1) + ["failed"],
            "overall": rng.uniform(1, 5, n).round(2),
            **{d: rng.integers(1, 6, n) for d in DIMENSIONS},
        }
    )
    scores = pd.DataFrame({"item_id": ids[::-1], "s_exp": rng.normal(size=n)})
    pairs = pd.DataFrame({"pos_item": rng.choice(ids, 40), "neg_item": rng.choice(ids, 40)})
    return catalogue, annotations, scores, split_items(ids, 0.5, seed), pairs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_experience_evaluation_matches_a_loop_on_each_side_of_the_split(seed):
    catalogue, annotations, scores, split, pairs = _experience_world(seed)
    table = evaluate_experience_scores(catalogue, annotations, scores, split, pairs)
    assert table["target"].tolist() == list(EXPERIENCE_TARGETS)
    s_exp = dict(zip(scores["item_id"], scores["s_exp"], strict=True))
    side = dict(zip(split["item_id"], split["split"], strict=True))
    ok = annotations[annotations["status"] == "ok"]
    for row in table.itertuples(index=False):
        column = "true_quality" if row.target == "quality" else f"true_{row.target}"
        annotated = "overall" if row.target == "quality" else row.target
        truth = dict(zip(catalogue["item_id"], catalogue[column], strict=True))
        for name, wanted in [("in_sample", "train"), ("unseen", "unseen")]:
            ids = [i for i in s_exp if side[i] == wanted]
            expected = kendalltau([s_exp[i] for i in ids], [truth[i] for i in ids]).statistic
            assert getattr(row, f"kendall_tau_{name}") == pytest.approx(expected), name
        ids = [i for i in ok["item_id"] if side[i] == "unseen"]
        mine = dict(zip(ok["item_id"], ok[annotated], strict=True))
        expected = kendalltau([mine[i] for i in ids], [truth[i] for i in ids]).statistic
        assert row.kendall_tau_annotation_unseen == pytest.approx(expected)
        assert row.unseen_items == len(split) // 2 and row.annotated_items == len(ok)
    # Pair accuracy on the quality row only: pairs of two unseen items, ties half.
    quality = table.iloc[0]
    inside = [
        (p, n)
        for p, n in zip(pairs["pos_item"], pairs["neg_item"], strict=True)
        if side[p] == side[n] == "unseen"
    ]
    right = [
        1.0 if s_exp[p] > s_exp[n] else 0.5 if s_exp[p] == s_exp[n] else 0.0 for p, n in inside
    ]
    assert quality["pair_accuracy_unseen"] == pytest.approx(sum(right) / len(right))
    assert table["pair_accuracy_unseen"].iloc[1:].isna().all()


def test_experience_evaluation_by_hand():
    # Items 1-4: train 1, 2; unseen 3, 4. s_exp orders 1 < 2 (true 1 < 2: tau +1) and 3 > 4
    # (true 3 < 4: tau -1). Pairs (3 > 4) right, (4 > 3) wrong, (1 > 3) mixed: unseen 1/2.
    catalogue = pd.DataFrame(
        {"item_id": [1, 2, 3, 4], "true_quality": [0.1, 0.2, 0.3, 0.4]}
        | {f"true_{d}": [0.1, 0.2, 0.3, 0.4] for d in DIMENSIONS}
    )
    annotations = pd.DataFrame(
        {"item_id": [1, 2, 3, 4], "status": "ok", "overall": [1.0, 2.0, 3.0, 4.0]}
        | {d: [1, 2, 3, 4] for d in DIMENSIONS}
    )
    scores = pd.DataFrame({"item_id": [1, 2, 3, 4], "s_exp": [0.0, 1.0, 3.0, 2.0]})
    split = pd.DataFrame({"item_id": [1, 2, 3, 4], "split": ["train", "train", "unseen", "unseen"]})
    pairs = pd.DataFrame({"pos_item": [3, 4, 1], "neg_item": [4, 3, 3]})
    row = evaluate_experience_scores(catalogue, annotations, scores, split, pairs).iloc[0]
    assert row["kendall_tau_in_sample"] == pytest.approx(1.0)
    assert row["kendall_tau_unseen"] == pytest.approx(-1.0)
    assert row["kendall_tau_s_exp"] == pytest.approx(4 / 6)  # 5 of 6 pairs concordant
    assert row["kendall_tau_annotation_unseen"] == pytest.approx(1.0)
    assert row["pair_accuracy_unseen"] == pytest.approx(0.5)
    assert math.isnan(row["pair_accuracy_in_sample"])  # no pair of two train items
    unknown = evaluate_experience_scores(catalogue[["item_id"]], annotations, scores, split, pairs)
    assert unknown.filter(like="kendall_tau").isna().all(axis=None)


def test_the_logged_comparison_reads_every_interval_with_its_mde():
    import doctest  # noqa: PLC0415

    from creditflow.reporting import tables  # noqa: PLC0415

    result = doctest.testmod(tables)
    assert result.failed == 0 and result.attempted >= 1
    table = pd.DataFrame(
        {
            "policy": ["sft", "tapo"],
            "ci_basis": [None, "seeds (5)"],
            "eval_reward": [0.2, 0.3],
            "eval_reward_vs_baseline_unseen": [float("nan"), 0.05],
            "eval_reward_vs_baseline_ci_low_unseen": [float("nan"), 0.01],
            "eval_reward_vs_baseline_ci_high_unseen": [float("nan"), 0.09],
            "eval_reward_vs_baseline_mde_unseen": [float("nan"), 0.03],
        }
    )
    text = tables.comparison_text(table, baseline="grpo_sum")
    # A detected difference carries no "not detectable"; every line stays short.
    assert "  eval_reward vs grpo_sum (unseen): +0.050 [+0.010, +0.090]" in text.splitlines()
    assert max(len(line) for line in text.splitlines()) < 100
