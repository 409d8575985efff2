"""The fetch step (``creditflow fetch-data``): from a small local copy made here, its checks and
messages, and the download path up to the network (its addresses, its split rules, its
failure offline)."""

from __future__ import annotations

import io
import json
import urllib.error
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from creditflow.__main__ import COPY_ENV, fetch_data, main
from creditflow.errors import DownloadError, RawDataMissingError
from creditflow.ingest import download
from creditflow.ingest.download import (
    download_source,
    fetch_url,
    gsm8k_shared_lines,
    mathvision_shared_lines,
    movielens_held_out_users,
    tabmwp_shared_pids,
)
from creditflow.ingest.fetch import fetch_raw_data
from creditflow.ingest.sources import MGSM_LANGUAGES, RAW_SOURCES, check_raw_data, missing_sets

GSM8K_RECORD = json.dumps({"question": "Two plus two?", "answer": "2+2=<<2+2=4>>4\n#### 4"}) + "\n"
MATHVISION_RECORD = {
    "id": "4",
    "question": "How many digits?\n<image1>",
    "options": [],
    "answer": "6",
    "subject": "counting",
    "image": "images/4.jpg",
}
TABMWP_RECORD = {"question": "How much more?", "choices": None, "answer": "10", "unit": "$"}
MOVIELENS = {
    "ratings.csv": "userId,movieId,rating,timestamp\r\n1,1,4.0,964982703\r\n2,2,0.5,964981247\r\n",
    "movies.csv": "movieId,title,genres\r\n1,Toy Story (1995),Comedy\r\n2,Jumanji (1995),Fantasy\r\n",
    "tags.csv": "userId,movieId,tag,timestamp\r\n1,1,funny,1445714994\r\n",
    "links.csv": "movieId,imdbId,tmdbId\r\n1,0114709,862\r\n2,0113497,8844\r\n",
    "README.txt": "Summary: the GroupLens usage licence would be here.\r\n",
}


def _image(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), "white").save(path)


def _tiny_copy(root: Path) -> Path:
    """A local copy laid out as the real one, one or two tiny records per set."""
    mgsm = root / "mgsm"
    mgsm.mkdir(parents=True)
    for code in MGSM_LANGUAGES:
        (mgsm / f"mgsm_{code}.tsv").write_text(f"Two plus two ({code})?\t4\nBig sum?\t1,000\n")
    (mgsm / "SOURCE.md").write_text("# MGSM\n")
    gsm8k = root / "gsm8k"
    gsm8k.mkdir()
    (gsm8k / "train.jsonl").write_text(GSM8K_RECORD * 2)
    (gsm8k / "test_shared.jsonl").write_text(GSM8K_RECORD * 2)
    (gsm8k / "test_shared_line_index.txt").write_text("0\n3\n")
    mathvision = root / "mathvision_testmini"
    mathvision.mkdir()
    (mathvision / "testmini_shared.jsonl").write_text(json.dumps(MATHVISION_RECORD) + "\n")
    _image(mathvision / "images" / "4.jpg")
    tabmwp = root / "tabmwp_numeric300"
    tabmwp.mkdir()
    (tabmwp / "problems_shared.json").write_text(json.dumps({"385": TABMWP_RECORD}, indent=1))
    _image(tabmwp / "tables" / "385.png")
    movielens = root / "movielens_ml_latest_small"
    movielens.mkdir()
    for name, text in MOVIELENS.items():
        (movielens / name).write_text(text, newline="")
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


# --- from a local copy -------------------------------------------------------------------------


def test_fetch_from_a_local_copy_copies_every_set_and_checks_it(tmp_path: Path) -> None:
    copy, raw = _tiny_copy(tmp_path / "copy"), tmp_path / "project" / "data" / "01_raw"
    assert sorted(missing_sets(raw)) == sorted(RAW_SOURCES)
    report = fetch_raw_data(raw, copy)
    assert _files(raw) == _files(copy)  # every file, SOURCE.md and README.txt included
    assert missing_sets(raw) == {}
    check_raw_data(raw)
    assert report == [
        f"mgsm: copied 9 files (0 already there) -> {raw / 'mgsm'}: 16 problem rows",
        f"gsm8k: copied 3 files (0 already there) -> {raw / 'gsm8k'}: 2 train and 2 test problems",
        f"mathvision: copied 2 files (0 already there) -> {raw / 'mathvision_testmini'}: "
        "1 problems",
        f"tabmwp: copied 2 files (0 already there) -> {raw / 'tabmwp_numeric300'}: 1 problems",
        f"movielens: copied 5 files (0 already there) -> {raw / 'movielens_ml_latest_small'}: "
        "2 ratings, 2 movies, 1 tags",
    ]
    # A second fetch finds everything in place; a file changed in the copy is copied again.
    (copy / "gsm8k" / "train.jsonl").write_text(GSM8K_RECORD * 3)
    again = fetch_raw_data(raw, copy, ["gsm8k", "mgsm"])
    assert again[0].startswith("gsm8k: copied 1 files (2 already there)")
    assert again[0].endswith("3 train and 2 test problems")
    assert again[1].startswith("mgsm: copied 0 files (9 already there)")


