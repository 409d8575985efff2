"""MGSM and GSM8K loaders on the real data sets and on small broken files."""

import json
from pathlib import Path

import pandas as pd
import pytest

from creditflow.ingest import DataValidationError, check_frame, load_gsm8k, load_mgsm
from creditflow.ingest.schemas import MATH_TEXT_SCHEMA

LANGUAGES = ("en", "de", "es", "fr", "ja", "ru", "th", "zh")


@pytest.fixture(scope="module")
def mgsm(raw_data: Path) -> pd.DataFrame:
    return load_mgsm(raw_data / "mgsm", LANGUAGES)


@pytest.fixture(scope="module")
def gsm8k_test(raw_data: Path) -> pd.DataFrame:
    return load_gsm8k(raw_data / "gsm8k", "test")


def test_mgsm_has_250_aligned_problems_per_language(mgsm: pd.DataFrame) -> None:
    check_frame(mgsm, MATH_TEXT_SCHEMA)
    assert len(mgsm) == 2000  # 250 x 8
    assert mgsm["language"].value_counts().to_dict() == dict.fromkeys(LANGUAGES, 250)
    assert mgsm["language"].unique().tolist() == list(LANGUAGES)  # in the configured order
    assert set(mgsm["id"]) == {f"mgsm-{i:04d}" for i in range(250)}
    english = mgsm[mgsm["language"] == "en"].set_index("id")
    assert (english["question"] == english["question_en"]).all()
    german = mgsm[mgsm["language"] == "de"].set_index("id")
    assert german.loc["mgsm-0001", "question"].startswith("Ein Kleid erfordert 2 Knäuel")
    assert german.loc["mgsm-0001", "question_en"].startswith("A robe takes 2 bolts")
    assert (german["question_en"] == english["question_en"]).all()


def test_mgsm_strips_thousands_commas(mgsm: pd.DataFrame) -> None:
    # mgsm_en.tsv lines 147, 202, 231, 250 read 2,125 / 114,200 / 276,000 / 5,600.
    rows = mgsm[mgsm["id"].isin(["mgsm-0146", "mgsm-0201", "mgsm-0230", "mgsm-0249"])]
    assert set(rows.groupby("id")["answer"].unique().map(tuple)) == {
        ("2125",),
        ("114200",),
        ("276000",),
        ("5600",),
    }
    assert not mgsm["answer"].str.contains(",").any()


def test_gsm8k_counts_ids_and_answers(raw_data: Path, gsm8k_test: pd.DataFrame) -> None:
    train = load_gsm8k(raw_data / "gsm8k", "train")
    for frame, split, rows in ((train, "train", 7473), (gsm8k_test, "test", 923)):
        check_frame(frame, MATH_TEXT_SCHEMA)
        assert len(frame) == rows
        assert (frame["language"] == "en").all()
        assert (frame["question"] == frame["question_en"]).all()
        assert frame["id"].str.fullmatch(rf"gsm8k-{split}-\d{{4}}").all()
        assert pd.to_numeric(frame["answer"]).notna().all()  # commas gone, all plain numbers
    assert train["id"].iloc[-1] == "gsm8k-train-7472"
    assert gsm8k_test.loc[0, "answer"] == "18"  # Janet's ducks: 16 - 3 - 4 = 9 eggs x $2
    # The holdout was drawn from lines 250-1318 only, so lines 0-249 are all here.
    line_numbers = gsm8k_test["id"].str.removeprefix("gsm8k-test-").astype(int)
    assert set(range(250)) <= set(line_numbers) <= set(range(1319))


def test_mgsm_english_is_gsm8k_test_lines_0_to_249(
    mgsm: pd.DataFrame, gsm8k_test: pd.DataFrame
) -> None:
    english = mgsm[mgsm["language"] == "en"].set_index("id")[["question", "answer"]]
    gsm8k = gsm8k_test.assign(id=gsm8k_test["id"].str.replace("gsm8k-test-", "mgsm-"))
    gsm8k = gsm8k.set_index("id").loc[english.index, ["question", "answer"]]
    pd.testing.assert_frame_equal(english, gsm8k)


def test_max_rows_caps_each_source(raw_data: Path) -> None:
    capped = load_mgsm(raw_data / "mgsm", ["de", "zh"], max_rows=3)
    assert capped[["id", "language"]].values.tolist() == [
        [f"mgsm-000{i}", language] for language in ("de", "zh") for i in range(3)
    ]
    test = load_gsm8k(raw_data / "gsm8k", "test", max_rows=5)
    assert test["id"].tolist() == [f"gsm8k-test-000{i}" for i in range(5)]


# --- broken files ---------------------------------------------------------------------


def _write_mgsm(folder: Path, language: str, rows: list[str]) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"mgsm_{language}.tsv"
    path.write_text("".join(row + "\n" for row in rows), encoding="utf-8")
    return path


def _mgsm_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mgsm"
    _write_mgsm(folder, "en", ["Two plus two?\t4", "Big sum?\t1,000", "Three?\t3"])
    return folder


