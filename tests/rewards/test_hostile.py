"""The reasoning reward under hostile output: answers screened before parsing,
one wall-clock budget per batch, and the outcome of every check reported.

No wall times are asserted here: benchmarks/reasoning_hostile.py times the hostile batches.
"""

import csv
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from creditflow.errors import WorkerError
from creditflow.rewards import check_pairs, reasoning_outcomes, reasoning_reward, screen_answer
from creditflow.rewards import reasoning as reasoning_module
from creditflow.rewards.reasoning import (
    FAILED,
    FIRST_PASS_TIMEOUT_S,
    NO_ANSWER,
    OVER_BUDGET,
    REJECTED,
    RIGHT,
    TIMED_OUT,
    WRONG,
)
from creditflow.tasks.tapo import ALL_LANGUAGES, format_tapo_target, generate_tapo_problems

# Each of these took math_verify the whole 5 s timeout (or crashed it) before the screen.
HOSTILE_ANSWERS = [
    "9^{9^{9^{9}}}",  # a tower: 9^(9^387420489)
    "9^9^9^9",
    "10^{10^{10}}",
    "(10^{10})!",  # the factorial of a big number
    "100000000000!",
    "\\Gamma(10^{9})",
    "\\binom{10^{9}}{10^{5}}",
    "\\frac{1}{10^{10^{7}}}",
    "2^{-10^{6}}",
    "{" * 100_000 + "}" * 100_000,  # 100k nested braces
    "9" * 100_000,  # a huge digit string
    "\\frac{1}{" * 2000 + "2" + "}" * 2000,  # deeply nested \frac
    "\\frac{1}{" * 20 + "2" + "}" * 20,  # only 20 deep, but sympy never finished it
    "(" * 9 + "1" + ")" * 9,
]
HOSTILE = [f"<translation>Q</translation> so \\boxed{{{a}}}" for a in HOSTILE_ANSWERS] + [
    "x" * 1_000_000 + "\\boxed{" + "1" * 500_000 + "}",  # a 1.5 MB completion
]


def test_hostile_answers_are_rejected_before_parsing(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a hostile answer reached math_verify")

    monkeypatch.setattr(reasoning_module, "_verify", never)
    outcomes = reasoning_outcomes(HOSTILE, ["5"] * len(HOSTILE))
    assert outcomes == [REJECTED] * len(HOSTILE)
    assert reasoning_reward(HOSTILE, ["5"] * len(HOSTILE)) == [0.0] * len(HOSTILE)


def test_a_hostile_gold_answer_is_rejected_too():
    assert reasoning_outcomes(["\\boxed{5}", "\\boxed{5}"], ["5", "(10^{10})!"]) == [
        RIGHT,
        REJECTED,
    ]


def test_hostile_batch_counts():
    # A degenerate batch: the hostile completions, some fine ones, some without an answer.
    completions = [*HOSTILE, "\\boxed{5}", "\\boxed{6}", "no box", "\\boxed{5"]
    outcomes = reasoning_outcomes(completions, ["5"] * len(completions))
    assert outcomes == [REJECTED] * len(HOSTILE) + [RIGHT, WRONG, NO_ANSWER, NO_ANSWER]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("1" * 1001, "longer than 1000 characters"),
        ("{" * 9 + "1" + "}" * 9, "nested deeper than 8"),
        ("\\left(" * 9 + "1" + "\\right)" * 9, "nested deeper than 8"),
        ("9^{9^{9^{9}}}", "a number of more than 10000 digits"),
        ("2^{2^{2^{2^{2}}}}", "a number of more than 10000 digits"),  # 2^65536: 19729 digits
        ("(10^{10}+1)!", "a number of more than 10000 digits"),
        ("\\sqrt{2}^{10^{10}}", "a number of more than 10000 digits"),
        ("2 \\cdot 10^{10001}", "a number of more than 10000 digits"),
        ("0." + "0" * 980 + "1", None),  # 10^-981: small, and short enough
    ],
)
def test_screen_answer_caps(answer, why):
    assert screen_answer(answer) == why


