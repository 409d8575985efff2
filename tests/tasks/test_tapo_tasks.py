"""TAPO task generator: determinism, schema, arithmetic, number styles, language split, targets."""

import hashlib
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from creditflow.algorithms.advantages import sign_conflict_rate
from creditflow.rewards.reasoning import reasoning_reward
from creditflow.rewards.translation import translation_reward
from creditflow.tasks import (
    ALL_LANGUAGES,
    DEFAULT_LANGUAGES,
    TAPO_COLUMNS,
    TAPO_INSTRUCTION,
    format_tapo_target,
    generate_tapo_problems,
    split_by_language,
    tapo_prompt,
)

# The English verbs of each step sentence and the sign they carry; written here independently
# of the generator so the test recomputes answers from the English text alone.
EN_STEP_SIGNS = {
    "buys": 1,
    "gets": 1,
    "puts": 1,
    "finds": 1,
    "sells": -1,
    "gives": -1,
    "takes": -1,
    "loses": -1,
}
EN_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).split()
CYRILLIC = re.compile(r"[\u0400-\u04ff]")
CJK = re.compile(r"[\u4e00-\u9fff]")


def solve_from_english(question_en: str) -> tuple[list[int], int]:
    """Totals after each step (start first) and the answer, read from the English text only."""
    sentences = re.split(r"(?<=[.?])\s+", question_en)
    intro, steps, question = sentences[0], sentences[1:-1], sentences[-1]
    assert question.endswith("?") and not re.search(r"\d", question)
    (start,) = map(int, re.findall(r"\d+", intro))
    totals = [start]
    for sentence in steps:
        (verb,) = [w for w in re.findall(r"[a-z]+", sentence) if w in EN_STEP_SIGNS]
        (operand,) = map(int, re.findall(r"\d+", sentence))
        totals.append(totals[-1] + EN_STEP_SIGNS[verb] * operand)
    return totals, totals[-1]


def check_chain(reasoning_en: str, question_en: str) -> int:
    """Each "x op y = z." must be right, chained, and use the question's numbers; returns z."""
    steps = re.findall(r"(\d+) ([+-]) (\d+) = (\d+)\.", reasoning_en)
    assert " ".join(f"{x} {op} {y} = {z}." for x, op, y, z in steps) == reasoning_en
    numbers = list(map(int, re.findall(r"\d+", question_en)))
    assert int(steps[0][0]) == numbers[0]
    for k, (x, op, y, z) in enumerate(steps):
        assert int(z) == (int(x) + int(y) if op == "+" else int(x) - int(y))
        assert int(y) == numbers[k + 1]
        if k:
            assert x == steps[k - 1][3]
    return int(steps[-1][3])


def is_tapo_formatted(completion: str) -> bool:
    """docs/methods/tapo.md format reward, written locally: one non-empty block, first, text after."""
    if completion.count("<translation>") != 1 or completion.count("</translation>") != 1:
        return False
    match = re.fullmatch(r"\s*<translation>(.*?)</translation>(.*)", completion, flags=re.DOTALL)
    return bool(match) and bool(match.group(1).strip()) and bool(match.group(2).strip())


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return generate_tapo_problems(60, ALL_LANGUAGES, seed=0)


def test_language_sets():
    assert len(ALL_LANGUAGES) >= 7 and len(set(ALL_LANGUAGES)) == len(ALL_LANGUAGES)
    assert len(DEFAULT_LANGUAGES) >= 6 and set(DEFAULT_LANGUAGES) <= set(ALL_LANGUAGES)
    assert {"ru", "zh"} <= set(DEFAULT_LANGUAGES)


def test_same_seed_same_frame_and_other_seed_differs():
    first = generate_tapo_problems(20, seed=3)
    pd.testing.assert_frame_equal(first, generate_tapo_problems(20, seed=3))
    other = generate_tapo_problems(20, seed=4)
    assert (first["question"] != other["question"]).mean() > 0.5


def test_frame_is_identical_under_another_hash_seed():
    # Byte-for-byte across processes: a different PYTHONHASHSEED must not change anything.
    script = (
        "import hashlib; from creditflow.tasks import generate_tapo_problems as g; "
        "print(hashlib.sha256(g(15, seed=11).to_csv(index=False).encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    here = hashlib.sha256(
        generate_tapo_problems(15, seed=11).to_csv(index=False).encode()
    ).hexdigest()
    assert result.stdout.strip() == here


