"""The raw data sets: one table of what each is, where it lives in the project and where its
public copy comes from.

The table is read by ``data_ingest`` (:class:`creditflow.ingest.config.IngestConfig` finds a
set's folder through it, and the run fails before its first node when a set is absent), by the
fetch step (``creditflow fetch-data``, :mod:`creditflow.ingest.fetch`), by the tests (they skip
when a set is absent) and by ``docs/data.md`` (a test checks the page names every set's folder,
licence and origin). What each set holds, its columns and its split: ``docs/data.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from creditflow.errors import RawDataMissingError

# Where the fetch step puts the sets and data_ingest reads them (data_ingest.raw_data_dir in
# conf/base/parameters_data_ingest.yml says the same; a test holds the two together).
RAW_DATA_DIR = Path("data/01_raw")

COPY_HINT = (
    "`creditflow fetch-data --from <folder holding a copy of the sets>` "
    "(or `make data FROM=<folder>`)"
)
FETCH_HINT = (
    f"Fetch them with {COPY_HINT}, or with internet `creditflow fetch-data` to download them "
    "from their public sources (docs/data.md)"
)

# The MGSM languages of the project's copy; bn, sw and te are a held-out evaluation set.
MGSM_LANGUAGES = ("en", "de", "es", "fr", "ja", "ru", "th", "zh")


def mgsm_files(languages: Sequence[str]) -> tuple[str, ...]:
    """The MGSM files ``load_mgsm`` reads for ``languages``: English always (every language is
    paired with it line by line), then each other language's.

    >>> mgsm_files(["bn", "en", "sw"])
    ('mgsm_en.tsv', 'mgsm_bn.tsv', 'mgsm_sw.tsv')
    """
    return ("mgsm_en.tsv", *(f"mgsm_{code}.tsv" for code in languages if code != "en"))


@dataclass(frozen=True)
class RawSource:
    """One raw data set.

    Attributes:
        folder: its folder under the raw data dir.
        title: its name, for messages and the docs.
        files: the files its loader reads, relative to ``folder``.
        image_dir: the folder of its per-problem images (the loader checks each one), or None.
        licence: the licence of the data, short.
        origin: the public copy the project's copy was taken from (a repository at a commit,
            or the official archive).
        download: what the fetch step downloads without a local copy: the raw-file prefix of
            that repository commit, or the archive itself.
    """

    folder: str
    title: str
    files: tuple[str, ...]
    image_dir: str | None
    licence: str
    origin: str
    download: str


_GITHUB_RAW = "https://raw.githubusercontent.com"

RAW_SOURCES: Mapping[str, RawSource] = {
    "mgsm": RawSource(
        folder="mgsm",
        title="MGSM",
        files=mgsm_files(MGSM_LANGUAGES),
        image_dir=None,
        licence="CC BY 4.0",
        origin="https://github.com/google-research/url-nlp (mgsm/, commit 452a21ad)",
        download=f"{_GITHUB_RAW}/google-research/url-nlp/452a21ad3dae5668c06ceeac21ff073e1e40f9be/",
    ),
    "gsm8k": RawSource(
        folder="gsm8k",
        title="GSM8K",
        files=("train.jsonl", "test_shared.jsonl", "test_shared_line_index.txt"),
        image_dir=None,
        licence="MIT",
        origin="https://github.com/openai/grade-school-math (commit 3101c7d5)",
        download=f"{_GITHUB_RAW}/openai/grade-school-math/3101c7d5072418e28b9008a6636bde82a006892c/",
    ),
    "mathvision": RawSource(
        folder="mathvision_testmini",
        title="MATH-Vision testmini",
        files=("testmini_shared.jsonl",),
        image_dir="images",
        licence="MIT",
        origin="https://github.com/mathllm/MATH-V (commit a1f5cc3a)",
        download=f"{_GITHUB_RAW}/mathllm/MATH-V/a1f5cc3add200c0cd080fad463e500f44ef1fb41/",
    ),
    "tabmwp": RawSource(
        folder="tabmwp_numeric300",
        title="TabMWP numeric subset",
        files=("problems_shared.json",),
        image_dir="tables",
        licence="CC BY-NC-SA 4.0",
        origin="https://github.com/lupantech/PromptPG (data/tabmwp/, commit 7cf61b1b)",
        download=f"{_GITHUB_RAW}/lupantech/PromptPG/7cf61b1bec07222fc24b4f5a1410911f77c2d2c9/",
    ),
    "movielens": RawSource(
        folder="movielens_ml_latest_small",
        title="MovieLens ml-latest-small",
        files=("ratings.csv", "movies.csv", "tags.csv", "links.csv", "README.txt"),
        image_dir=None,
        licence="GroupLens research licence (README.txt)",
        origin="https://grouplens.org/datasets/movielens/ (ml-latest-small, September 2018)",
        download="https://files.grouplens.org/datasets/movielens/ml-latest-small.zip",
    ),
}


def missing_files(folder: Path, key: str, files: Sequence[str] | None = None) -> list[str]:
    """What of set ``key`` is missing from ``folder`` (its own folder): the absent files of
    ``files`` (default: all of the set's), and ``<image_dir>/`` when that folder is absent or
    empty; ``[]`` when the set is complete."""
    source = RAW_SOURCES[key]
    names = source.files if files is None else files
    missing = [name for name in names if not (folder / name).is_file()]
    images = folder / source.image_dir if source.image_dir else None
    if images is not None and not (images.is_dir() and any(images.iterdir())):
        missing.append(f"{source.image_dir}/ (absent or empty)")
    return missing


def missing_sets(
    raw_dir: Path,
    keys: Iterable[str] | None = None,
    files: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, str]:
    """Set -> what is missing of it under ``raw_dir``, for the sets ``keys`` (default: all)
    that are not complete there. ``files``: set -> the files a run reads of it, where that is
    fewer than all (``mgsm_files`` of ``data_ingest.mgsm_languages``)."""
    files = files or {}
    found = {}
    for key in RAW_SOURCES if keys is None else keys:
        if key not in RAW_SOURCES:
            raise ValueError(f"unknown raw data set {key!r}; valid ones: {sorted(RAW_SOURCES)}")
        folder = raw_dir / RAW_SOURCES[key].folder
        if not folder.is_dir():
            found[key] = f"no folder {RAW_SOURCES[key].folder}/"
        elif missing := missing_files(folder, key, files.get(key)):
            found[key] = "missing " + ", ".join(missing)
    return found


def check_raw_data(
    raw_dir: Path,
    keys: Iterable[str] | None = None,
    files: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """RawDataMissingError naming every set of ``keys`` (default: all) that is not complete
    under ``raw_dir`` (of ``files``, as :func:`missing_sets`), what of it is missing, and how
    to fetch it."""
    missing = missing_sets(raw_dir, keys, files)
    if missing:
        listed = "; ".join(f"{key} ({what})" for key, what in missing.items())
        raise RawDataMissingError(
            f"raw data set(s) {', '.join(missing)} not in {raw_dir}: {listed}. {FETCH_HINT}"
        )
