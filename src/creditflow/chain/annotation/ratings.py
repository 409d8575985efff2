"""A text-only teacher for catalogues without covers: an item's analysis from its ratings.

MovieLens has no images for the VLM annotator of docs/methods/experience.md, step 1 to read, but it has what that
annotator stands in for: many users' judgement of each movie. The teacher turns the ratings of
an item into the same kind of annotation the synthetic chain's annotator writes, an analysis
text followed by an ``overall`` score, for the text-only ExpModel
(``chain.expmodel.text``) to learn to write from the item's title, year, genres and tags.

Leakage: the MovieLens sessions hold back each user's latest ratings as the evaluation's
labels, so the teacher must only read ratings that no session holds back (pass
``chain.world.movielens.without_held_back(ratings, sessions)``; the ``movielens_eval`` node does).
It then never sees a label, and its score of a held-back movie comes from *other* users'
ratings and the same user's earlier ones only.

Scores (``R`` the ratings of an item, ``n = |R|``, ``m`` the mean of all ratings given, ``k``
``prior_ratings``): an item is annotated when ``n >= min_ratings``, with ``overall`` the mean
shrunk towards the catalogue's, ``(sum(R) + k m) / (n + k)``, rounded to 2 decimals: a movie two
users loved is not judged better than one two hundred users rated a little lower. Items with
fewer ratings get no annotation: the ExpModel's job is to score them from their text.
"""

from __future__ import annotations

import logging

import pandas as pd

logger = logging.getLogger(__name__)

RATING_ANNOTATION_COLUMNS = (
    "item_id",
    "status",
    "overall",
    "n_ratings",
    "mean_rating",
    "liked_share",
    "analysis",
)
# Ratings of 4 stars and up count as liked (chain.world.movielens.RELEVANT_RATING).
LIKED_RATING = 4.0


def rating_annotations(
    item_texts: pd.DataFrame,
    ratings: pd.DataFrame,
    min_ratings: int = 5,
    prior_ratings: float = 5.0,
) -> pd.DataFrame:
    """One annotation per item of ``item_texts`` with at least ``min_ratings`` ratings.

    Args:
        item_texts: ``chain.world.movielens.movielens_item_texts`` (``item_id, title, year, genres,
            tags``): the genres and tags the analysis cites.
        ratings: ``user_id, item_id, rating``, the training part only (module docstring);
            ratings of items outside ``item_texts`` are not read.
        min_ratings: least number of ratings for an item to be judged (>= 1).
        prior_ratings: ``k``, the weight (in ratings) of the catalogue mean in ``overall``.

    Returns:
        ``RATING_ANNOTATION_COLUMNS`` by ``item_texts`` order: ``status`` ``"ok"``, ``overall``
        (the shrunk mean, 0.5-5 stars), ``n_ratings``, ``mean_rating``, ``liked_share`` (share
        of ratings >= 4) and ``analysis`` (the text citing them, the genres and tags, then the
        overall score).

    >>> texts = pd.DataFrame(
    ...     {
    ...         "item_id": [1, 2],
    ...         "title": ["A", "B"],
    ...         "year": [2000, 2001],
    ...         "genres": [["Drama"], []],
    ...         "tags": [["slow"], []],
    ...     }
    ... )
    >>> ratings = pd.DataFrame(
    ...     {"user_id": [1, 2, 3], "item_id": [1, 1, 2], "rating": [5.0, 4.0, 3.0]}
    ... )
    >>> # m = 4.0; item 1: (5 + 4 + 1 * 4) / (2 + 1) = 4.33; item 2 has one rating only
    >>> rating_annotations(texts, ratings, min_ratings=2, prior_ratings=1.0)[
    ...     ["item_id", "overall"]
    ... ].values.tolist()
    [[1.0, 4.33]]
    """
    if isinstance(min_ratings, bool) or not isinstance(min_ratings, int) or min_ratings < 1:
        raise ValueError(f"min_ratings must be an int >= 1, got {min_ratings!r}")
    if not prior_ratings >= 0:
        raise ValueError(f"prior_ratings must be >= 0, got {prior_ratings!r}")
    missing = [c for c in ("item_id", "rating") if c not in ratings.columns]
    if missing or ratings.empty:
        raise ValueError(f"ratings need rows with item_id and rating (missing {missing})")
    catalogue_mean = float(ratings["rating"].mean())
    known = ratings[ratings["item_id"].isin(item_texts["item_id"])]
    stats = known.groupby("item_id")["rating"].agg(
        n_ratings="size", total="sum", liked=lambda r: float((r >= LIKED_RATING).mean())
    )
    stats = stats[stats["n_ratings"] >= min_ratings]
    rows = []
    for text in item_texts[item_texts["item_id"].isin(stats.index)].itertuples(index=False):
        item = stats.loc[text.item_id]
        n = int(item["n_ratings"])
        overall = round((item["total"] + prior_ratings * catalogue_mean) / (n + prior_ratings), 2)
        mean = float(item["total"]) / n
        rows.append(
            {
                "item_id": text.item_id,
                "status": "ok",
                "overall": overall,
                "n_ratings": n,
                "mean_rating": round(mean, 2),
                "liked_share": round(float(item["liked"]), 2),
                "analysis": _analysis(text, n, mean, float(item["liked"]), catalogue_mean, overall),
            }
        )
    logger.info(
        "rating teacher: %d of %d items have >= %d training ratings (catalogue mean %.2f)",
        len(rows),
        len(item_texts),
        min_ratings,
        catalogue_mean,
    )
    frame = pd.DataFrame(rows, columns=list(RATING_ANNOTATION_COLUMNS))
    return frame.astype({"overall": "float64", "n_ratings": "int64", "mean_rating": "float64"})


def _analysis(
    text, n: int, mean: float, liked: float, catalogue_mean: float, overall: float
) -> str:
    """The templated reasoning: the ratings first, then the item's text, then the verdict."""
    relative = "above" if mean > catalogue_mean else "below" if mean < catalogue_mean else "at"
    genres = ", ".join(text.genres) if len(text.genres) else "none listed"
    tags = ", ".join(text.tags) if len(text.tags) else "none"
    return (
        f"{n} viewers rated it {mean:.2f} stars on average, {relative} the catalogue's "
        f"{catalogue_mean:.2f}; {100 * liked:.0f}% gave 4 stars or more. "
        f"Genres: {genres}. Tags: {tags}. Overall {overall:.2f} / 5."
    )
