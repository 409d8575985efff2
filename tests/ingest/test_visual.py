"""MATH-Vision and TabMWP loaders on the real data sets and on small broken files."""

import json
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from creditflow.ingest import DataValidationError, check_frame, load_mathvision, load_tabmwp
from creditflow.ingest.schemas import VISUAL_SCHEMA


def test_mathvision_real_data(raw_data: Path) -> None:
    frame = load_mathvision(raw_data / "mathvision_testmini")
    check_frame(frame, VISUAL_SCHEMA)
    assert len(frame) == 208
    # SOURCE.md: 134 multiple-choice, 74 free-form.
    assert (frame["choices"].map(len) > 0).sum() == 134
    first = frame.iloc[0]
    assert (first["id"], first["answer"], first["choices"]) == ("mathvision-4", "6", [])
    assert first["image_path"] == (raw_data / "mathvision_testmini/images/4.jpg").as_posix()
    assert frame["image_path"].map(lambda p: Path(p).is_file()).all()


def test_tabmwp_real_data_is_image_only_and_numeric(raw_data: Path) -> None:
    frame = load_tabmwp(raw_data / "tabmwp_numeric300")
    check_frame(frame, VISUAL_SCHEMA)
    assert len(frame) == 210
    assert (frame["choices"].map(len) == 0).all()  # free-text problems only
    assert not frame["answer"].str.contains(",").any()
    record = frame.set_index("id").loc["tabmwp-25721"]
    assert record["answer"] == "1807.80"  # '1,807.80' in problems_shared.json
    assert record["image_path"].endswith("tabmwp_numeric300/tables/25721.png")
    assert not any("|" in question for question in frame["question"])  # no table text


def test_image_paths_stay_relative_to_a_relative_data_dir(
    project_root: Path, raw_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project_root)
    relative = Path("data/01_raw")
    assert relative.resolve() == raw_data  # the project's raw data dir
    frame = load_tabmwp(relative / "tabmwp_numeric300", max_rows=2)
    assert frame["image_path"].tolist() == [
        "data/01_raw/tabmwp_numeric300/tables/385.png",
        "data/01_raw/tabmwp_numeric300/tables/462.png",
    ]


# --- broken files ---------------------------------------------------------------------


def _write_image(path: Path) -> None:
    Image.new("RGB", (4, 4), "white").save(path)


def _mathvision_folder(tmp_path: Path, records: list[dict]) -> Path:
    folder = tmp_path / "mathvision"
    (folder / "images").mkdir(parents=True)
    for record in records:
        _write_image(folder / "images" / f"{record.get('id', 'x')}.jpg")
    lines = "".join(json.dumps(record) + "\n" for record in records)
    (folder / "testmini_shared.jsonl").write_text(lines, encoding="utf-8")
    return folder


def _mv(id_: str, **change) -> dict:
    return {
        "id": id_,
        "question": "How many?\n<image1>",
        "options": [],
        "answer": "6",
        "image": f"images/{id_}.jpg",
    } | change


def test_mathvision_toy_folder_loads(tmp_path: Path) -> None:
    folder = _mathvision_folder(tmp_path, [_mv("1"), _mv("2", options=["A", "B"], answer="B")])
    frame = load_mathvision(folder)
    assert frame.drop(columns="image_path").values.tolist() == [
        ["mathvision-1", "How many?\n<image1>", "6", []],
        ["mathvision-2", "How many?\n<image1>", "B", ["A", "B"]],
    ]
    assert frame["image_path"].tolist() == [f"{folder.as_posix()}/images/{i}.jpg" for i in "12"]


@pytest.mark.parametrize(
    ("records", "line", "message"),
    [
        ([_mv("1"), _mv("2"), _mv("1")], 3, r"duplicate id 'mathvision-1' \(first on line 1\)"),
        ([_mv("1"), {"id": "2", "options": [], "answer": "6", "image": "images/2.jpg"}], 2,
         r"missing field\(s\) \['question'\]"),
        ([_mv("1"), _mv("2", answer="")], 2, "field 'answer' is empty"),
        ([_mv("1"), _mv("2", options="ABCDE")], 2, "field 'options' is not null or a list"),
        ([_mv("1", image="images/9.jpg")], 1, r"image .*images/9\.jpg not found"),
    ],
)  # fmt: skip
def test_mathvision_errors_name_file_and_line(
    tmp_path: Path, records: list[dict], line: int, message: str
) -> None:
    folder = _mathvision_folder(tmp_path, records)
    with pytest.raises(DataValidationError, match=message) as err:
        load_mathvision(folder)
    assert (err.value.path, err.value.line) == (folder / "testmini_shared.jsonl", line)
    assert f"testmini_shared.jsonl, line {line}: " in str(err.value)


