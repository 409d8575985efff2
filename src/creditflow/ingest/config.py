"""The ``data_ingest`` parameter group, parsed and checked up front.

The knobs themselves are documented in ``conf/base/parameters_data_ingest.yml``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Folder of each source under the shared data dir (see each folder's SOURCE.md).
SOURCE_DIRS = {
    "mgsm": "mgsm",
    "gsm8k": "gsm8k",
    "mathvision": "mathvision_testmini",
    "tabmwp": "tabmwp_numeric300",
    "movielens": "movielens_ml_latest_small",
}

_ISO_639_1 = re.compile(r"[a-z]{2}")


@dataclass(frozen=True)
class IngestConfig:
    """Parsed ``params:data_ingest``.

    Attributes:
        shared_data_dir: root of the shared data sets; a relative path is kept relative (it is
            resolved against the working directory, the project root under ``kedro run``).
        mgsm_languages: ISO 639-1 codes of the MGSM files to load (``mgsm_<code>.tsv``).
        max_rows_per_source: keep only the first N problems (MGSM: per language) or ratings
            of each source; None keeps all. Whole files are validated either way.
    """

    shared_data_dir: Path
    mgsm_languages: tuple[str, ...]
    max_rows_per_source: int | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> IngestConfig:
        """Build from the parameter dict, raising ValueError on unknown, missing or bad knobs."""
        valid = ("shared_data_dir", "mgsm_languages", "max_rows_per_source")
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise ValueError(f"data_ingest: unknown parameter(s) {unknown}; valid ones: {valid}")
        missing = [key for key in valid[:2] if key not in params]
        if missing:
            raise ValueError(f"data_ingest: missing parameter(s) {missing}")
        languages = tuple(params["mgsm_languages"])
        bad = [code for code in languages if not _ISO_639_1.fullmatch(str(code))]
        if not languages or bad or len(set(languages)) != len(languages):
            raise ValueError(
                f"data_ingest.mgsm_languages must be distinct lower-case ISO 639-1 codes "
                f"such as [en, de]; got {list(languages)}"
            )
        max_rows = params.get("max_rows_per_source")
        if max_rows is not None and (type(max_rows) is not int or max_rows < 1):
            raise ValueError(
                f"data_ingest.max_rows_per_source must be null or an integer >= 1; got {max_rows!r}"
            )
        return cls(Path(params["shared_data_dir"]), languages, max_rows)

    def source_dir(self, source: str) -> Path:
        """The folder of ``source`` (a key of :data:`SOURCE_DIRS`) under the shared data dir."""
        if source not in SOURCE_DIRS:
            raise ValueError(f"unknown source {source!r}; valid ones: {sorted(SOURCE_DIRS)}")
        return self.shared_data_dir / SOURCE_DIRS[source]
