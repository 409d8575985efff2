"""MovieLens loader on the real data sets and on small broken files."""

from pathlib import Path

import pandas as pd
import pytest

from creditflow.ingest import (
    MOVIELENS_TAGS_SCHEMA,
    DataValidationError,
    check_frame,
    load_movielens,
    load_movielens_tags,
)
from creditflow.ingest.schemas import MOVIELENS_ITEMS_SCHEMA, MOVIELENS_RATINGS_SCHEMA


@pytest.fixture(scope="module")
def movielens(raw_data: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    return load_movielens(raw_data / "movielens_ml_latest_small")


def test_movielens_real_counts_and_schemas(movielens) -> None:
    ratings, items = movielens
    check_frame(ratings, MOVIELENS_RATINGS_SCHEMA)
    check_frame(items, MOVIELENS_ITEMS_SCHEMA)
    assert len(ratings) == 71282
    assert len(items) == 9742
    assert ratings["user_id"].nunique() == 427  # the shared users (SOURCE.md)
    assert ratings["rating"].between(0.5, 5.0).all()
    assert ratings["item_id"].isin(items["item_id"]).all()
    # ratings.csv line 2 is '1,1,4.0,964982703'.
    assert ratings.iloc[0].tolist() == [1, 1, 4.0, 964982703]


def test_movielens_items_parse_genres_and_year(movielens) -> None:
    _, items = movielens
    by_id = items.set_index("item_id")
    toy_story = by_id.loc[1]
    assert toy_story["title"] == "Toy Story (1995)"
    assert toy_story["genres"] == ["Adventure", "Animation", "Children", "Comedy", "Fantasy"]
    assert toy_story["year"] == 1995
    # 'Death Note: Desu nôto (2006–2007)' is a series: its first year.
    series = items["title"] == "Death Note: Desu nôto (2006–2007)"
    assert items.loc[series, "year"].tolist() == [2006]
    # 34 movies are '(no genres listed)'; 12 titles carry no year at all.
    assert (items["genres"].map(len) == 0).sum() == 34
    assert items["year"].isna().sum() == 12
    assert not items["title"].str.endswith(" ").any()


def test_max_rows_caps_ratings_but_keeps_the_catalogue(raw_data: Path) -> None:
    ratings, items = load_movielens(raw_data / "movielens_ml_latest_small", max_rows=10)
    assert len(ratings) == 10
    assert len(items) == 9742


# --- broken files ---------------------------------------------------------------------

MOVIES = 'movieId,title,genres\r\n1,Toy Story (1995),Comedy\r\n2,"Jumanji, The (1995)",(no genres listed)\r\n'
RATINGS = "userId,movieId,rating,timestamp\r\n1,1,4.0,964982703\r\n1,2,0.5,964981247\r\n"


def _folder(tmp_path: Path, ratings: str = RATINGS, movies: str = MOVIES) -> Path:
    (tmp_path / "ratings.csv").write_text(ratings, encoding="utf-8", newline="")
    (tmp_path / "movies.csv").write_text(movies, encoding="utf-8", newline="")
    return tmp_path


def test_toy_folder_loads(tmp_path: Path) -> None:
    ratings, items = load_movielens(_folder(tmp_path))
    assert ratings.values.tolist() == [[1, 1, 4.0, 964982703], [1, 2, 0.5, 964981247]]
    assert items.values.tolist() == [
        [1, "Toy Story (1995)", ["Comedy"], 1995],
        [2, "Jumanji, The (1995)", [], 1995],
    ]


@pytest.mark.parametrize(
    ("extra_row", "message"),
    [
        ("2,1,5.5,964982703", r"rating '5\.5' is not a number in \[0\.5, 5\.0\]"),
        ("2,1,0.0,964982703", r"rating '0\.0' is not a number"),
        ("2,1,four,964982703", "rating 'four' is not a number"),
        ("2,9,4.0,964982703", "movieId 9 is not in movies.csv"),
        ("x,1,4.0,964982703", "userId 'x' is not a non-negative integer"),
        ("2,1.5,4.0,964982703", "movieId '1.5' is not a non-negative integer"),
        ("1,2,3.0,964982703", "user 1 rates movie 2 twice"),
        ("2,1,4.0", "3 fields, but the header has 4"),
        ("", "0 fields, but the header has 4"),
    ],
)
def test_ratings_errors_name_file_and_line(tmp_path: Path, extra_row: str, message: str) -> None:
    folder = _folder(tmp_path, ratings=RATINGS + extra_row + "\r\n" + "3,1,3.0,964982703\r\n")
    with pytest.raises(DataValidationError, match=message) as err:
        load_movielens(folder)
    # header line 1, two good rows on lines 2-3, the bad row on line 4.
    assert (err.value.path, err.value.line) == (folder / "ratings.csv", 4)
    assert "ratings.csv, line 4: " in str(err.value)


def test_missing_rating_column(tmp_path: Path) -> None:
    folder = _folder(tmp_path, ratings="userId,movieId,timestamp\r\n1,1,964982703\r\n")
    with pytest.raises(
        DataValidationError, match=r"ratings\.csv, line 1: .*lacks column\(s\) \['rating'\]"
    ):
        load_movielens(folder)


@pytest.mark.parametrize(
    ("extra_row", "message"),
    [
        ("1,Toy Story again (1995),Comedy", r"duplicate id '1' \(first on line 2\)"),
        ('3,"",Drama', "field 'title' is empty"),
        ("three,Heat (1995),Crime", "movieId 'three' is not a non-negative integer"),
    ],
)
def test_movies_errors_name_file_and_line(tmp_path: Path, extra_row: str, message: str) -> None:
    folder = _folder(tmp_path, movies=MOVIES + extra_row + "\r\n")
    with pytest.raises(DataValidationError, match=message) as err:
        load_movielens(folder)
    assert (err.value.path, err.value.line) == (folder / "movies.csv", 4)


# --- tags ---------------------------------------------------------------------------------

TAGS = (
    "userId,movieId,tag,timestamp\r\n1,1,funny,1445714994\r\n2,1, Highly quotable ,1445714996\r\n"
)


def test_toy_tags_load_stripped(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "tags.csv").write_text(TAGS, encoding="utf-8", newline="")
    _, items = load_movielens(folder)
    tags = load_movielens_tags(folder, items)
    check_frame(tags, MOVIELENS_TAGS_SCHEMA)
    assert tags.values.tolist() == [
        [1, 1, "funny", 1445714994],
        [2, 1, "Highly quotable", 1445714996],
    ]


@pytest.mark.parametrize(
    ("extra_row", "message"),
    [
        ("3,9,scary,1445714996", "movieId 9 is not in movies.csv"),
        ("3,1,,1445714996", "field 'tag' is empty"),
        ("1,1,funny,1445714999", "user 1 tags movie 1 'funny' twice"),
        ("3,1,scary,soon", "timestamp 'soon' is not a non-negative integer"),
    ],
)
def test_tags_errors_name_file_and_line(tmp_path: Path, extra_row: str, message: str) -> None:
    folder = _folder(tmp_path)
    (folder / "tags.csv").write_text(TAGS + extra_row + "\r\n", encoding="utf-8", newline="")
    _, items = load_movielens(folder)
    with pytest.raises(DataValidationError, match=message) as err:
        load_movielens_tags(folder, items)
    assert (err.value.path, err.value.line) == (folder / "tags.csv", 4)