def _tabmwp_folder(tmp_path: Path, records: dict[str, dict], images: list[str]) -> Path:
    folder = tmp_path / "tabmwp"
    (folder / "tables").mkdir(parents=True)
    for pid in images:
        _write_image(folder / "tables" / f"{pid}.png")
    (folder / "problems_shared.json").write_text(json.dumps(records, indent=1), encoding="utf-8")
    return folder


def _tab(answer: str = "4,656") -> dict:
    return {"question": "How many?", "choices": None, "answer": answer, "table": "a | 1"}


def test_tabmwp_toy_folder_loads(tmp_path: Path) -> None:
    folder = _tabmwp_folder(tmp_path, {"12": _tab(), "7": _tab("3/10")}, ["12", "7"])
    frame = load_tabmwp(folder)
    assert frame.values.tolist() == [
        ["tabmwp-12", f"{folder.as_posix()}/tables/12.png", "How many?", "4656", []],
        ["tabmwp-7", f"{folder.as_posix()}/tables/7.png", "How many?", "3/10", []],
    ]


@pytest.mark.parametrize(
    ("answer", "images", "message"),
    [
        ("ten", ["12", "7"], "'ten' is not a number"),
        ("10", ["12"], r"image .*tables/7\.png not found"),
        (None, ["12", "7"], "field 'answer' is NoneType, not a string"),
    ],
)
def test_tabmwp_errors_name_file_and_line(
    tmp_path: Path, answer: str, images: list[str], message: str
) -> None:
    # indent=1: '{' line 1, "12" line 2, its 4 fields on lines 3-6, '},' line 7, "7" line 8.
    folder = _tabmwp_folder(tmp_path, {"12": _tab(), "7": _tab(answer)}, images)
    with pytest.raises(DataValidationError, match=message) as err:
        load_tabmwp(folder)
    assert (err.value.path, err.value.line) == (folder / "problems_shared.json", 8)
    assert "problems_shared.json, line 8: " in str(err.value)


def test_tabmwp_missing_question_column(tmp_path: Path) -> None:
    record = {"choices": None, "answer": "3"}
    folder = _tabmwp_folder(tmp_path, {"12": record}, ["12"])
    with pytest.raises(DataValidationError, match=r"line 2: missing field\(s\) \['question'\]"):
        load_tabmwp(folder)


def test_tabmwp_duplicate_pid(tmp_path: Path) -> None:
    folder = _tabmwp_folder(tmp_path, {}, ["12"])
    text = '{\n "12": {"question": "Q", "choices": null, "answer": "1"},\n "12": {}\n}\n'
    (folder / "problems_shared.json").write_text(text, encoding="utf-8")
    with pytest.raises(DataValidationError, match=r"line 3: duplicate id '12' \(first on line 2\)"):
        load_tabmwp(folder)


def test_max_rows_keeps_the_first_problems(raw_data: Path) -> None:
    full = load_tabmwp(raw_data / "tabmwp_numeric300")
    pd.testing.assert_frame_equal(load_tabmwp(raw_data / "tabmwp_numeric300", max_rows=4), full[:4])


@pytest.mark.parametrize("content", [b"", b"\x89PNG", b"not an image at all"])
def test_a_file_that_is_not_an_image_fails_at_ingest_naming_its_record(
    tmp_path: Path, content: bytes
) -> None:
    folder = _tabmwp_folder(tmp_path, {"12": _tab(), "7": _tab()}, ["12", "7"])
    (folder / "tables" / "7.png").write_bytes(content)
    with pytest.raises(
        DataValidationError, match=r"image .*tables/7\.png is not a readable"
    ) as err:
        load_tabmwp(folder)
    assert (err.value.path, err.value.line) == (folder / "problems_shared.json", 8)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("truncated_jpeg", r"\(OSError: image file is truncated"),
        ("bomb", r"\(DecompressionBombError: Image size \(225000000 pixels\)"),
        ("bomb_warning", r"\(DecompressionBombWarning: Image size \(100000000 pixels\)"),
    ],
)
def test_an_image_that_does_not_decode_or_is_a_bomb_fails_at_ingest_naming_its_record(
    tmp_path: Path, hostile_image, kind: str, message: str
) -> None:
    # Before: verify() passed a truncated JPEG (it reads no JPEG data) and the 10000 x 10000
    # PNG; the 15000 x 15000 one raised Pillow's own error, naming neither file nor record.
    folder = _mathvision_folder(tmp_path, [_mv("1"), _mv("2")])
    (folder / "images" / "2.jpg").write_bytes(hostile_image(kind).read_bytes())
    with pytest.raises(
        DataValidationError, match=r"image .*images/2\.jpg is not a readable image " + message
    ) as err:
        load_mathvision(folder)
    assert (err.value.path, err.value.line) == (folder / "testmini_shared.jsonl", 2)