def test_pinned_rows_for_seed_zero():
    # Regression pin for cross-machine determinism (random.Random with string seeds is stable).
    # The Russian row also shows numeral government: 2 -> genitive singular "леденца",
    # 13 -> genitive plural "леденцов"; 2 + 13 = 15, 15 - 2 = 13.
    rows = generate_tapo_problems(2, ["en", "ru"], seed=0).set_index("id")
    en = rows.loc["tapo-en-00000"]
    assert en["question"] == (
        "Tom brings 10 glasses to school. He gets seventeen glasses from the teacher. "
        "How many glasses does Tom have now?"
    )
    assert en["question_en"] == en["question"].replace("seventeen", "17")
    assert (en["answer"], en["reasoning_en"]) == ("27", "10 + 17 = 27.")
    ru = rows.loc["tapo-ru-00001"]
    assert ru["question"] == (
        "В коробке 2 леденца. Анна кладёт в коробку тринадцать леденцов. "
        "Она достаёт из коробки два леденца. Сколько леденцов теперь в коробке?"
    )
    assert ru["question_en"] == (
        "There are 2 candies in a box. Anna puts 13 candies into the box. "
        "She takes 2 candies out of the box. How many candies are in the box now?"
    )
    assert (ru["answer"], ru["reasoning_en"], ru["template_id"]) == (
        "13",
        "2 + 13 = 15. 15 - 2 = 13.",
        "box",
    )


def test_languages_are_drawn_independently():
    alone = generate_tapo_problems(10, ["de"], seed=5)
    together = generate_tapo_problems(10, ["zh", "de", "sw"], seed=5)
    pd.testing.assert_frame_equal(
        alone, together[together["language"] == "de"].reset_index(drop=True)
    )


def test_schema_and_dtypes(frame):
    assert tuple(frame.columns) == TAPO_COLUMNS
    assert len(frame) == 60 * len(ALL_LANGUAGES)
    for column in TAPO_COLUMNS[:-1]:
        assert pd.api.types.is_string_dtype(frame[column]), column
        assert frame[column].map(type).eq(str).all(), column
    assert frame["n_operations"].dtype == "int64"
    assert frame["id"].is_unique
    for row in frame.itertuples():
        assert re.fullmatch(rf"tapo-{row.language}-\d{{5}}", row.id)
        assert re.fullmatch(r"0|[1-9]\d*", row.answer)  # canonical non-negative integer
        assert row.n_operations == row.reasoning_en.count("=")
    assert set(frame["n_operations"]) == {1, 2}
    assert (
        frame.groupby("language")["id"]
        .apply(lambda s: s.str[-5:].tolist() == [f"{i:05d}" for i in range(60)])
        .all()
    )


def test_every_language_uses_at_least_four_templates(frame):
    assert list(frame["language"].unique()) == list(ALL_LANGUAGES)
    assert (frame.groupby("language")["template_id"].nunique() >= 4).all()


def test_answers_match_english_question_and_reasoning(frame):
    for row in frame.itertuples():
        totals, answer = solve_from_english(row.question_en)
        assert min(totals) >= 0
        assert int(row.answer) == answer == check_chain(row.reasoning_en, row.question_en)
        assert len(totals) - 1 == row.n_operations


@given(
    seed=st.integers(0, 2**31),
    max_operand=st.integers(4, 40),
    operations=st.sampled_from([("add",), ("sub",), ("add", "sub")]),
    counts=st.sampled_from([(1,), (2,), (1, 2)]),
)
def test_property_answers_non_negative_and_in_range(seed, max_operand, operations, counts):
    frame = generate_tapo_problems(
        3,
        ALL_LANGUAGES,
        seed=seed,
        max_operand=max_operand,
        operations=operations,
        operation_counts=counts,
    )
    for row in frame.itertuples():
        totals, answer = solve_from_english(row.question_en)
        assert min(totals) >= 0 and int(row.answer) == answer
        assert all(2 <= int(n) <= max_operand for n in re.findall(r"\d+", row.question_en))
        signs = re.findall(r" ([+-]) ", row.reasoning_en)
        assert set(signs) <= {"+" if op == "add" else "-" for op in operations}
        assert row.n_operations in counts


