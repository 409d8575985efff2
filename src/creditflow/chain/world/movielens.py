"""MovieLens ranking sessions: the reranker's session frame (docs/methods/experience.md) on real ratings.

MovieLens (``movielens_ratings``, ``movielens_items``; see ``docs/data.md``) has explicit
ratings and no search queries, exposures or clicks. This module turns each user into one
ranking session with the columns of the synthetic logs (``chain.world.catalogue.SESSION_COLUMNS``),
so every reranker stage runs on it unchanged. Per user, ratings sorted by time (ties by
``item_id``):

- the last ``n_candidates - n_negatives`` rated movies are held back as the rated candidates;
- the ``history_length`` ratings just before them are the query context: ``query_text`` is the
  history's most frequent genres, most frequent first (ties alphabetical), ``query_id`` the
  user id. Genres rather than titles, because ``chain.reranker.training.session_features`` reads
  query words as category names (``category_match``: the item's first genre equals the
  user's top history genre);
- ``n_negatives`` movies the user never rated are drawn as unexposed candidates;
- the candidates are shuffled (seeded), so a list index says nothing about the label.

Labels: a rated candidate with ``rating >= RELEVANT_RATING`` is ``C`` (positive feedback plays
the click), any other rated one ``E`` (seen, not liked), a drawn negative ``U``. ``clicks`` is 1
on ``C``. ``true_quality`` is the graded relevance ``rating / 5`` (0 for negatives): on real data
there is no hidden quality, so the reranker evaluation uses the user's own rating as the
experience gain.

The "training part" is every rating except the held-back candidates (the history, older
ratings and all ratings of other users, whatever their time). The production order
``logged_order`` ranks candidates by their number of ratings in the training part, descending
(ties in the shuffled order): a popularity ranker, the click-biased baseline of docs/methods/experience.md. The
held-back ratings never enter these counts, so the logged order does not peek at the labels.

``without_held_back`` gives that training part of any per-(user, item) table (ratings, tags)
from the sessions themselves: what a reader that must not peek at the labels (the text-only
ExpModel's teacher, ``annotation.ratings``) may read. ``movielens_item_texts`` is the item text
of the text-only ExpModel: title, year, genres and the most frequent tags.

Traffic bands: users are ordered by their number of ratings, descending (ties by user id), and
split by ``chain.world.catalogue.frequency_bands`` into ``head``/``torso``/``tail``, each about a
third of all ratings, as the synthetic queries are by traffic share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pandas as pd

from creditflow.chain.world.catalogue import (
    LABEL_CLICKED,
    LABEL_EXPOSED,
    LABEL_UNEXPOSED,
    SESSION_COLUMNS,
    frequency_bands,
)

RELEVANT_RATING = 4.0  # ratings of 4 stars and up count as positive feedback ("clicks")
MAX_RATING = 5.0
UNKNOWN_CATEGORY = "unknown"  # category of movies MovieLens lists without genres
NEGATIVE_SAMPLING = ("uniform", "popularity_band")
ITEM_TABLE_COLUMNS = ("item_id", "category", "title", "genres", "year", "popularity", "n_ratings")
ITEM_TEXT_COLUMNS = ("item_id", "title", "year", "genres", "tags")


def movielens_sessions(
    ratings: pd.DataFrame,
    items: pd.DataFrame,
    n_candidates: int = 20,
    history_length: int = 10,
    n_negatives: int = 10,
    max_users: int | None = None,
    seed: int = 0,
    *,
    negative_sampling: str = "uniform",
    query_genres: int = 3,
    band_cuts: tuple[float, float] = (1 / 3, 2 / 3),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One ranking session per user: held-back rated movies plus unrated negatives (see module).

    Users with fewer than ``history_length + n_candidates - n_negatives`` ratings are skipped.
    User ``u`` draws from ``np.random.default_rng([seed, u])``, so with uniform negatives a
    session's candidates and labels do not depend on which other users are kept; the training
    counts (hence ``logged_order``, banded negatives and ``popularity``) and the bands do.

    Args:
        ratings: ``movielens_ratings`` (``user_id, item_id, rating, timestamp``).
        items: ``movielens_items`` (``item_id, title, genres, year``), the catalogue the
            negatives are drawn from; every rated item must be in it.
        n_candidates: ``L``, candidates per session (>= 1).
        history_length: ratings given as the query context (>= 1).
        n_negatives: unrated candidates per session, ``0 <= n_negatives < L``; the other
            ``L - n_negatives`` candidates are rated.
        max_users: keep the eligible users with the smallest ids, at most this many (all when
            None).
        seed: seeds the negatives and the candidate shuffle.
        negative_sampling: ``"uniform"`` over the user's unrated catalogue, or
            ``"popularity_band"``: the ``k``-th negative comes from the band
            ``floor(log2(1 + n_ratings))`` of the ``k mod (L - n_negatives)``-th rated
            candidate (uniform over the unrated catalogue when that band has no unrated
            movie left), so negatives are not told apart by popularity alone.
        query_genres: most frequent history genres written into ``query_text`` (>= 1).
        band_cuts: cumulative rating shares that end the head and the torso of users.

    Returns:
        ``(sessions, item_table)``. ``sessions`` has ``SESSION_COLUMNS`` as in
        ``chain.world.catalogue.generate_sessions``: ``session_id`` (0..N-1 by user id), ``query_id``
        (the user id), ``query_text``, ``query_frequency_band``, ``candidates`` (``L`` item
        ids), ``logged_order`` (position -> candidate index, popularity descending),
        ``labels`` (``C``/``E``/``U``), ``clicks`` (0/1), ``long_views`` (all 0: ratings carry
        no watch time), ``relevance`` (1 for rated, 0 for negatives) and ``true_quality``
        (``rating / 5``, 0 for negatives). ``item_table`` has ``ITEM_TABLE_COLUMNS``, one row per item that is a
        candidate somewhere, by ``item_id``: ``category`` (first genre, ``"unknown"`` without
        genres), ``title``, ``genres``, ``year``, ``n_ratings`` (ratings in the training part)
        and ``popularity = 1 + n_ratings`` (add-one keeps ``log(popularity)`` of
        ``session_features`` finite for unrated movies).

    Raises:
        ValueError: invalid sizes or sampling name, missing columns, a rated item outside
            ``items``, or a user with fewer unrated movies than ``n_negatives``.
    """
    _check_int("n_candidates", n_candidates, minimum=1)
    _check_int("history_length", history_length, minimum=1)
    _check_int("n_negatives", n_negatives, minimum=0)
    _check_int("query_genres", query_genres, minimum=1)
    if max_users is not None:
        _check_int("max_users", max_users, minimum=1)
    if n_negatives >= n_candidates:
        raise ValueError(
            f"n_negatives ({n_negatives}) must be below n_candidates ({n_candidates}): every "
            "session needs at least one rated candidate"
        )
    if negative_sampling not in NEGATIVE_SAMPLING:
        raise ValueError(
            f"unknown negative_sampling {negative_sampling!r}; valid: {list(NEGATIVE_SAMPLING)}"
        )
    _require_columns(ratings, ("user_id", "item_id", "rating", "timestamp"), "ratings")
    _require_columns(items, ("item_id", "title", "genres", "year"), "items")
    unknown = ~ratings["item_id"].isin(items["item_id"])
    if unknown.any():
        raise ValueError(
            f"ratings refer to {int(unknown.sum())} item ids missing from items, e.g. "
            f"{ratings.loc[unknown, 'item_id'].head(3).tolist()}"
        )

    n_rated = n_candidates - n_negatives
    ordered = ratings.sort_values(["user_id", "timestamp", "item_id"], kind="stable")
    ratings_per_user = ordered.groupby("user_id").size()  # (users,)
    eligible = ratings_per_user.index[ratings_per_user >= history_length + n_rated]
    users = [int(u) for u in sorted(eligible)[:max_users]]
    position = ordered.groupby("user_id").cumcount(ascending=False)  # 0 = the user's last
    held = ordered["user_id"].isin(users) & (position < n_rated)

    n_ratings = (
        ordered.loc[~held, "item_id"]
        .value_counts()
        .reindex(items["item_id"], fill_value=0)
        .astype("int64")
    )  # (catalogue,) ratings in the training part
    catalogue = items["item_id"].to_numpy(dtype=np.int64)
    item_band = np.floor(np.log2(1 + n_ratings.to_numpy())).astype(np.int64)  # (catalogue,)
    genres_of = dict(zip(items["item_id"], (list(g) for g in items["genres"]), strict=True))

    bands = _user_bands(ratings_per_user.loc[users], band_cuts)
    by_user = dict(tuple(ordered[ordered["user_id"].isin(users)].groupby("user_id")))
    rows = []
    for session_id, user in enumerate(users):
        history_and_held = by_user[user].iloc[-(history_length + n_rated) :]
        history = history_and_held.iloc[:history_length]
        rated = history_and_held.iloc[history_length:]
        rng = np.random.default_rng([seed, user])
        unrated = ~np.isin(catalogue, by_user[user]["item_id"].to_numpy())  # (catalogue,)
        if unrated.sum() < n_negatives:
            raise ValueError(
                f"user {user} left only {int(unrated.sum())} unrated movies for {n_negatives} "
                "negatives; lower n_negatives"
            )
        rated_ids = rated["item_id"].to_numpy(dtype=np.int64)
        negatives = _draw_negatives(
            rng,
            catalogue,
            unrated,
            item_band,
            n_ratings.loc[rated_ids].to_numpy(),
            n_negatives,
            negative_sampling,
        )
        rows.append(
            {
                "session_id": session_id,
                "query_id": user,
                "query_text": _top_genres(history["item_id"], genres_of, query_genres),
                "query_frequency_band": bands[user],
                **_session_lists(rng, rated_ids, rated["rating"].to_numpy(), negatives, n_ratings),
            }
        )
    sessions = pd.DataFrame(rows, columns=list(SESSION_COLUMNS))
    return sessions, _item_table(items, sessions, n_ratings)


