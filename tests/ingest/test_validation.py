"""Located errors, canonical numbers and the line-numbered raw readers."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from creditflow.errors import DataValidationError
from creditflow.ingest.validation import (
    canonical_number,
    read_csv,
    read_json_object,
    read_jsonl,
    read_tsv,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2,125", "2125"),  # MGSM line 147
        ("1,807.80", "1807.80"),  # TabMWP 25721: trailing zero kept, compare numerically later
        ("114,200", "114200"),
        ("1,450,000", "1450000"),  # GSM8K test
        ("48/103", "48/103"),  # TabMWP labels fractions decimal_number
        ("-3", "-3"),
        (" 18\n", "18"),
        ("3.30", "3.30"),
    ],
)
def test_canonical_number_strips_thousands_commas(raw: str, expected: str) -> None:
    assert canonical_number(raw) == expected


@pytest.mark.parametrize(
    "raw",
    ["1,5", "12,34", "1,2345", ",125", "", "abc", "1e5", "nan", "$5", "5 apples", "1/", "--1"],
)
def test_canonical_number_rejects_non_numbers_and_decimal_commas(raw: str) -> None:
    with pytest.raises(ValueError):
        canonical_number(raw)


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_canonical_number_undoes_thousands_grouping_of_integers(n: int) -> None:
    assert canonical_number(f"{n:,}") == str(n)


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=99))
def test_canonical_number_undoes_thousands_grouping_of_decimals(whole: int, cents: int) -> None:
    assert canonical_number(f"{whole:,}.{cents:02d}") == f"{whole}.{cents:02d}"


def test_error_names_file_line_problem_and_fix(tmp_path: Path) -> None:
    err = DataValidationError(tmp_path / "a.tsv", 7, "field 'answer' is empty", "fill it in")
    assert isinstance(err, ValueError)
    assert (err.path, err.line) == (tmp_path / "a.tsv", 7)
    assert str(err) == f"{tmp_path / 'a.tsv'}, line 7: field 'answer' is empty. Fix: fill it in."


def test_read_tsv_numbers_lines_and_keeps_quotes(tmp_path: Path) -> None:
    path = tmp_path / "x.tsv"
    path.write_text('He said "hi\tthere\n\nlast\t1\n', encoding="utf-8")
    rows = read_tsv(path)
    # QUOTE_NONE: the lone double quote is text, not the start of a multi-line field.
    assert [(at.line, row) for at, row in rows] == [
        (1, ['He said "hi', "there"]),
        (2, []),
        (3, ["last", "1"]),
    ]


def test_read_jsonl_reports_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n[3]\n', encoding="utf-8")
    with pytest.raises(DataValidationError, match=r"x\.jsonl, line 3: a JSON list") as err:
        read_jsonl(path)
    assert err.value.line == 3


def test_read_json_object_gives_each_key_its_line(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    records = {"385": {"answer": "10", "nested": {"385": 1}}, "462": {"answer": "3.30"}}
    path.write_text(json.dumps(records, indent=1), encoding="utf-8")
    # indent=1 puts '{' on line 1, "385" on line 2, its 5 lines of body on 3-7 (answer,
    # nested opening, inner key, nested closing, record closing), "462" on line 8.
    members = read_json_object(path)
    assert [(at.line, key, value) for at, key, value in members] == [
        (2, "385", records["385"]),
        (8, "462", records["462"]),
    ]


def test_read_json_object_on_one_line_and_empty(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"a": 1, "b": [2]}', encoding="utf-8")
    assert [(at.line, key, value) for at, key, value in read_json_object(path)] == [
        (1, "a", 1),
        (1, "b", [2]),
    ]
    path.write_text(" { } \n", encoding="utf-8")
    assert read_json_object(path) == []


def test_read_json_object_reports_duplicate_keys_that_json_load_would_drop(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{\n "7": {"a": 1},\n "8": {},\n "7": {"a": 2}\n}\n', encoding="utf-8")
    assert json.loads(path.read_text()) == {"7": {"a": 2}, "8": {}}  # silently lost record
    with pytest.raises(DataValidationError, match=r"line 4: duplicate id '7' \(first on line 2\)"):
        read_json_object(path)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('{\n "a": 1\n "b": 2\n}', 3),  # missing comma before "b"
        ('{\n "a": 1,\n "b" 2\n}', 3),  # missing colon
        ('{\n "a": {"x": }\n}', 2),  # bad value
        ('{"a": 1}\n\n[]', 3),  # trailing text
        ("[1, 2]", 1),  # not an object
    ],
)
def test_read_json_object_locates_syntax_errors(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "x.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataValidationError) as err:
        read_json_object(path)
    assert err.value.line == line


def test_read_csv_selects_required_columns_with_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(b'id,title,extra\r\n1,"A, the (1995)",x\r\n2,B,y\r\n')
    lines, columns = read_csv(path, ("title", "id"))
    assert lines == [2, 3]
    assert columns == {"title": ["A, the (1995)", "B"], "id": ["1", "2"]}


def test_read_csv_rejects_missing_column_and_ragged_rows(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("id,name\n1,a\n", encoding="utf-8")
    with pytest.raises(DataValidationError, match=r"line 1: header \['id', 'name'\] lacks"):
        read_csv(path, ("id", "title"))
    path.write_text("id,name\n1,a\n2,b,c\n", encoding="utf-8")
    with pytest.raises(DataValidationError, match="line 3: 3 fields, but the header has 2"):
        read_csv(path, ("id", "name"))


def test_missing_file_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(
        DataValidationError, match="file not found .*raw_data_dir.*creditflow fetch-data"
    ):
        read_jsonl(tmp_path / "absent.jsonl")


@pytest.mark.parametrize("raw", ["1/0", "-3/0", "5/00", "٣", "３", "1٣"])
def test_canonical_number_rejects_zero_denominators_and_non_ascii_digits(raw: str) -> None:
    # '1/0' is sympy's zoo (infinite); math_verify reads no number in '٣' (Arabic-Indic 3).
    with pytest.raises(ValueError):
        canonical_number(raw)


@pytest.mark.parametrize(
    ("reader", "text", "line"),
    [
        (read_tsv, b"q one\t1\nq two\t2\nq thr\xffee\t3\n", 3),
        (lambda path: read_csv(path, ["a"]), b"a,b\n1,2\n\xe9t\xe9,3\n", 3),
        (read_jsonl, b'{"a": 1}\r\n{"a": "caf\xe9"}\r\n', 2),
        (read_json_object, b'{\n "a": 1,\n "b": "\xc3("\n}\n', 3),
    ],
)
def test_invalid_utf8_names_the_file_and_the_line(
    tmp_path: Path, reader, text: bytes, line: int
) -> None:
    # Before: UnicodeDecodeError "'utf-8' codec can't decode byte 0xff in position 21",
    # naming neither the file nor the line.
    path = tmp_path / "latin1.txt"
    path.write_bytes(text)
    with pytest.raises(DataValidationError, match="invalid UTF-8: byte 0x") as err:
        reader(path)
    assert (err.value.path, err.value.line) == (path, line)
    assert "Fix: save the file as UTF-8" in str(err.value)


def test_readers_keep_line_numbers_and_newlines_as_before(tmp_path: Path) -> None:
    path = tmp_path / "crlf.jsonl"
    path.write_bytes('{"a": "é"}\r\n{"a": 2}\r\n'.encode())
    assert [(at.line, record) for at, record in read_jsonl(path)] == [
        (1, {"a": "é"}),
        (2, {"a": 2}),
    ]
    tsv = tmp_path / "cr.tsv"
    tsv.write_bytes(b'a "q"\t1\r\nb\t2\n')
    assert [(at.line, row) for at, row in read_tsv(tsv)] == [(1, ['a "q"', "1"]), (2, ["b", "2"])]
