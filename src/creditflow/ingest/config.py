"""The ``data_ingest`` parameter group, parsed and checked up front.

The knobs themselves are documented in ``conf/base/parameters_data_ingest.yml``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from creditflow.ingest.sources import RAW_SOURCES

# Folder of each raw data set under the raw data dir (the table: creditflow.ingest.sources).
SOURCE_DIRS = {key: source.folder for key, source in RAW_SOURCES.items()}

_ISO_639_1 = re.compile(r"[a-z]{2}")


@dataclass(frozen=True)
class IngestConfig:
    """Parsed ``params:data_ingest``.

    Attributes:
        raw_data_dir: the folder of the raw data sets, one sub-folder each (filled by
            ``creditflow fetch-data``); a relative path is kept relative (it is resolved
            against the working directory, the project root under ``kedro run``).
        mgsm_languages: ISO 639-1 codes of the MGSM files to load (``mgsm_<code>.tsv``).
        max_rows_per_source: keep only the first N problems (MGSM: per language) or ratings
            of each source; None keeps all. Whole files are validated either way.
    """

    raw_data_dir: Path
    mgsm_languages: tuple[str, ...]
    max_rows_per_source: int | None = None
    # Keys this group once took -> their new names (the parameter check says where they went).
    RENAMED: ClassVar[Mapping[str, str]] = {"shared_data_dir": "raw_data_dir"}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> IngestConfig:
        """Build from the parameter dict, raising ValueError on unknown, missing or bad knobs."""
        valid = ("raw_data_dir", "mgsm_languages", "max_rows_per_source")
        renamed = sorted(set(params) & set(cls.RENAMED))
        if renamed:
            raise ValueError(
                f"data_ingest.{renamed[0]} is now data_ingest.{cls.RENAMED[renamed[0]]} "
                "(the raw data sets live in the project, data/01_raw, filled by `creditflow "
                "fetch-data`; docs/data.md): rename the key in your parameters"
            )
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
        return cls(Path(params["raw_data_dir"]), languages, max_rows)

    def source_dir(self, source: str) -> Path:
        """The folder of ``source`` (a key of :data:`SOURCE_DIRS`) under the raw data dir."""
        if source not in SOURCE_DIRS:
            raise ValueError(f"unknown source {source!r}; valid ones: {sorted(SOURCE_DIRS)}")
        return self.raw_data_dir / SOURCE_DIRS[source]