def held_back_pairs(sessions: pd.DataFrame) -> pd.DataFrame:
    """``user_id, item_id`` of every held-back rating of ``movielens_sessions``: each session's
    user (``query_id``) with its rated candidates (label ``C`` or ``E``; ``U`` are unrated).

    >>> frame = pd.DataFrame(
    ...     {"query_id": [7], "candidates": [[1, 2, 3]], "labels": [["C", "U", "E"]]}
    ... )
    >>> held_back_pairs(frame).values.tolist()
    [[7, 1], [7, 3]]
    """
    _require_columns(sessions, ("query_id", "candidates", "labels"), "sessions")
    rows = [
        (int(user), int(item))
        for user, candidates, labels in zip(
            sessions["query_id"], sessions["candidates"], sessions["labels"], strict=True
        )
        for item, label in zip(candidates, labels, strict=True)
        if label != LABEL_UNEXPOSED
    ]
    return pd.DataFrame(rows, columns=["user_id", "item_id"], dtype="int64")


def without_held_back(frame: pd.DataFrame, sessions: pd.DataFrame) -> pd.DataFrame:
    """The rows of a per-(user, item) table (``movielens_ratings``, ``movielens_tags``) that
    no session holds back: the training part of the module docstring, index reset.

    >>> ratings = pd.DataFrame(
    ...     {"user_id": [7, 7, 8], "item_id": [1, 2, 1], "rating": [5.0, 1.0, 3.0]}
    ... )
    >>> frame = pd.DataFrame(
    ...     {"query_id": [7], "candidates": [[1, 2, 3]], "labels": [["C", "U", "E"]]}
    ... )
    >>> without_held_back(ratings, frame).values.tolist()
    [[7.0, 2.0, 1.0], [8.0, 1.0, 3.0]]
    """
    _require_columns(frame, ("user_id", "item_id"), "frame")
    held = held_back_pairs(sessions).assign(_held=True)
    marked = frame.merge(held, on=["user_id", "item_id"], how="left", validate="many_to_one")
    return frame[marked["_held"].isna().to_numpy()].reset_index(drop=True)