def test_a_copy_that_lacks_files_says_which_and_copies_nothing(tmp_path: Path) -> None:
    copy, raw = _tiny_copy(tmp_path / "copy"), tmp_path / "raw"
    (copy / "gsm8k" / "train.jsonl").unlink()
    (copy / "mgsm" / "mgsm_ja.tsv").unlink()
    (copy / "mathvision_testmini" / "images" / "4.jpg").unlink()
    with pytest.raises(RawDataMissingError) as error:
        fetch_raw_data(raw, copy)
    message = str(error.value)
    assert message.startswith(
        f"the local copy {copy} lacks raw data: mgsm (missing mgsm_ja.tsv); gsm8k (missing "
        "train.jsonl); mathvision (missing images/ (absent or empty)). Name the folder that holds "
        "mgsm/, gsm8k/, mathvision_testmini/, tabmwp_numeric300/, movielens_ml_latest_small/ "
        "with --from, or fetch only the complete sets with --source"
    )
    assert not raw.exists()
    # The complete sets alone can still be fetched.
    assert len(fetch_raw_data(raw, copy, ["tabmwp", "movielens"])) == 2
    assert sorted(missing_sets(raw)) == ["gsm8k", "mathvision", "mgsm"]


def test_a_copy_whose_rows_are_broken_fails_naming_file_and_line(tmp_path: Path) -> None:
    copy, raw = _tiny_copy(tmp_path / "copy"), tmp_path / "raw"
    (copy / "mgsm" / "mgsm_de.tsv").write_text("Zwei plus zwei?\t5\nGrosse Summe?\t1,000\n")
    with pytest.raises(ValueError, match=r"mgsm_de\.tsv, line 1: answer 5 differs from 4"):
        fetch_raw_data(raw, copy, ["mgsm"])


def test_the_command_line_takes_the_copy_from_an_option_or_the_environment(
    tmp_path: Path,
) -> None:
    copy, raw = _tiny_copy(tmp_path / "copy"), tmp_path / "raw"
    runner = CliRunner()
    result = runner.invoke(fetch_data, ["--from", str(copy), "--to", str(raw), "--source", "mgsm"])
    assert result.exit_code == 0, result.output
    # (the loaders' log lines may reach the same output once Kedro's logging is configured)
    assert any(line.startswith("mgsm: copied 9 files") for line in result.output.splitlines())
    result = runner.invoke(fetch_data, ["--to", str(raw)], env={COPY_ENV: str(copy)})
    assert result.exit_code == 0, result.output
    assert missing_sets(raw) == {}
    (copy / "tabmwp_numeric300" / "problems_shared.json").unlink()
    result = runner.invoke(fetch_data, ["--from", str(copy), "--to", str(tmp_path / "other")])
    assert result.exit_code == 1
    assert "Error: the local copy" in result.output
    assert "tabmwp (missing problems_shared.json)" in result.output


def test_the_creditflow_script_dispatches_fetch_data(tmp_path: Path) -> None:
    """`creditflow fetch-data ...` (and `python -m creditflow fetch-data ...`) is the fetch
    step (anything else stays `kedro run`'s options)."""
    copy, raw = _tiny_copy(tmp_path / "copy"), tmp_path / "raw"
    with pytest.raises(SystemExit) as done:
        main(["fetch-data", "--from", str(copy), "--to", str(raw), "--source", "tabmwp"])
    assert done.value.code == 0
    assert missing_sets(raw, ["tabmwp"]) == {}


