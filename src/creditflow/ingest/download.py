"""Download a raw data set from its public source (``creditflow fetch-data`` without a local
copy; the addresses are in :data:`creditflow.ingest.sources.RAW_SOURCES`).

The project's copy of each set is its public release less a held-out evaluation part, split
by a seeded rule that docs/data.md states; the ``*_shared_*`` functions below replay those rules,
so a download gives the same files (and the same rows) as the copy. Each set is written to a
staging folder and moved into place only when complete: a failed download leaves nothing half
written.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from creditflow.errors import DownloadError
from creditflow.ingest.sources import COPY_HINT, RAW_SOURCES, RawSource

Get = Callable[[str], bytes]  # url -> the bytes found there


def fetch_url(url: str, timeout: float = 60.0) -> bytes:
    """The bytes at ``url``; DownloadError naming it (and how to do without) on failure."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise DownloadError(
            f"could not download {url} ({reason}). Without internet, fetch the data sets from a "
            f"local copy instead: {COPY_HINT}, as docs/data.md describes"
        ) from error


# --- the split rules (docs/data.md) ------------------------------------------------------------


def gsm8k_shared_lines(n_lines: int) -> list[int]:
    """The 0-based lines of GSM8K's test.jsonl (1319 lines) in the project's copy: 396 lines
    drawn from 250-1318 are held out, so lines 0-249 (MGSM's English source) always stay."""
    if n_lines != 1319:
        raise DownloadError(f"GSM8K test.jsonl has {n_lines} lines, expected 1319")
    held_out = set(random.Random(1319).sample(range(250, 1319), 396))
    return [line for line in range(n_lines) if line not in held_out]


def mathvision_shared_lines(subjects: Sequence[str]) -> list[int]:
    """The 0-based lines of MATH-Vision's testmini.jsonl in the project's copy, given each
    line's subject: per subject, in sorted order, one generator seeded 304 holds out 6."""
    rng = random.Random(304)
    held_out: set[int] = set()
    for subject in sorted(set(subjects)):
        lines = [at for at, name in enumerate(subjects) if name == subject]
        held_out.update(rng.sample(lines, 6))
    return [at for at in range(len(subjects)) if at not in held_out]


def tabmwp_shared_pids(problems: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The TabMWP pids of the project's copy, sorted as numbers: of the free-text problems with
    an integer or decimal answer (file order), a generator seeded 300 picks 300; the first 90
    picked are held out."""
    numeric = [
        pid
        for pid, record in problems.items()
        if record["ques_type"] == "free_text"
        and record["ans_type"] in ("integer_number", "decimal_number")
    ]
    picked = random.Random(300).sample(numeric, 300)
    return sorted(picked[90:], key=int)


def movielens_held_out_users(user_ids: Sequence[int]) -> set[int]:
    """The MovieLens users held out of the project's copy: 183 of the (610) users, drawn in
    ascending order by a generator seeded 610."""
    return set(random.Random(610).sample(sorted(set(user_ids)), 183))


# --- one function per set: (source, staging folder, get) ---------------------------------------


def _mgsm(source: RawSource, folder: Path, get: Get) -> None:
    for name in source.files:
        (folder / name).write_bytes(get(f"{source.download}mgsm/{name}"))


def _gsm8k(source: RawSource, folder: Path, get: Get) -> None:
    base = f"{source.download}grade_school_math/data/"
    (folder / "train.jsonl").write_bytes(get(base + "train.jsonl"))
    lines = get(base + "test.jsonl").splitlines(keepends=True)
    kept = gsm8k_shared_lines(len(lines))
    (folder / "test_shared.jsonl").write_bytes(b"".join(lines[at] for at in kept))
    (folder / "test_shared_line_index.txt").write_text("".join(f"{at}\n" for at in kept))


def _mathvision(source: RawSource, folder: Path, get: Get) -> None:
    lines = get(f"{source.download}data/testmini.jsonl").splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    kept = mathvision_shared_lines([record["subject"] for record in records])
    (folder / "testmini_shared.jsonl").write_bytes(b"".join(lines[at] for at in kept))
    (folder / "images").mkdir()
    for at in tqdm(kept, desc="MATH-Vision images"):
        image = records[at]["image"]  # images/<id>.jpg, relative to the repository root
        (folder / image).write_bytes(get(source.download + image))


def _tabmwp(source: RawSource, folder: Path, get: Get) -> None:
    base = f"{source.download}data/tabmwp/"
    problems = json.loads(get(base + "problems_test1k.json"))
    pids = tabmwp_shared_pids(problems)
    kept = {pid: problems[pid] for pid in pids}
    text = json.dumps(kept, indent=1, ensure_ascii=False)
    (folder / "problems_shared.json").write_text(text, encoding="utf-8")
    (folder / "tables").mkdir()
    for pid in tqdm(pids, desc="TabMWP tables"):
        (folder / "tables" / f"{pid}.png").write_bytes(get(f"{base}tables/{pid}.png"))


def _movielens(source: RawSource, folder: Path, get: Get) -> None:
    with zipfile.ZipFile(io.BytesIO(get(source.download))) as archive:
        files = {name: archive.read(f"ml-latest-small/{name}") for name in source.files}
    ratings = files["ratings.csv"].splitlines(keepends=True)
    held_out = movielens_held_out_users([int(line.split(b",", 1)[0]) for line in ratings[1:]])
    for name in ("ratings.csv", "tags.csv"):  # one header line, then userId first on each line
        header, *rows = files[name].splitlines(keepends=True)
        kept = [row for row in rows if int(row.split(b",", 1)[0]) not in held_out]
        files[name] = b"".join([header, *kept])
    for name, data in files.items():
        (folder / name).write_bytes(data)


DOWNLOADERS: Mapping[str, Callable[[RawSource, Path, Get], None]] = {
    "mgsm": _mgsm,
    "gsm8k": _gsm8k,
    "mathvision": _mathvision,
    "tabmwp": _tabmwp,
    "movielens": _movielens,
}


def download_source(key: str, raw_dir: Path, get: Get = fetch_url) -> Path:
    """Download set ``key`` into ``raw_dir/<its folder>`` (replacing what was there) with a
    SOURCE.md saying where it came from; returns that folder. ``get`` fetches one address."""
    source = RAW_SOURCES[key]
    target = raw_dir / source.folder
    staging = raw_dir / f".{source.folder}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        DOWNLOADERS[key](source, staging, get)
        (staging / "SOURCE.md").write_text(_source_note(source), encoding="utf-8")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _source_note(source: RawSource) -> str:
    return (
        f"# {source.title}\n\n"
        f"Downloaded by `creditflow fetch-data` from {source.download} (public copy: "
        f"{source.origin}), less its held-out evaluation part.\n\n"
        f"Licence: {source.licence}. Columns, the split rule and the licence terms: "
        "docs/data.md of the creditflow project.\n"
    )