def movielens_item_texts(
    items: pd.DataFrame, tags: pd.DataFrame, max_tags: int = 5
) -> pd.DataFrame:
    """``ITEM_TEXT_COLUMNS`` of every catalogue item, in ``items`` order: ``title``, ``year``
    (``<NA>`` when unknown), ``genres`` and ``tags``, the item's ``max_tags`` most frequent
    tags (lower-cased, outer spaces stripped, most taggers first, ties alphabetical; empty for
    an untagged movie). Pass the training part of the tags (``without_held_back``): a user's
    tag on a held-back movie is a trace of that interaction.

    >>> items = pd.DataFrame(
    ...     {"item_id": [1], "title": ["Heat (1995)"], "genres": [["Crime"]], "year": [1995]}
    ... )
    >>> tags = pd.DataFrame(
    ...     {"user_id": [1, 2, 3], "item_id": [1, 1, 1], "tag": ["Tense", "tense ", "long"]}
    ... )
    >>> movielens_item_texts(items, tags, max_tags=1)["tags"].tolist()
    [['tense']]
    """
    _check_int("max_tags", max_tags, minimum=0)
    _require_columns(items, ("item_id", "title", "genres", "year"), "items")
    _require_columns(tags, ("user_id", "item_id", "tag"), "tags")
    normalised = tags.assign(tag=tags["tag"].str.strip().str.lower())
    taggers = normalised.drop_duplicates(["user_id", "item_id", "tag"])
    counts = taggers.groupby(["item_id", "tag"]).size().rename("n").reset_index()
    counts = counts.sort_values(["item_id", "n", "tag"], ascending=[True, False, True])
    top = counts.groupby("item_id")["tag"].apply(lambda t: list(t)[:max_tags])
    return pd.DataFrame(
        {
            "item_id": items["item_id"].astype("int64").to_numpy(),
            "title": items["title"].to_numpy(),
            "year": items["year"].astype("Int64").reset_index(drop=True),
            "genres": [list(g) for g in items["genres"]],
            "tags": [top.get(item, []) for item in items["item_id"]],
        },
        columns=list(ITEM_TEXT_COLUMNS),
    )