def test_mgsm_toy_folder_loads(tmp_path: Path) -> None:
    folder = _mgsm_folder(tmp_path)
    _write_mgsm(folder, "de", ["Zwei plus zwei?\t4", "Große Summe?\t1,000", "Drei?\t3"])
    frame = load_mgsm(folder, ["de"])
    assert frame.values.tolist() == [
        ["mgsm-0000", "de", "Zwei plus zwei?", "Two plus two?", "4"],
        ["mgsm-0001", "de", "Große Summe?", "Big sum?", "1000"],
        ["mgsm-0002", "de", "Drei?", "Three?", "3"],
    ]


@pytest.mark.parametrize(
    ("german", "line", "message"),
    [
        (["Zwei?\t4", "Große Summe? 1,000", "Drei?\t3"], 2, "1 tab-separated columns, expected 2"),
        (["Zwei?\t4", "Summe?\t1,000", "Drei?\tdrei"], 3, "'drei' is not a number"),
        (["Zwei?\t4", "Summe?\t1.000", "Drei?\t3"], 2, "differs from 1000 on the same line"),
        (["Zwei?\t4", " \t1,000", "Drei?\t3"], 2, "field 'question' is empty"),
    ],
)
def test_mgsm_errors_name_file_and_line(
    tmp_path: Path, german: list[str], line: int, message: str
) -> None:
    folder = _mgsm_folder(tmp_path)
    path = _write_mgsm(folder, "de", german)
    with pytest.raises(DataValidationError, match=message) as err:
        load_mgsm(folder, ["de"])
    assert (err.value.path, err.value.line) == (path, line)
    assert f"mgsm_de.tsv, line {line}: " in str(err.value)


def test_mgsm_rejects_unaligned_or_missing_languages(tmp_path: Path) -> None:
    folder = _mgsm_folder(tmp_path)
    _write_mgsm(folder, "fr", ["Deux?\t4", "Trois?\t3"])
    with pytest.raises(DataValidationError, match="2 problems, but mgsm_en.tsv has 3"):
        load_mgsm(folder, ["fr"])
    with pytest.raises(DataValidationError, match=r"language 'sw'.*among \['en', 'fr'\]"):
        load_mgsm(folder, ["en", "sw"])


def _write_gsm8k(folder: Path, records: list[dict], index: list[str] | None = None) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "test_shared.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    if index is not None:
        (folder / "test_shared_line_index.txt").write_text("".join(i + "\n" for i in index))
    return path


GOOD = {"question": "Q?", "answer": "1 + 1 = <<1+1=2>>2\n#### 2"}


def test_gsm8k_toy_test_split_takes_ids_from_the_line_index(tmp_path: Path) -> None:
    folder = tmp_path / "gsm8k"
    big = {"question": "Big?", "answer": "a lot\n#### 1,234,567"}
    _write_gsm8k(folder, [GOOD, big], index=["7", "1318"])
    frame = load_gsm8k(folder, "test")
    assert frame[["id", "answer"]].values.tolist() == [
        ["gsm8k-test-0007", "2"],
        ["gsm8k-test-1318", "1234567"],
    ]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"question": "Q?"}, r"missing field\(s\) \['answer'\]"),
        ({"question": "Q?", "answer": "the answer is 2"}, "no '#### ' marker"),
        ({"question": "Q?", "answer": "so\n#### two"}, "'two' is not a number"),
        ({"question": "", "answer": "#### 2"}, "field 'question' is empty"),
    ],
)
def test_gsm8k_errors_name_file_and_line(tmp_path: Path, bad: dict, message: str) -> None:
    folder = tmp_path / "gsm8k"
    path = _write_gsm8k(folder, [GOOD, GOOD, bad], index=["0", "1", "2"])
    with pytest.raises(DataValidationError, match=message) as err:
        load_gsm8k(folder, "test")
    assert (err.value.path, err.value.line) == (path, 3)
    assert "test_shared.jsonl, line 3: " in str(err.value)


def test_gsm8k_line_index_must_fit(tmp_path: Path) -> None:
    folder = tmp_path / "gsm8k"
    _write_gsm8k(folder, [GOOD, GOOD, GOOD], index=["0", "5", "0"])
    with pytest.raises(
        DataValidationError, match=r"line 3: duplicate id '0000' \(first on line 1\)"
    ):
        load_gsm8k(folder, "test")
    _write_gsm8k(folder, [GOOD, GOOD, GOOD], index=["0", "5"])
    with pytest.raises(DataValidationError, match="2 line numbers for 3 test problems"):
        load_gsm8k(folder, "test")
    _write_gsm8k(folder, [GOOD, GOOD, GOOD], index=["0", "x", "2"])
    with pytest.raises(DataValidationError, match=r"index\.txt, line 2: \['x'\] is not a line"):
        load_gsm8k(folder, "test")


def test_gsm8k_unknown_split_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"unknown GSM8K split 'dev'; valid ones: \['test', 'train'\]"
    ):
        load_gsm8k(tmp_path, "dev")