def test_the_command_line_defaults_to_the_projects_raw_data_dir(
    project_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a project whose parameters name another raw data dir, the sets go there."""
    project = tmp_path / "project"
    (project / "conf" / "base").mkdir(parents=True)
    (project / "conf" / "local").mkdir()
    (project / "pyproject.toml").write_text((project_root / "pyproject.toml").read_text())
    (project / "conf" / "base" / "parameters.yml").write_text(
        "data_ingest:\n  raw_data_dir: elsewhere/raw\n  mgsm_languages: [en]\n"
    )
    monkeypatch.chdir(project / "conf")
    copy = _tiny_copy(tmp_path / "copy")
    result = CliRunner().invoke(fetch_data, ["--from", str(copy), "--source", "mgsm"])
    assert result.exit_code == 0, result.output
    assert (project / "elsewhere" / "raw" / "mgsm" / "mgsm_zh.tsv").is_file()
    monkeypatch.chdir(tmp_path)  # not inside a Kedro project
    result = CliRunner().invoke(fetch_data, ["--from", str(copy)])
    assert result.exit_code == 1
    assert "is not inside a Kedro project" in result.output


# --- the download path, up to the network -------------------------------------------------------


class _Served:
    """A stand-in for the network: the bytes served at each address, and the addresses asked."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.asked = files, []

    def __call__(self, url: str) -> bytes:
        self.asked.append(url)
        if url not in self.files:
            raise DownloadError(f"could not download {url} (not served here)")
        return self.files[url]


def test_the_download_addresses_are_the_pinned_public_files(tmp_path: Path) -> None:
    base = RAW_SOURCES["mgsm"].download
    assert base.startswith("https://raw.githubusercontent.com/google-research/url-nlp/452a21ad")
    served = _Served({f"{base}mgsm/mgsm_{code}.tsv": b"Q?\t1\n" for code in MGSM_LANGUAGES})
    folder = download_source("mgsm", tmp_path, served)
    assert served.asked == [f"{base}mgsm/mgsm_{code}.tsv" for code in MGSM_LANGUAGES]
    assert sorted(_files(folder)) == sorted([*RAW_SOURCES["mgsm"].files, "SOURCE.md"])
    assert "Licence: CC BY 4.0" in (folder / "SOURCE.md").read_text()

    served = _Served({})
    with pytest.raises(DownloadError, match="not served here"):
        download_source("gsm8k", tmp_path, served)
    assert served.asked == [
        "https://raw.githubusercontent.com/openai/grade-school-math/"
        "3101c7d5072418e28b9008a6636bde82a006892c/grade_school_math/data/train.jsonl"
    ]
    assert RAW_SOURCES["movielens"].download == (
        "https://files.grouplens.org/datasets/movielens/ml-latest-small.zip"
    )
    for key in ("mathvision", "tabmwp"):
        served = _Served({})
        with pytest.raises(DownloadError):
            download_source(key, tmp_path, served)
        first = {"mathvision": "data/testmini.jsonl", "tabmwp": "data/tabmwp/problems_test1k.json"}
        assert served.asked == [RAW_SOURCES[key].download + first[key]]


def test_a_failed_download_leaves_nothing_half_written(tmp_path: Path) -> None:
    base = RAW_SOURCES["mgsm"].download
    served = _Served({f"{base}mgsm/mgsm_en.tsv": b"Q?\t1\n"})  # the other seven fail
    (tmp_path / "mgsm").mkdir()
    (tmp_path / "mgsm" / "mgsm_en.tsv").write_text("kept\t1\n")
    with pytest.raises(DownloadError):
        fetch_raw_data(tmp_path, keys=["mgsm"], get=served)
    assert _files(tmp_path) == {"mgsm/mgsm_en.tsv": b"kept\t1\n"}  # no staging folder left


def test_offline_the_download_fails_saying_how_to_fetch_from_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def offline(url: str, timeout: float) -> None:
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    url = RAW_SOURCES["gsm8k"].download + "grade_school_math/data/train.jsonl"
    with pytest.raises(DownloadError) as error:
        fetch_url(url)
    assert str(error.value).startswith(
        f"could not download {url} ([Errno -3] Temporary failure in name resolution). "
        "Without internet, fetch the data sets from a local copy instead: "
        "`creditflow fetch-data --from <folder holding a copy of the sets>`"
    )


def test_sets_already_complete_are_not_downloaded_again(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    fetch_raw_data(raw, _tiny_copy(tmp_path / "copy"))
    served = _Served({})
    assert fetch_raw_data(raw, get=served)[0].startswith("mgsm: already there -> ")
    assert served.asked == []


# --- the split rules the download replays ------------------------------------------------------


def test_the_split_rules_keep_the_documented_counts() -> None:
    kept = gsm8k_shared_lines(1319)
    assert len(kept) == 923 and kept[:250] == list(range(250))  # MGSM's English source stays
    with pytest.raises(DownloadError, match="1320 lines, expected 1319"):
        gsm8k_shared_lines(1320)
    subjects = [f"subject {at % 16}" for at in range(304)]  # 16 subjects x 19 problems
    kept = mathvision_shared_lines(subjects)
    assert len(kept) == 208
    assert {subjects.count(s) - [subjects[at] for at in kept].count(s) for s in subjects} == {6}
    problems = {
        str(pid): {
            "ques_type": "free_text" if pid % 4 else "multi_choice",
            "ans_type": "integer_number" if pid % 3 else "decimal_number",
        }
        for pid in range(1, 1001)
    }
    pids = tabmwp_shared_pids(problems)
    assert len(pids) == 210 and pids == sorted(pids, key=int)
    assert all(problems[pid]["ques_type"] == "free_text" for pid in pids)
    assert len(movielens_held_out_users(list(range(1, 611)) * 2)) == 183


def test_the_gsm8k_rule_rebuilds_the_copy_from_the_full_test_file(
    raw_data: Path, tmp_path: Path
) -> None:
    """The public test.jsonl, stood in for by the copy's lines at their original line numbers
    and filler on the held-out ones, gives back the copy byte for byte."""
    copy = raw_data / "gsm8k"
    index = [int(line) for line in (copy / "test_shared_line_index.txt").read_text().split()]
    shared = (copy / "test_shared.jsonl").read_bytes().splitlines(keepends=True)
    full = [b'{"question": "held out", "answer": "#### 0"}\n'] * 1319
    for at, line in zip(index, shared, strict=True):
        full[at] = line
    base = RAW_SOURCES["gsm8k"].download + "grade_school_math/data/"
    served = _Served(
        {
            base + "train.jsonl": (copy / "train.jsonl").read_bytes(),
            base + "test.jsonl": b"".join(full),
        }
    )
    folder = download_source("gsm8k", tmp_path, served)
    for name in RAW_SOURCES["gsm8k"].files:
        assert (folder / name).read_bytes() == (copy / name).read_bytes(), name


def test_the_movielens_rule_rebuilds_the_copy_from_the_full_archive(
    raw_data: Path, tmp_path: Path
) -> None:
    """The official archive, stood in for by the copy plus ratings and tags of the held-out
    users (all 610 users 1-610 rate in the release), gives back the copy byte for byte."""
    copy = raw_data / "movielens_ml_latest_small"
    held_out = movielens_held_out_users(range(1, 611))
    kept_users = {
        int(line.split(",")[0]) for line in (copy / "ratings.csv").read_text().split()[1:]
    }
    assert kept_users == set(range(1, 611)) - held_out
    extra = {  # a rating and a tag by each held-out user
        "ratings.csv": "".join(f"{user},1,3.0,964982703\r\n" for user in sorted(held_out)),
        "tags.csv": "".join(f"{user},1,held out,964982703\r\n" for user in sorted(held_out)),
    }
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        for name in RAW_SOURCES["movielens"].files:
            data = (copy / name).read_bytes() + extra.get(name, "").encode()
            zipped.writestr(f"ml-latest-small/{name}", data)
    served = _Served({RAW_SOURCES["movielens"].download: archive.getvalue()})
    folder = download_source("movielens", tmp_path, served)
    for name in RAW_SOURCES["movielens"].files:
        assert (folder / name).read_bytes() == (copy / name).read_bytes(), name


# --- the docs and the project's independence of any folder beside it ---------------------------


def test_the_data_page_names_every_sets_folder_licence_and_origin(project_root: Path) -> None:
    page = (project_root / "docs" / "data.md").read_text(encoding="utf-8")
    for source in RAW_SOURCES.values():
        assert f"data/01_raw/{source.folder}/" in page, source.folder
        assert f"**Licence:** {source.licence}" in page, source.licence
        assert f"**Origin:** {source.origin}" in page, source.origin


def test_no_user_facing_file_points_outside_the_checkout(project_root: Path) -> None:
    """The README, docs, code and configuration name no folder beside the checkout: a clone
    elsewhere has none (only the test and CI set-up may copy from one when it is there)."""
    sibling = "/".join(["..", "shared"])
    files = [project_root / "README.md"] + [
        path
        for folder in ("docs", "src", "conf")
        for path in (project_root / folder).rglob("*")
        if path.is_file() and path.suffix in {".md", ".py", ".yml", ".yaml", ".txt", ".toml"}
    ]
    assert len(files) > 50
    assert [str(path) for path in files if sibling in path.read_text(encoding="utf-8")] == []