@pytest.mark.parametrize(
    "answer",
    [
        "2^{10}",
        "10^{100}",
        "2^{1000}",
        "1000!",
        "10!!",
        "\\binom{10}{3}",
        "\\Gamma(5)",
        "e^{x^{2}}",  # symbols are not sized
        "2^{2^{10}}",
        "1^{10^{100}}",
        "1.5 \\times 10^{8}",
        "\\frac{\\sqrt{3}}{2}",
        "\\sqrt[3]{27}",
        "\\left( 3, \\frac{\\pi}{2} \\right)",
        "[0, 1)",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "x^2 + 2x + 1",
        "53/201",
        "-10",
        "5\\%",
        "\\$18.50",
        "\\{1, 2\\}",
    ],
)
def test_screen_answer_lets_ordinary_answers_through(answer):
    assert screen_answer(answer) is None


@given(st.integers(2, 10**6), st.integers(0, 10**4))
def test_powers_are_sized_exactly(base, exponent):
    # The bound is the true size here: b^e has about e log10(b) digits.
    digits = exponent * math.log10(base)
    rejected = screen_answer(f"{base}^{{{exponent}}}") is not None
    if digits <= 9_999:
        assert not rejected
    if digits > 10_001:
        assert rejected


@given(st.text(max_size=300))
def test_screen_answer_never_raises(text):
    assert screen_answer(text) is None or isinstance(screen_answer(text), str)


@given(st.text(alphabet="0123456789.^!{}()[]+-*/ x\\frac\\sqrt\\Gamma\\binom", max_size=200))
def test_screen_answer_never_raises_on_math_like_text(text):
    assert screen_answer(text) is None or isinstance(screen_answer(text), str)


# --- ordinary answers: the caps change no score ------------------------------------------