def test_digit_style_keeps_the_numbers_of_the_english_reference():
    frame = generate_tapo_problems(30, ALL_LANGUAGES, seed=1, number_style_probs={"digits": 1.0})
    for row in frame.itertuples():
        assert re.findall(r"\d+", row.question) == re.findall(r"\d+", row.question_en)
    assert (
        frame.loc[frame["language"] == "en", "question"]
        == frame.loc[frame["language"] == "en", "question_en"]
    ).all()


def test_word_style_spells_numbers_up_to_twenty():
    frame = generate_tapo_problems(
        30, ALL_LANGUAGES, seed=2, max_operand=30, number_style_probs={"words": 1.0}
    )
    for row in frame.itertuples():
        # Numbers above 20 have no word table and stay digits.
        assert all(int(n) > 20 for n in re.findall(r"\d+", row.question))
    for row in frame[frame["language"] == "en"].itertuples():
        spelled = [
            str(EN_WORDS.index(w)) if w in EN_WORDS else w for w in re.findall(r"\w+", row.question)
        ]
        assert [t for t in spelled if t.isdigit()] == re.findall(r"\d+", row.question_en)
    zh = frame.loc[frame["language"] == "zh", "question"]
    # Counting "two" is 两; 二 only appears inside 十二 (12) and 二十 (20).
    assert not zh.str.contains(r"(?<!十)二(?!十)").any()


def test_russian_nouns_follow_numeral_government():
    frame = generate_tapo_problems(
        80, ["ru"], seed=3, max_operand=40, number_style_probs={"digits": 1.0}
    )
    seen = set()
    for n_text, noun in frame["question"].str.findall(r"(\d+) ([а-я]+)").explode().dropna():
        n = int(n_text)
        if n % 10 == 1 and n % 100 != 11:
            seen.add("one")
            assert not noun.endswith(("а", "ов", "ей")), (n, noun)  # карандаш, билет, ...
        elif 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14:
            seen.add("few")
            assert noun.endswith("а"), (n, noun)  # карандаша, билета, ...
        else:
            seen.add("many")
            assert noun.endswith(("ов", "ей")), (n, noun)  # карандашей, билетов, ...
    assert seen == {"one", "few", "many"}


def test_non_latin_scripts_and_romanised_references(frame):
    assert frame.loc[frame["language"] == "ru", "question"].str.contains(CYRILLIC).all()
    assert frame.loc[frame["language"] == "zh", "question"].str.contains(CJK).all()
    assert not frame["question_en"].str.contains(CYRILLIC).any()
    assert not frame["question_en"].str.contains(CJK).any()


