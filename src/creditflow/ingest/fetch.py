"""The fetch step (``creditflow fetch-data``): fill the raw data dir with the raw data sets, from
a local copy or from their public sources, then check what landed.

A local copy is a folder holding one sub-folder per set, laid out as the raw data dir is
(``mgsm/``, ``gsm8k/``, ...; :data:`creditflow.ingest.sources.RAW_SOURCES`). It is checked
before anything is copied, and files already there unchanged (same size and modification time)
are not copied again, so a repeated fetch costs little. Without a copy, the sets not complete
yet are downloaded (:mod:`creditflow.ingest.download`). Either way each set is then loaded by
its own loader, which validates every row, so a fetch that succeeds is one data_ingest reads.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from creditflow.errors import RawDataMissingError
from creditflow.ingest.download import Get, download_source, fetch_url
from creditflow.ingest.math_text import load_gsm8k, load_mgsm
from creditflow.ingest.ranking import load_movielens, load_movielens_tags
from creditflow.ingest.sources import MGSM_LANGUAGES, RAW_SOURCES, missing_sets
from creditflow.ingest.visual import load_mathvision, load_tabmwp


def _mgsm_rows(folder: Path) -> str:
    return f"{len(load_mgsm(folder, MGSM_LANGUAGES))} problem rows"


def _gsm8k_rows(folder: Path) -> str:
    train, test = load_gsm8k(folder, "train"), load_gsm8k(folder, "test")
    return f"{len(train)} train and {len(test)} test problems"


def _movielens_rows(folder: Path) -> str:
    ratings, items = load_movielens(folder)
    tags = load_movielens_tags(folder, items)
    return f"{len(ratings)} ratings, {len(items)} movies, {len(tags)} tags"


# Set -> a full load of its folder by data_ingest's loader, summarised.
CHECKS: Mapping[str, Callable[[Path], str]] = {
    "mgsm": _mgsm_rows,
    "gsm8k": _gsm8k_rows,
    "mathvision": lambda folder: f"{len(load_mathvision(folder))} problems",
    "tabmwp": lambda folder: f"{len(load_tabmwp(folder))} problems",
    "movielens": _movielens_rows,
}


def copy_source(key: str, copy_dir: Path, raw_dir: Path) -> tuple[int, int]:
    """Copy set ``key``'s folder from ``copy_dir`` into ``raw_dir``, every file (SOURCE.md and
    README.txt with the licence included); returns (files copied, files already there)."""
    source_folder = copy_dir / RAW_SOURCES[key].folder
    copied = unchanged = 0
    for path in sorted(source_folder.rglob("*")):
        if not path.is_file():
            continue
        target = raw_dir / RAW_SOURCES[key].folder / path.relative_to(source_folder)
        here, there = path.stat(), target.stat() if target.is_file() else None
        if there and (here.st_size, here.st_mtime_ns) == (there.st_size, there.st_mtime_ns):
            unchanged += 1
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)  # keeps the modification time the next fetch compares
        copied += 1
    return copied, unchanged


def check_source(key: str, raw_dir: Path) -> str:
    """Set ``key`` under ``raw_dir``: its files are there (RawDataMissingError naming the
    missing ones) and its loader reads every row (DataValidationError naming file and line);
    returns the loader's summary."""
    missing = missing_sets(raw_dir, [key])
    if missing:
        raise RawDataMissingError(f"{key} in {raw_dir}: {missing[key]}")
    return CHECKS[key](raw_dir / RAW_SOURCES[key].folder)


def fetch_raw_data(
    raw_dir: Path,
    copy_dir: Path | None = None,
    keys: Iterable[str] | None = None,
    get: Get = fetch_url,
) -> list[str]:
    """Fill ``raw_dir`` with the sets ``keys`` (default: all) and check each; returns one
    report line per set.

    Args:
        raw_dir: the raw data dir (data_ingest.raw_data_dir).
        copy_dir: a local copy to copy from; None downloads the sets that are not complete in
            ``raw_dir`` yet from their public sources.
        get: fetches one address (only without ``copy_dir``).

    Raises:
        RawDataMissingError: ``copy_dir`` lacks files of a set (all of them are named; nothing
            is copied then), or a set is still incomplete after the fetch.
        DownloadError: a download failed (no internet, say); the message says how to fetch
            from a local copy instead.
    """
    keys = list(RAW_SOURCES if keys is None else keys)
    missing_sets(raw_dir, keys)  # unknown names fail here, before anything is fetched
    report = {}
    if copy_dir is not None:
        lacking = missing_sets(copy_dir, keys)
        if lacking:
            listed = "; ".join(f"{key} ({what})" for key, what in lacking.items())
            folders = ", ".join(f"{RAW_SOURCES[key].folder}/" for key in keys)
            raise RawDataMissingError(
                f"the local copy {copy_dir} lacks raw data: {listed}. Name the folder that "
                f"holds {folders} with --from, or fetch only the complete sets with --source"
            )
        for key in keys:
            copied, unchanged = copy_source(key, copy_dir, raw_dir)
            report[key] = f"copied {copied} files ({unchanged} already there)"
    else:
        for key in keys:
            if missing_sets(raw_dir, [key]):
                download_source(key, raw_dir, get)
                report[key] = f"downloaded from {RAW_SOURCES[key].download}"
            else:
                report[key] = "already there"
    return [
        f"{key}: {what} -> {raw_dir / RAW_SOURCES[key].folder}: {check_source(key, raw_dir)}"
        for key, what in report.items()
    ]
