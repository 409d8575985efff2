"""The documented schemas, their checks (also after a Parquet round trip) and the config."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from creditflow.ingest.config import SOURCE_DIRS, IngestConfig
from creditflow.ingest.schemas import (
    MATH_TEXT_SCHEMA,
    MOVIELENS_ITEMS_SCHEMA,
    MOVIELENS_RATINGS_SCHEMA,
    VISUAL_SCHEMA,
    Column,
    check_frame,
    conform_frame,
)
from creditflow.ingest.sources import RAW_DATA_DIR


def _visual_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": ["mathvision-4", "mathvision-6"],
            "image_path": ["images/4.jpg", "images/6.jpg"],
            "question": ["How many?", "Which one?"],
            "answer": ["6", "D"],
            "choices": [[], ["A", "B", "C", "D", "E"]],
        }
    )


def test_schemas_document_the_agreed_columns() -> None:
    assert MATH_TEXT_SCHEMA.names == ["id", "language", "question", "question_en", "answer"]
    assert VISUAL_SCHEMA.names == ["id", "image_path", "question", "answer", "choices"]
    assert MOVIELENS_RATINGS_SCHEMA.names == ["user_id", "item_id", "rating", "timestamp"]
    assert MOVIELENS_ITEMS_SCHEMA.names == ["item_id", "title", "genres", "year"]
    assert [c.dtype for c in MOVIELENS_ITEMS_SCHEMA.columns] == [
        "int64",
        "str",
        "list[str]",
        "Int64",
    ]
    assert MATH_TEXT_SCHEMA.key == ("id", "language")


def test_conform_frame_orders_and_casts_columns() -> None:
    frame = pd.DataFrame(
        {"year": [1995, None], "genres": [["Comedy"], []], "title": ["A", "B"], "item_id": [1, 2]}
    )
    conformed = conform_frame(frame, MOVIELENS_ITEMS_SCHEMA)
    assert list(conformed.columns) == MOVIELENS_ITEMS_SCHEMA.names
    assert conformed["year"].dtype == pd.Int64Dtype()
    assert conformed["year"].isna().tolist() == [False, True]
    assert conformed["item_id"].dtype == np.int64


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda f: f.drop(columns="answer"), "columns"),
        (lambda f: f[["id", "question", "image_path", "answer", "choices"]], "columns"),
        (lambda f: f.assign(answer=[6, 7]), "'answer' has dtype"),
        (lambda f: f.assign(question=["How many?", None]), "'question' has 1 missing"),
        (lambda f: f.assign(choices=[[], [1, 2]]), "'choices' holds values"),
        (lambda f: f.assign(choices=["", "ABCDE"]), "'choices' holds values"),
        (lambda f: f.assign(id=["mathvision-4", "mathvision-4"]), "not unique"),
    ],
)
def test_check_frame_names_what_breaks_the_schema(breakage, message: str) -> None:
    check_frame(conform_frame(_visual_frame(), VISUAL_SCHEMA), VISUAL_SCHEMA)
    with pytest.raises(ValueError, match=message):
        check_frame(breakage(conform_frame(_visual_frame(), VISUAL_SCHEMA)), VISUAL_SCHEMA)


def test_schema_survives_a_parquet_round_trip(tmp_path: Path) -> None:
    frame = conform_frame(_visual_frame(), VISUAL_SCHEMA)
    frame.to_parquet(tmp_path / "v.parquet")
    loaded = pd.read_parquet(tmp_path / "v.parquet")
    assert isinstance(loaded["choices"][1], np.ndarray)  # why list[str] accepts any sequence
    check_frame(loaded, VISUAL_SCHEMA)
    assert loaded["choices"].map(list).tolist() == [[], ["A", "B", "C", "D", "E"]]


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'string'"):
        Column("x", "string", "")


def test_config_from_the_project_parameters(project_root: Path) -> None:
    params = yaml.safe_load((project_root / "conf/base/parameters_data_ingest.yml").read_text())
    config = IngestConfig.from_params(params["data_ingest"])
    assert config.raw_data_dir == Path("data/01_raw") == RAW_DATA_DIR  # where fetch-data puts them
    assert config.mgsm_languages == ("en", "de", "es", "fr", "ja", "ru", "th", "zh")
    assert config.max_rows_per_source is None
    assert config.source_dir("tabmwp") == Path("data/01_raw/tabmwp_numeric300")
    assert set(SOURCE_DIRS) == {"mgsm", "gsm8k", "mathvision", "tabmwp", "movielens"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_rows": 5}, r"unknown parameter\(s\) \['max_rows'\]; valid ones"),
        ({"mgsm_languages": []}, "ISO 639-1"),
        ({"mgsm_languages": ["en", "de", "en"]}, "distinct"),
        ({"mgsm_languages": ["EN"]}, "lower-case"),
        ({"mgsm_languages": ["eng"]}, "ISO 639-1"),
        ({"max_rows_per_source": 0}, ">= 1"),
        ({"max_rows_per_source": True}, ">= 1"),
        ({"max_rows_per_source": "5"}, ">= 1"),
    ],
)
def test_config_rejects_bad_knobs(change: dict, message: str) -> None:
    params = {"raw_data_dir": "d", "mgsm_languages": ["en"], "max_rows_per_source": None}
    IngestConfig.from_params(params)
    with pytest.raises(ValueError, match=message):
        IngestConfig.from_params(params | change)


def test_config_requires_the_data_dir_and_knows_only_its_sources() -> None:
    with pytest.raises(ValueError, match=r"missing parameter\(s\) \['raw_data_dir'\]"):
        IngestConfig.from_params({"mgsm_languages": ["en"]})
    config = IngestConfig.from_params({"raw_data_dir": "d", "mgsm_languages": ["en"]})
    with pytest.raises(ValueError, match="unknown source 'mathv'; valid ones: .*'mathvision'"):
        config.source_dir("mathv")


def test_the_old_data_dir_key_says_its_new_name() -> None:
    old = {"shared_data_dir": "somewhere", "mgsm_languages": ["en"]}
    with pytest.raises(ValueError, match=r"shared_data_dir is now data_ingest.raw_data_dir"):
        IngestConfig.from_params(old)