def test_empty_request_keeps_schema():
    empty = generate_tapo_problems(0)
    assert empty.empty and tuple(empty.columns) == TAPO_COLUMNS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"languages": ["de", "xx"]}, "unknown languages"),
        ({"languages": "de"}, "not the string"),
        ({"languages": ["de", "de"]}, "must not repeat"),
        ({"operations": ["add", "mul"]}, "unknown operations"),
        ({"operations": []}, "must not be empty"),
        ({"operation_counts": (0, 1)}, "positive ints"),
        ({"max_operand": 1}, "max_operand"),
        ({"operations": ["sub"], "operation_counts": (3,), "max_operand": 5}, "only 'sub'"),
        ({"number_style_probs": {"digits": 0.5, "roman": 0.5}}, "unknown number styles"),
        ({"number_style_probs": {"digits": 0.5, "words": 0.4}}, "sum to 1"),
        ({"number_style_probs": {"digits": 1.5, "words": -0.5}}, "non-negative"),
        ({"n_problems": -1}, "n_problems"),
    ],
)
def test_generate_validates_arguments(kwargs, message):
    kwargs = {"n_problems": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        generate_tapo_problems(**kwargs)


def test_split_by_language_holds_whole_languages_out(frame):
    train, heldout = split_by_language(frame, ["sw", "it"])
    assert set(heldout["language"]) == {"sw", "it"}
    assert not set(train["language"]) & set(heldout["language"])
    assert len(train) + len(heldout) == len(frame)
    assert sorted([*train["id"], *heldout["id"]]) == sorted(frame["id"])
    assert list(train.index) == list(range(len(train)))


@pytest.mark.parametrize(
    ("holdout", "message"),
    [
        (["xx"], "unknown holdout languages"),
        ("sw", "not the string"),
        ([], "at least one"),
        (list(DEFAULT_LANGUAGES), "no training language"),
    ],
)
def test_split_by_language_validates(holdout, message):
    frame = generate_tapo_problems(2)
    with pytest.raises(ValueError, match=message):
        split_by_language(frame, holdout)


def test_local_format_checker_rejects_bad_completions():
    # Guards the checker used below: each of these breaks one docs/methods/tapo.md rule.
    assert is_tapo_formatted("<translation>Q</translation> 1 + 1 = 2. \\boxed{2}")
    assert not is_tapo_formatted("Sure. <translation>Q</translation> \\boxed{2}")  # not first
    assert not is_tapo_formatted("<translation> </translation> \\boxed{2}")  # empty
    assert not is_tapo_formatted("<translation>Q</translation>")  # nothing after
    assert not is_tapo_formatted("<translation>Q</translation><translation>Q</translation> x")


def test_format_tapo_target_matches_spec_format(frame):
    for row in frame.head(50).itertuples():
        target = format_tapo_target(row.question_en, row.answer, row.reasoning_en)
        assert is_tapo_formatted(target)
        assert target.startswith(f"<translation>{row.question_en}</translation>")
        assert row.reasoning_en in target
        assert target.endswith(f"\\boxed{{{row.answer}}}")
    bare = format_tapo_target("Tom has 2 socks. How many socks does Tom have now?", "2")
    assert is_tapo_formatted(bare) and bare.endswith("\\boxed{2}")


def test_format_tapo_target_validates():
    with pytest.raises(ValueError, match="non-empty"):
        format_tapo_target("  ", "3")
    with pytest.raises(ValueError, match="translation tags"):
        format_tapo_target("<translation>x</translation>", "3")
    with pytest.raises(ValueError, match="answer"):
        format_tapo_target("Tom has 3 socks.", "")


def test_tapo_prompt():
    prompt = tapo_prompt("Lena hat 5 Socken. Wie viele Socken hat Lena jetzt?")
    assert prompt == f"{TAPO_INSTRUCTION}\n\nLena hat 5 Socken. Wie viele Socken hat Lena jetzt?"
    assert "<translation></translation>" in TAPO_INSTRUCTION and "\\boxed{}" in TAPO_INSTRUCTION
    assert len(TAPO_INSTRUCTION.split()) <= 25  # a tiny model sees it on every prompt


# --- variant="conflict" ---------------------------------------------------
# The distractor sentence of the English reference, written here independently of the
# generator: "<Name>'s neighbor buys <d> <noun>." (names may have two words: "Wang Fang").
NEIGHBOR_EN = re.compile(r"(?<= )(?:\w+ )?\w+'s neighbor buys (\d+) [a-z]+\. ")


def sloppy_translation(question_en: str) -> tuple[str, int]:
    """``question_en`` without its one distractor sentence, and the distractor's number."""
    (match,) = NEIGHBOR_EN.finditer(question_en)
    return question_en[: match.start()] + question_en[match.end() :], int(match.group(1))


def completion(translation: str, answer: int) -> str:
    return f"<translation>{translation}</translation>\nThe answer is \\boxed{{{answer}}}"


def test_conflict_variant_hand_checked_rows():
    rows = generate_tapo_problems(2, ["en", "de"], seed=0, variant="conflict").set_index("id")
    en = rows.loc["tapo-en-00000"]
    # The standard row of the pinned test, with the neighbor's sentence drawn after it.
    assert en["question"] == (
        "Tom brings 10 glasses to school. He gets seventeen glasses from the teacher. "
        "Tom's neighbor buys four glasses. How many glasses does Tom have now?"
    )
    assert en["question_en"] == (
        "Tom brings 10 glasses to school. He gets 17 glasses from the teacher. "
        "Tom's neighbor buys 4 glasses. How many glasses does Tom have now?"
    )
    # The answer ignores the neighbor: 10 + 17 = 27; read literally, 10 + 17 + 4 = 31.
    assert (en["answer"], en["reasoning_en"], en["n_operations"]) == ("27", "10 + 17 = 27.", 1)
    assert solve_from_english(en["question_en"])[1] == 31
    # The step after the neighbor's sentence names Jonas again ("Er" could be the neighbor).
    de = rows.loc["tapo-de-00000"]
    assert de["question"] == (
        "Jonas hat 7 Tickets. Der Nachbar von Jonas kauft 17 Tickets. "
        "Jonas bekommt neunzehn Tickets von einem Freund. Wie viele Tickets hat Jonas am Ende?"
    )
    assert (de["answer"], de["reasoning_en"]) == ("26", "7 + 19 = 26.")  # not 7 + 17 + 19


def test_standard_variant_is_the_default_draw():
    pd.testing.assert_frame_equal(
        generate_tapo_problems(5, seed=2), generate_tapo_problems(5, seed=2, variant="standard")
    )
    assert not generate_tapo_problems(20, seed=2)["question_en"].str.contains("neighbor").any()


@pytest.mark.parametrize("seed", [0, 7])
def test_conflict_variant_keeps_the_arithmetic_and_adds_one_unused_number(seed):
    frame = generate_tapo_problems(
        25, ALL_LANGUAGES, seed=seed, variant="conflict", number_style_probs={"digits": 1.0}
    )
    for row in frame.itertuples():
        sloppy, distractor = sloppy_translation(row.question_en)
        totals, answer = solve_from_english(sloppy)
        assert min(totals) >= 0 and int(row.answer) == answer
        assert check_chain(row.reasoning_en, sloppy) == answer
        assert len(totals) - 1 == row.n_operations
        assert 2 <= distractor <= 20
        # Read literally, the neighbor's purchase is one more step: a wrong answer.
        assert solve_from_english(row.question_en)[1] == answer + distractor != answer
        # Every language places it where the English reference does (digits: same numbers).
        assert re.findall(r"\d+", row.question) == re.findall(r"\d+", row.question_en)


def test_conflict_is_real_under_the_rewards():
    # A faithful translation read literally vs a sloppy one that drops the neighbor's sentence:
    # the first wins the translation reward, the second the reasoning reward.
    frame = generate_tapo_problems(4, DEFAULT_LANGUAGES, seed=3, variant="conflict")
    faithful, sloppy, references, answers = [], [], [], []
    for row in frame.itertuples():
        dropped, _ = sloppy_translation(row.question_en)
        faithful.append(completion(row.question_en, solve_from_english(row.question_en)[1]))
        sloppy.append(completion(dropped, solve_from_english(dropped)[1]))
        references.append(row.question_en)
        answers.append(row.answer)
    trans_faithful = translation_reward(faithful, references)
    trans_sloppy = translation_reward(sloppy, references)
    assert trans_faithful == [1.0] * len(frame)
    assert all(0.5 < s < 1.0 for s in trans_sloppy)
    assert reasoning_reward(faithful, answers) == [0.0] * len(frame)
    assert reasoning_reward(sloppy, answers) == [1.0] * len(frame)

    # One group of G = 4, two of each kind (chrF++ c of the sloppy ones, c < 1):
    # A_trans = (-, -, +, +) and A_reason = (+, +, -, -); the sum c + 1 > 1 + 0 ranks the
    # sloppy ones first, so A_sum = (+, +, -, -): every translation segment (4 of the 8
    # segments) has the wrong sign under GRPO-sum, every reasoning segment the right one.
    c = trans_sloppy[0]
    r_trans = torch.tensor([c, c, 1.0, 1.0])
    assert sign_conflict_rate(r_trans, torch.tensor([1.0, 1.0, 0.0, 0.0]), 4) == 0.5
    # The standard variant's case: the faithful translation solves too. A_reason = 0 leaves
    # only translation segments, whose A_sum has A_trans's sign: no conflict.
    assert sign_conflict_rate(r_trans, torch.ones(4), 4) == 0.0


def test_generate_refuses_an_unknown_variant():
    with pytest.raises(
        ValueError, match=r"unknown variant 'hard'; valid: \['standard', 'conflict'\]"
    ):
        generate_tapo_problems(2, variant="hard")
