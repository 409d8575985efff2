"""Reasoning reward R_reason (docs/methods/tapo.md) on real GSM8K / MGSM answers, garbage, and its timeout."""

import csv
import json
import time
from concurrent.futures import ThreadPoolExecutor

import math_verify
import pytest
from hypothesis import given
from hypothesis import strategies as st

from creditflow.rewards import extract_boxed_answer, normalize_thousands, reasoning_reward


def _gsm8k_answers(raw_data, n_plain=100):
    """Every GSM8K test answer that is not a plain integer, plus ``n_plain`` that are."""
    with open(raw_data / "gsm8k" / "test_shared.jsonl", encoding="utf-8") as f:
        answers = [json.loads(line)["answer"].split("#### ")[-1].strip() for line in f]
    special = [a for a in answers if not a.isdigit()]
    # Lines 250+ (0-249 are MGSM's English problems, tested below).
    return special + [a for a in answers[250:] if a.isdigit()][:n_plain]


def _mgsm_answers(raw_data):
    with open(raw_data / "mgsm" / "mgsm_en.tsv", encoding="utf-8", newline="") as f:
        return [row[1] for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def _as_completion(boxed):
    return f"<translation>Q?</translation> Adding it all up gives \\boxed{{{boxed}}}."


def test_real_gold_answers_score_one_and_off_by_one_scores_zero(raw_data):
    gsm8k, mgsm = _gsm8k_answers(raw_data), _mgsm_answers(raw_data)
    assert len(mgsm) == 250
    golds = gsm8k + mgsm
    assert {"2,125", "1,450,000", "-10"} <= set(golds)  # the comma and sign cases are in
    values = [int(g.replace(",", "")) for g in golds]
    completions, answers, expected = [], [], []
    for gold, value in zip(golds, values, strict=True):
        for boxed, reward in [(f"{value:,}", 1.0), (str(value), 1.0), (str(value + 1), 0.0)]:
            completions.append(_as_completion(boxed))
            answers.append(gold)
            expected.append(reward)
    rewards = reasoning_reward(completions, answers)
    wrong = [
        (c, a) for c, a, r, e in zip(completions, answers, rewards, expected, strict=True) if r != e
    ]
    assert not wrong, wrong[:5]


def test_gold_answers_may_be_numbers():
    assert reasoning_reward(["\\boxed{2,125}", "\\boxed{0.5}", "\\boxed{7}"], [2125, 0.5, 8]) == [
        1.0,
        1.0,
        0.0,
    ]


def test_extract_boxed_answer_takes_the_last_box_of_the_reasoning():
    assert extract_boxed_answer("\\boxed{1} then \\boxed{2}") == "2"
    assert extract_boxed_answer("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"  # nested braces
    assert extract_boxed_answer("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"  # escaped braces
    assert extract_boxed_answer("\\boxed {7}") == "7"
    assert extract_boxed_answer("\\boxed{\\boxed{5}}") == "5"
    # A box inside the translation is not the answer once </translation> has been seen.
    assert extract_boxed_answer("<translation>\\boxed{3}</translation> so 4") is None
    assert extract_boxed_answer("<translation>q</translation> \\boxed{4}") == "4"
    # The last box is never closed: a truncated answer is no answer.
    assert extract_boxed_answer("\\boxed{1} and \\boxed{\\frac{") is None
    assert extract_boxed_answer("the answer is 4") is None


def test_normalize_thousands():
    assert normalize_thousands("2,125") == "2125"
    assert normalize_thousands("-1,450,000.5") == "-1450000.5"
    assert normalize_thousands("2{,}125") == "2125"
    # Not thousands groups: a pair, a 4-digit group, a group inside a longer number.
    assert normalize_thousands("1,2") == "1,2"
    assert normalize_thousands("12,3456") == "12,3456"
    assert normalize_thousands("1,234,5") == "1,234,5"


def test_where_the_answer_is_looked_for():
    assert reasoning_reward(
        [
            "\\boxed{5} no wait, \\boxed{6}",  # the last box counts
            "\\boxed{6} no wait, \\boxed{5}",
            "<translation>\\boxed{5}</translation> I give up",  # box only in the translation
            "The answer is 5.",  # no box
            "\\boxed{5",  # unclosed
        ],
        ["5"] * 5,
    ) == [0.0, 1.0, 0.0, 0.0, 0.0]


GARBAGE = [
    "",
    "\\boxed{}",
    "\\boxed{ }",
    "\\boxed{\\frac{",
    "\\boxed{\\frac{}{}}",
    "\\boxed{" + "1" + "0" * 5000 + "}",  # 10**5000
    "\\boxed{10^{5000}}",
    "\\boxed{\udcff}",
    "\udcff\\boxed{\udcff5}",
    "\\boxed{\x00}",
    "\x00" * 100,
    "<translation>" * 50,
    "\\boxed{" * 1000,
    "}" * 1000 + "\\boxed{}}}",
    "\\boxed{\\sqrt{\\sqrt{\\left( \\right.}}}",
    "\\boxed{$$}",
    "\\boxed{\\begin{pmatrix} 1 & 2 \\end{pmatrix}}",
    "x" * 1_000_000 + "\\boxed{abc",
]


def test_garbage_scores_zero():
    assert reasoning_reward(GARBAGE, ["5"] * len(GARBAGE), timeout_s=3.0) == [0.0] * len(GARBAGE)


def test_a_huge_completion_is_handled_quickly():
    start = time.perf_counter()
    assert reasoning_reward(["y" * 5_000_000 + " \\boxed{5}"], ["5"]) == [1.0]
    assert time.perf_counter() - start < 3.0


@given(st.text(), st.text(max_size=30))
def test_arbitrary_text_never_raises(text, boxed):
    rewards = reasoning_reward([text, f"{text}\\boxed{{{boxed}}}"], ["5", "5"], timeout_s=3.0)
    assert all(r in (0.0, 1.0) for r in rewards)


def test_deterministic():
    completions = [_as_completion(x) for x in ["5", "2,125", "\\frac{10}{2}", "6", "x"]]
    first = reasoning_reward(completions, ["5", "2125", "5", "5", "5"])
    assert first == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert reasoning_reward(completions, ["5", "2125", "5", "5", "5"]) == first


def test_rejects_mismatched_lengths_and_bad_timeout():
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        reasoning_reward(["a", "b"], ["1"])
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        reasoning_reward(["a"], ["1"], timeout_s=0)


def test_math_verify_own_timeout_fails_outside_the_main_thread():
    # Why rewards disable math_verify's SIGALRM timeout and use a worker process instead.
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(ValueError, match="threaded environment"):
            pool.submit(math_verify.parse, "\\boxed{1}").result()


# Passes screen_answer (it spells no huge number) but sympy never finishes expanding it.
SLOW = "\\boxed{(x+1)^{100000}}"


def _in_a_thread(fn, *args, **kwargs):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


@pytest.mark.parametrize("in_a_thread", [False, True])
def test_slow_check_times_out_to_zero(in_a_thread):
    reasoning_reward(["\\boxed{1}"], ["1"])  # make sure the worker is up: time the call only
    timeout_s = 0.5
    call = _in_a_thread if in_a_thread else (lambda fn, *a, **kw: fn(*a, **kw))
    start = time.perf_counter()
    # The second completion also checks that the worker is restarted after the kill.
    rewards = call(reasoning_reward, [SLOW, "\\boxed{5}"], ["5", "5"], timeout_s=timeout_s)
    elapsed = time.perf_counter() - start
    assert rewards == [0.0, 1.0]
    # It waited for the deadline, then gave up; kill + restart cost well under 10 s.
    assert timeout_s <= elapsed < timeout_s + 10.0
