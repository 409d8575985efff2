"""The split of a catalog task source by problem id (creditflow.tasks.splits)."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from creditflow.tasks.splits import evaluation_label, split_by_problem_id, split_options


def _problems(n_ids: int, languages=("en", "de", "zh")) -> pd.DataFrame:
    rows = [{"id": f"p{i:03d}", "language": lang} for lang in languages for i in range(n_ids)]
    return pd.DataFrame(rows)


@given(
    n_ids=st.integers(2, 40),
    fraction=st.floats(0.01, 0.99),
    seed=st.integers(0, 10_000),
)
def test_every_problem_is_on_one_side_in_all_its_languages(n_ids, fraction, seed):
    problems = _problems(n_ids)
    train, heldout = split_by_problem_id(problems, fraction, seed)
    assert not set(train["id"]) & set(heldout["id"])
    assert set(train["id"]) | set(heldout["id"]) == set(problems["id"])
    assert len(train) + len(heldout) == len(problems)  # all languages of an id move together
    # round(fraction * n), clamped so both sides keep a problem.
    assert heldout["id"].nunique() == min(max(round(fraction * n_ids), 1), n_ids - 1)


@given(seed=st.integers(0, 10_000), shuffle_seed=st.integers(0, 10_000))
def test_the_split_depends_on_the_ids_and_seed_not_the_row_order(seed, shuffle_seed):
    problems = _problems(20)
    shuffled = problems.sample(frac=1.0, random_state=shuffle_seed)
    a = split_by_problem_id(problems, 0.3, seed)
    b = split_by_problem_id(shuffled, 0.3, seed)
    for side_a, side_b in zip(a, b, strict=True):
        assert set(side_a["id"]) == set(side_b["id"])
    # Each side keeps the source's row order.
    assert b[0].index.tolist() == list(range(len(b[0])))
    assert b[0]["id"].tolist() == [i for i in shuffled["id"] if i in set(b[0]["id"])]


def test_caps_keep_nested_subsets_of_each_side():
    problems = _problems(30)
    full_train, full_eval = split_by_problem_id(problems, 0.5, seed=1)
    train, evaluation = split_by_problem_id(
        problems, 0.5, 1, max_train_problems=4, max_eval_problems=2
    )
    smaller, _ = split_by_problem_id(problems, 0.5, 1, max_train_problems=2)
    assert (train["id"].nunique(), evaluation["id"].nunique()) == (4, 2)
    assert set(smaller["id"]) < set(train["id"]) < set(full_train["id"])
    assert set(evaluation["id"]) < set(full_eval["id"])


def test_another_seed_holds_out_other_problems():
    problems = _problems(50, languages=("en",))
    assert set(split_by_problem_id(problems, 0.2, 0)[1]["id"]) != set(
        split_by_problem_id(problems, 0.2, 1)[1]["id"]
    )


@pytest.mark.parametrize(
    ("n_ids", "fraction", "match"), [(1, 0.5, "at least 2"), (5, 1.0, "in \\(0, 1\\)")]
)
def test_splits_that_cannot_work_are_errors(n_ids, fraction, match):
    with pytest.raises(ValueError, match=match):
        split_by_problem_id(_problems(n_ids), fraction, 0)


def test_split_options_come_from_the_tasks_block():
    tasks = {
        "heldout_fraction": 0.1,
        "split_seed": 3,
        "max_train_problems": None,
        "max_eval_problems": 7,
    }
    assert split_options(tasks) == {
        "heldout_fraction": 0.1,
        "seed": 3,
        "max_train_problems": None,
        "max_eval_problems": 7,
    }


def test_a_benchmarks_own_table_is_labelled_as_that_benchmark():
    benchmarks = {"tabmwp": "tabmwp_problems", "mathvision": "mathvision_problems"}
    assert evaluation_label("tabmwp_problems", benchmarks) == "tabmwp"
    assert evaluation_label("my_pictures", benchmarks) == "my_pictures"
    assert evaluation_label("synthetic", benchmarks) == "synthetic"