def _real_gold_answers(raw_data):
    with open(raw_data / "gsm8k" / "test_shared.jsonl", encoding="utf-8") as f:
        gsm8k = [json.loads(line)["answer"].split("#### ")[-1].strip() for line in f]
    mgsm = []
    for path in sorted((raw_data / "mgsm").glob("mgsm_*.tsv")):
        with open(path, encoding="utf-8", newline="") as f:
            mgsm += [row[1] for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    with open(raw_data / "tabmwp_numeric300" / "problems_shared.json", encoding="utf-8") as f:
        tabmwp = [str(p["answer"]) for p in json.load(f).values()]
    with open(raw_data / "mathvision_testmini" / "testmini_shared.jsonl", encoding="utf-8") as f:
        mathvision = [json.loads(line)["answer"] for line in f]
    return gsm8k + mgsm + tabmwp + mathvision


# Answers of the kind a policy writes on MATH-style problems (not in the shared data).
SYMBOLIC = [
    "\\frac{3}{4}",
    "0.75",
    "\\dfrac{\\sqrt{3}}{2}",
    "\\frac{\\sqrt{3}}{2}",
    "2\\sqrt{3}",
    "\\sqrt{12}",
    "\\pi",
    "3\\pi",
    "x^2+1",
    "(x+1)^{2}",
    "x^{2}+2x+1",
    "\\left(3, \\frac{\\pi}{2}\\right)",
    "(1, 2)",
    "[0, 1)",
    "10^{6}",
    "1000000",
    "2^{10}",
    "1024",
    "5!",
    "120",
    "\\binom{5}{2}",
    "10",
    "e^{x^{2}}",
    "-\\frac{1}{2}",
    "1.5 \\times 10^{8}",
    "150000000",
]


def test_the_screen_passes_every_real_gold_answer(raw_data):
    golds = _real_gold_answers(raw_data)
    assert len(golds) > 3000
    rejected = [g for g in golds if screen_answer(reasoning_module.normalize_thousands(g))]
    assert not rejected, rejected[:5]


def test_the_caps_change_no_ordinary_score(raw_data, monkeypatch):
    """Parity with the unscreened, unbudgeted path on real answers (right, with a digit
    appended, negated) and on pairs of symbolic answers checked against each other."""
    golds = _real_gold_answers(raw_data)[::10]  # a few hundred, every source
    completions, answers = [], []
    for gold in golds:
        for boxed in (gold, f"{gold}1", f"-{gold}"):
            completions.append(f"<translation>Q</translation> so \\boxed{{{boxed}}}.")
            answers.append(gold)
    for predicted in SYMBOLIC:
        for gold in SYMBOLIC[::3]:
            completions.append(f"\\boxed{{{predicted}}}")
            answers.append(gold)
    assert len(completions) > 500
    capped = reasoning_outcomes(completions, answers)
    monkeypatch.setattr(reasoning_module, "screen_answer", lambda *args, **kwargs: None)
    uncapped = reasoning_outcomes(completions, answers, budget_s=None)
    assert capped == uncapped
    assert uncapped.count(RIGHT) > len(golds)  # the parity is not about zeros only


def test_tapo_gold_completions_still_score_one():
    tasks = generate_tapo_problems(20, ALL_LANGUAGES, seed=3)
    targets = [
        format_tapo_target(q, a, r)
        for q, a, r in zip(
            tasks["question_en"], tasks["answer"], tasks["reasoning_en"], strict=True
        )
    ]
    assert reasoning_reward(targets, list(tasks["answer"])) == [1.0] * len(targets)


def test_equal_checks_run_once(monkeypatch):
    calls = []

    def verify(predicted, gold, timeout_s):
        calls.append((predicted, gold))
        return predicted == gold

    monkeypatch.setattr(reasoning_module, "_verify", verify)
    completions = ["\\boxed{5}", "\\boxed{ 5 }", "\\boxed{6}", "\\boxed{5}"]
    outcomes = reasoning_outcomes(completions, ["5", "5", "5", "6"])
    assert outcomes == [RIGHT, RIGHT, WRONG, WRONG]
    assert calls == [("5", "5"), ("6", "5"), ("5", "6")]


# --- the batch budget (check_pairs), on a fake clock -------------------------------------


class FakeChecks:
    """``verify`` for check_pairs: each pair takes ``cost[pair]`` seconds of a fake clock
    (0.001 unless given) and is right when predicted == gold; past its limit it raises
    TimeoutError after the limit has passed, as the worker does."""

    def __init__(self, cost=None, fail=()):
        self.now = 0.0
        self.cost = cost or {}
        self.fail = set(fail)
        self.calls = []

    def clock(self):
        return self.now

    def verify(self, predicted, gold, timeout_s):
        self.calls.append((predicted, round(timeout_s, 6)))
        cost = self.cost.get(predicted, 0.001)
        if cost > timeout_s:
            self.now += timeout_s + 0.3  # the kill and the worker's restart
            raise TimeoutError
        self.now += cost
        if predicted in self.fail:
            raise WorkerError("crashed")
        return predicted == gold


def _pairs(*predicted):
    return [(p, "5") for p in predicted]


def test_without_a_budget_every_check_gets_the_timeout():
    fake = FakeChecks(cost={"slow": 99.0, "4s": 4.0})
    outcomes = check_pairs(_pairs("5", "slow", "4s", "6"), fake.verify, 5.0, None, fake.clock)
    assert outcomes == [RIGHT, TIMED_OUT, WRONG, WRONG]
    assert [limit for _, limit in fake.calls] == [5.0] * 4


def test_slow_checks_wait_until_the_quick_ones_are_done():
    # Hopeless answers first, then ordinary ones. The first pass gives each 1 s (+ 0.3 s for
    # the restart after a kill), so the ordinary ones are answered by t = 3.9 s; the retries
    # (in batch order) then get the whole timeout until the budget (20 s) runs out.
    fake = FakeChecks(cost={"slow1": 99.0, "slow2": 99.0, "slow3": 99.0, "2s": 2.0})
    pairs = _pairs("slow1", "slow2", "slow3", "5", "6", "2s")
    outcomes = check_pairs(pairs, fake.verify, 5.0, 20.0, fake.clock)
    assert outcomes == [TIMED_OUT, TIMED_OUT, OVER_BUDGET, RIGHT, WRONG, OVER_BUDGET]
    first = FIRST_PASS_TIMEOUT_S
    assert fake.calls == [
        ("slow1", first),
        ("slow2", first),
        ("slow3", first),
        ("5", first),
        ("6", first),
        ("2s", first),  # overran the first pass too: t = 5.202 s
        ("slow1", 5.0),  # t = 10.502 s
        ("slow2", 5.0),  # t = 15.802 s
        ("slow3", 4.198),  # what is left of the budget; then 2s gets nothing
    ]


def test_a_check_the_budget_cuts_short_is_over_budget_not_timed_out():
    fake = FakeChecks(cost={"2s": 2.0, "slow": 99.0})
    outcomes = check_pairs(_pairs("2s", "slow"), fake.verify, 5.0, 3.0, fake.clock)
    # First pass: 2s overruns 1 s (t = 1.3), slow overruns 1 s (t = 2.6); retry: 2s gets
    # only the 0.4 s left and is cut short; slow never gets its retry.
    assert outcomes == [OVER_BUDGET, OVER_BUDGET]
    assert fake.calls[-1] == ("2s", 0.4)


def test_the_budget_never_starts_a_check_after_it_is_spent():
    fake = FakeChecks(cost={"slow": 99.0})
    pairs = _pairs("slow", "slow2", "5")
    fake.cost["slow2"] = 99.0
    outcomes = check_pairs(pairs, fake.verify, 0.5, 0.7, fake.clock)
    # timeout_s (0.5) <= the first pass's limit: a timeout is final at once. After it the
    # clock reads 0.8 > 0.7: nothing else starts, not even the ordinary answer.
    assert outcomes == [TIMED_OUT, OVER_BUDGET, OVER_BUDGET]
    assert fake.calls == [("slow", 0.5)]


def test_a_slow_but_finite_check_is_answered_when_the_budget_allows():
    fake = FakeChecks(cost={"4s": 4.0}, fail={"crash"})
    outcomes = check_pairs(_pairs("4s", "crash", "5"), fake.verify, 5.0, 30.0, fake.clock)
    assert outcomes == [WRONG, FAILED, RIGHT]  # the uncapped verdicts
    assert fake.calls == [("4s", 1.0), ("crash", 1.0), ("5", 1.0), ("4s", 5.0)]


def test_a_tiny_budget_on_the_real_worker():
    slow = "\\boxed{(x+1)^{100000}}"  # passes the screen; sympy never finishes expanding it
    completions = ["\\boxed{5}", slow, slow.replace("1)", "2)"), "\\boxed{9^{9^{9^{9}}}}"]
    outcomes = reasoning_outcomes(completions, ["5"] * 4, budget_s=0.5)
    # The ordinary answer is checked first (about 1 ms); the first slow one is cut short by
    # the budget, the second is never started; the tower never reaches the worker.
    assert outcomes == [RIGHT, OVER_BUDGET, OVER_BUDGET, REJECTED]


def test_budget_is_validated():
    with pytest.raises(ValueError, match="budget_s must be > 0 seconds or None"):
        reasoning_reward(["\\boxed{5}"], ["5"], budget_s=0)
    with pytest.raises(ValueError, match="max_answer_chars must be an int >= 1"):
        reasoning_reward(["\\boxed{5}"], ["5"], max_answer_chars=0)