def _draw_negatives(
    rng: np.random.Generator,
    catalogue: np.ndarray,
    unrated: np.ndarray,
    item_band: np.ndarray,
    rated_counts: np.ndarray,
    n_negatives: int,
    sampling: str,
) -> np.ndarray:
    """``(n_negatives,)`` distinct unrated item ids (``catalogue``, ``unrated``, ``item_band``
    are aligned per catalogue row; ``rated_counts`` are the rated candidates' training counts)."""
    if sampling == "uniform":
        return rng.choice(catalogue[unrated], size=n_negatives, replace=False)
    available = unrated.copy()
    anchor_bands = np.floor(np.log2(1 + rated_counts)).astype(np.int64)
    picked = []
    for k in range(n_negatives):
        pool = np.flatnonzero(available & (item_band == anchor_bands[k % len(anchor_bands)]))
        if not len(pool):  # the band is used up: any unrated movie
            pool = np.flatnonzero(available)
        row = int(rng.choice(pool))
        available[row] = False
        picked.append(catalogue[row])
    return np.array(picked, dtype=np.int64)


def _session_lists(
    rng: np.random.Generator,
    rated_ids: np.ndarray,
    rated_scores: np.ndarray,
    negatives: np.ndarray,
    n_ratings: pd.Series,
) -> dict[str, list]:
    """Shuffled candidates with their popularity order, labels, clicks and graded relevance."""
    members = np.concatenate([rated_ids, negatives])  # (L,) rated first, before the shuffle
    scores = np.concatenate([rated_scores, np.full(len(negatives), np.nan)])  # NaN: unrated
    shuffle = rng.permutation(len(members))
    members, scores = members[shuffle], scores[shuffle]
    # Production order: most-rated first; stable, so ties keep the shuffled order.
    logged_order = np.argsort(-n_ratings.loc[members].to_numpy(), kind="stable")
    rated = ~np.isnan(scores)
    labels = np.where(
        rated & (scores >= RELEVANT_RATING),
        LABEL_CLICKED,
        np.where(rated, LABEL_EXPOSED, LABEL_UNEXPOSED),
    )
    return {
        "candidates": [int(v) for v in members],
        "logged_order": [int(v) for v in logged_order],
        "labels": [str(v) for v in labels],
        "clicks": [int(v == LABEL_CLICKED) for v in labels],
        # Ratings say nothing of watch time, and a user's own movies are all on topic.
        "long_views": [0] * len(members),
        "relevance": [float(v) for v in rated],
        "true_quality": [float(v) for v in np.where(rated, scores / MAX_RATING, 0.0)],
    }


def _top_genres(history_items: pd.Series, genres_of: dict, k: int) -> str:
    """The ``k`` most frequent genres of the history items, most frequent first, ties by name."""
    counts = Counter(genre for item in history_items for genre in genres_of[item])
    ranked = sorted(counts, key=lambda genre: (-counts[genre], genre))
    return " ".join(ranked[:k])


def _user_bands(ratings_per_user: pd.Series, band_cuts: tuple[float, float]) -> dict[int, str]:
    """``head``/``torso``/``tail`` per user by share of ratings (``frequency_bands``)."""
    if ratings_per_user.empty:
        return {}
    frame = ratings_per_user.rename("n").reset_index()
    frame = frame.sort_values(["n", "user_id"], ascending=[False, True], kind="stable")
    share = frame["n"].to_numpy(dtype=np.float64) / frame["n"].sum()
    return dict(zip(frame["user_id"].astype(int), frequency_bands(share, band_cuts), strict=True))


def _item_table(items: pd.DataFrame, sessions: pd.DataFrame, n_ratings: pd.Series) -> pd.DataFrame:
    """The candidates' catalogue rows with ``category``, ``n_ratings`` and ``popularity``."""
    used = sorted({int(i) for candidates in sessions["candidates"] for i in candidates})
    table = items.set_index("item_id").loc[used].reset_index()
    genres = [list(g) for g in table["genres"]]
    counts = n_ratings.loc[used].to_numpy(dtype=np.int64)
    return pd.DataFrame(
        {
            "item_id": table["item_id"].astype("int64"),
            "category": [g[0] if g else UNKNOWN_CATEGORY for g in genres],
            "title": table["title"],
            "genres": pd.Series(genres, dtype=object),
            "year": table["year"],
            "popularity": (1 + counts).astype(np.float64),
            "n_ratings": counts,
        },
        columns=list(ITEM_TABLE_COLUMNS),
    )


def _require_columns(frame: pd.DataFrame, columns: Sequence[str], name: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} is missing columns {missing}; expected at least {list(columns)}")


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
