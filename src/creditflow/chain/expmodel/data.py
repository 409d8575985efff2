"""ExpModel training (docs/methods/experience.md, steps 2-3): SFT on item annotations, then pairwise PFT.

Stage I (SFT) teaches a small vision-language model to write an item's annotation y from its
cover image and title: ``L_SFT = -sum_t log p(y_t | y_<t, x)`` over the annotation tokens only.
Stage II (PFT) puts a scalar head on the SFT'd backbone (``creditflow.chain.expmodel.scorer.ExpScorer``)
and trains it on ordered pairs (A > B) of candidates of long-tail queries with
``pairwise_preference_loss``. ``score_items`` then gives every item its experience score
``s_exp``, the input of the augmented targets and the page-level reward (docs/methods/experience.md, steps 4-5).

The prompt x is one user turn: the cover image, then ``EXPMODEL_PROMPT`` filled with the item's
category and title (the annotator judges relevance against the category, so the model sees it
too). ``SCORE_MODES`` says what is scored: ``"query"`` scores an item *for a search query*,
s_{q,v} as docs/methods/experience.md, step 3 writes it: the query text closes the prompt (``QUERY_PROMPT``), SFT learns
the annotation of the (query, item) pair (relevance judged for the query), and PFT pairs are
formed per query from those annotations; ``"item"`` scores the item alone, for catalogues
without queries. A frame of annotations, pairs or scores is per (query, item) when it has the
``QUERY_COLUMN`` column, per item otherwise. The target y is the annotation as compact JSON with the analysis *first*, then the five
dimension scores and ``overall`` (``expmodel_target``): the reasoning precedes the verdict, so a
generated score is conditioned on the generated analysis; ``parse_annotation`` reads it back.

This module is the data side, without torch (pandas, numpy, PIL): prompts, targets, item splits,
preference pairs (``preference_pairs``, ``catalogue_pairs``) and their held-out splits, and the
settings of both stages (``EXPMODEL_TRAINING``, ``PFTOptions``), which the parameter check reads
before torch loads (``hooks.parameter_check``). The stages themselves are
``chain.expmodel.sft``, ``expmodel_pft`` and ``expmodel_scoring``.

Shape symbols: ``B`` sequences, ``T`` tokens (prompt + target, right-padded), ``N`` image
patches of a batch, ``D`` patch width (1176 for Qwen2.5-VL), ``H`` hidden width.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from creditflow.chain.annotation import DIMENSIONS, QUERY_COLUMN
from creditflow.chain.world.catalogue import FREQUENCY_BANDS
from creditflow.errors import ConfigError

EXPMODEL_PROMPT = (
    "Rate this item's cover and title for the viewing experience: write an analysis, then "
    "1-5 scores, as JSON.\nCategory: {category}\nTitle: {title}"
)
QUERY_PROMPT = "\nQuery: {query}"  # closes the prompt of an item scored for a query
ITEM_FIELDS = ("item_id", "category", "title", "image_png")
PAIR_COLUMNS = ("pos_item", "neg_item", "session_id")  # per query: QUERY_COLUMN first
CATALOGUE_PAIR_COLUMNS = ("pos_item", "neg_item")  # catalogue_pairs: no sessions, no queries
SCORE_COLUMNS = ("item_id", "s_exp")  # per query: QUERY_COLUMN first
# What the ExpModel scores (expmodel_sft.score_mode): an item for a query, or an item alone.
QUERY_MODE, ITEM_MODE = "query", "item"
SCORE_MODES = (QUERY_MODE, ITEM_MODE)
ITEM_SPLIT_COLUMNS = ("item_id", "split")
TRAIN, UNSEEN = "train", "unseen"  # the values of an item split's ``split`` column
# Annotated overall scores are rounded to 2 decimals (0.2 steps for the heuristic annotator):
# a difference meant to equal the margin must not fall below it by float rounding.
_MARGIN_TOLERANCE = 1e-9
# The chain's ``SupervisedConfig`` settings for ExpModel SFT and PFT, under the YAML's
# ``training`` keys (``SupervisedConfig.from_params(params, **EXPMODEL_TRAINING)``): AdamW at a
# constant learning rate without weight decay, gradients clipped to norm 1.0.
EXPMODEL_TRAINING = {"schedule": "constant", "weight_decay": 0.0, "max_grad_norm": 1.0}
# An SFT target holds at most this many characters of an annotation's analysis (the heuristic
# annotator's run to ~500, a served VLM's "few sentences" to fewer): a runaway one, megabytes
# from a misbehaving server or a hand-made table, would otherwise become a target of as many
# tokens. Longer ones are cut there.
MAX_TARGET_ANALYSIS_CHARS = 2000


# --- prompts and targets ----------------------------------------------------------------------


def expmodel_prompt(category: str, title: str, query: str | None = None) -> str:
    """The text part of the ExpModel's user turn (the image comes before it); for an item
    scored for ``query``, the query closes it.

    >>> expmodel_prompt("cooking", "Pasta tutorial", "pasta recipe").splitlines()[-2:]
    ['Title: Pasta tutorial', 'Query: pasta recipe']
    """
    text = EXPMODEL_PROMPT.format(category=category, title=title)
    return text if query is None else text + QUERY_PROMPT.format(query=query)


def check_score_mode(score_mode: str) -> str:
    """``score_mode`` if it is one of ``SCORE_MODES``, else a ValueError listing them."""
    if score_mode not in SCORE_MODES:
        raise ValueError(f"unknown score_mode {score_mode!r}; valid: {', '.join(SCORE_MODES)}")
    return score_mode


def is_per_query(frame: pd.DataFrame) -> bool:
    """Whether annotations, pairs or scores are per (query, item) (a ``QUERY_COLUMN``)."""
    return QUERY_COLUMN in frame.columns


def query_candidates(sessions: pd.DataFrame) -> pd.DataFrame:
    """``QUERY_COLUMN, item_id``: every distinct (query, candidate) of ``sessions``, in order
    of first appearance: what query mode annotates and scores.

    >>> frame = pd.DataFrame({"query_text": ["a", "b", "a"], "candidates": [[1, 2], [2], [2, 3]]})
    >>> query_candidates(frame).values.tolist()
    [['a', 1], ['a', 2], ['b', 2], ['a', 3]]
    """
    missing = [c for c in (QUERY_COLUMN, "candidates") if c not in sessions.columns]
    if missing:
        raise ValueError(f"sessions are missing columns {missing}; query mode needs the queries")
    if sessions[QUERY_COLUMN].isna().any():
        raise ValueError(
            "some sessions have no query text: score them per item (expmodel_sft.score_mode: item)"
        )
    rows = [
        (query, item)
        for query, candidates in zip(sessions[QUERY_COLUMN], sessions["candidates"], strict=True)
        for item in candidates
    ]
    return pd.DataFrame(list(dict.fromkeys(rows)), columns=[QUERY_COLUMN, "item_id"]).reset_index(
        drop=True
    )


def target_analysis(analysis: Any) -> str:
    """An annotation's analysis as an SFT target holds it: its first
    ``MAX_TARGET_ANALYSIS_CHARS`` characters.

    >>> len(target_analysis("Sharp. " * 1000)), target_analysis("Sharp.")
    (2000, 'Sharp.')
    """
    text = str(analysis)
    return (
        text
        if len(text) <= MAX_TARGET_ANALYSIS_CHARS
        else text[:MAX_TARGET_ANALYSIS_CHARS].rstrip()
    )


def expmodel_target(annotation: pd.Series | dict) -> str:
    """SFT target of one ``status == "ok"`` annotation row: compact JSON, analysis first (cut
    to ``MAX_TARGET_ANALYSIS_CHARS``).

    >>> row = {
    ...     "analysis": "Sharp.",
    ...     "sharpness": 5,
    ...     "exposure": 4,
    ...     "noise": 5,
    ...     "title_informativeness": 3,
    ...     "relevance": 4,
    ...     "overall": 4.2,
    ... }
    >>> expmodel_target(row)
    '{"analysis":"Sharp.","sharpness":5,"exposure":4,"noise":5,"title_informativeness":3,"relevance":4,"overall":4.2}'
    """
    payload = {"analysis": target_analysis(annotation["analysis"])}
    payload.update({d: int(annotation[d]) for d in DIMENSIONS})
    payload["overall"] = float(annotation["overall"])
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def _decode_image(image_png: bytes) -> Image.Image:
    with Image.open(io.BytesIO(image_png)) as image:
        return image.convert("RGB")


def _check_items(items_df: pd.DataFrame) -> None:
    missing = [c for c in ITEM_FIELDS if c not in items_df.columns]
    if missing:
        raise ValueError(f"items_df is missing columns {missing}; need {list(ITEM_FIELDS)}")
    if items_df["item_id"].duplicated().any():
        raise ValueError("items_df has repeated item_id values; one row per item is needed")


def ok_annotations(annotations_df: pd.DataFrame) -> pd.DataFrame:
    """The ``status == "ok"`` rows: failed annotations have no scores to learn or compare."""
    missing = [c for c in ("item_id", "status", "overall") if c not in annotations_df.columns]
    if missing:
        raise ValueError(f"annotations_df is missing columns {missing}")
    return annotations_df[annotations_df["status"] == "ok"]


# --- train / unseen items -----------------------------------------------------------------------


def split_items(item_ids: Sequence[Any], unseen_fraction: float, seed: int) -> pd.DataFrame:
    """Seeded split of the catalogue into the items the ExpModel trains on and unseen ones.

    SFT and PFT read only ``TRAIN`` items (``items_in_split``, ``pairs_within``); the
    evaluation measures ``s_exp`` on the ``UNSEEN`` ones, which no training step has
    seen: what s_exp is for is scoring items nobody annotated or paired.

    >>> dict(sorted(split_items([10, 11, 12, 13], 0.5, seed=0)["split"].value_counts().items()))
    {'train': 2, 'unseen': 2}

    Returns:
        ``ITEM_SPLIT_COLUMNS`` (``item_id``, ``split``) in ``item_ids`` order, exactly
        ``round(unseen_fraction * n)`` of them ``UNSEEN``.

    Raises:
        ValueError: a fraction outside [0, 1), repeated ids, or no training item left.
    """
    ids = list(item_ids)
    if type(unseen_fraction) not in (int, float) or not 0 <= unseen_fraction < 1:
        raise ValueError(f"unseen_fraction must lie in [0, 1), got {unseen_fraction!r}")
    if len(set(ids)) != len(ids):
        raise ValueError("item_ids has repeats; one row per item is needed")
    n_unseen = round(unseen_fraction * len(ids))
    if ids and n_unseen == len(ids):
        raise ValueError(f"unseen_fraction {unseen_fraction} leaves no training item; lower it")
    unseen = np.zeros(len(ids), dtype=bool)
    unseen[np.random.default_rng(seed).permutation(len(ids))[:n_unseen]] = True
    return pd.DataFrame(
        {"item_id": ids, "split": np.where(unseen, UNSEEN, TRAIN)}, columns=list(ITEM_SPLIT_COLUMNS)
    )


def split_ids(item_split: pd.DataFrame, split: str) -> set[Any]:
    """The ids of ``item_split`` (``split_items`` output) in ``split`` (``TRAIN`` or ``UNSEEN``)."""
    if split not in (TRAIN, UNSEEN):
        raise ValueError(f"unknown split {split!r}; valid: {TRAIN}, {UNSEEN}")
    missing = [c for c in ITEM_SPLIT_COLUMNS if c not in item_split.columns]
    if missing:
        raise ValueError(f"item_split is missing columns {missing}; build it with split_items")
    return set(item_split.loc[item_split["split"] == split, "item_id"])


def items_in_split(items_df: pd.DataFrame, item_split: pd.DataFrame, split: str) -> pd.DataFrame:
    """The rows of ``items_df`` whose item is in ``split`` of ``item_split``."""
    return items_df[items_df["item_id"].isin(split_ids(item_split, split))]


def pairs_within(pairs_df: pd.DataFrame, item_ids: set[Any]) -> pd.DataFrame:
    """The pairs whose two items are both in ``item_ids`` (a mixed pair would leak the other
    side into training, or train on it in an evaluation)."""
    inside = pairs_df["pos_item"].isin(item_ids) & pairs_df["neg_item"].isin(item_ids)
    return pairs_df[inside].reset_index(drop=True)


# --- stage II: preference pairs and PFT ---------------------------------------------------------


def preference_pairs(
    sessions_df: pd.DataFrame,
    annotations_df: pd.DataFrame,
    margin: float = 1.0,
    bands: Sequence[str] = ("tail",),
    max_pairs: int | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """docs/methods/experience.md, step 3: ordered pairs (A > B) of candidates under long-tail queries.

    Within each session whose ``query_frequency_band`` is in ``bands``, every ordered pair of
    candidates with ok annotations and ``overall(A) - overall(B) >= margin`` is a pair
    ``(pos_item=A, neg_item=B)``. A pair met in several sessions is kept once, with its first
    ``session_id``. Above ``max_pairs`` a seeded uniform sample is kept.

    With annotations per (query, item) (a ``QUERY_COLUMN``), ``overall`` is the session's
    query's annotation of each candidate, so A > B holds *for that query*: the pairs carry the
    query, and the same two items may pair one way under one query and the other way (or not at
    all) under another. A pair is then kept once per query.

    Args:
        sessions_df: ``generate_sessions`` frame (reads ``session_id``,
            ``query_frequency_band``, ``candidates``, and ``query_text`` for per-query
            annotations).
        annotations_df: annotator output, per item or per (query, item); failed rows are
            ignored.
        margin: least gap of annotated ``overall`` (1-5 scale), > 0 so ties never pair.
        bands: which query bands to take pairs from, a subset of ``FREQUENCY_BANDS``.
        max_pairs: cap on the number of pairs (None: all).
        seed: seed of the sample.

    Returns:
        ``PAIR_COLUMNS`` (``pos_item, neg_item, session_id``; ``QUERY_COLUMN`` first with
        per-query annotations), sorted by session, then ``pos_item``, then ``neg_item``.
    """
    unknown = sorted(set(bands) - set(FREQUENCY_BANDS))
    if unknown or not bands:
        raise ValueError(f"unknown bands {unknown or list(bands)}; valid: {list(FREQUENCY_BANDS)}")
    if not margin > 0:
        raise ValueError(f"margin must be > 0 (0 would pair ties both ways), got {margin}")
    if max_pairs is not None and max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1 or None, got {max_pairs}")
    per_query = is_per_query(annotations_df)
    if per_query and QUERY_COLUMN not in sessions_df.columns:
        raise ValueError(f"per-query annotations need sessions with {QUERY_COLUMN!r}")
    keys = [QUERY_COLUMN, "item_id"] if per_query else ["item_id"]
    ok = ok_annotations(annotations_df).drop_duplicates(keys)
    # (query, item) -> overall; the query is None for per-item annotations.
    queries = ok[QUERY_COLUMN] if per_query else [None] * len(ok)
    overall = dict(zip(zip(queries, ok["item_id"], strict=True), ok["overall"], strict=True))
    selected = sessions_df[sessions_df["query_frequency_band"].isin(bands)]
    seen: set[tuple[Any, Any, Any]] = set()
    rows = []
    for session in selected.sort_values("session_id").to_dict("records"):
        query = session[QUERY_COLUMN] if per_query else None
        candidates = [c for c in dict.fromkeys(session["candidates"]) if (query, c) in overall]
        scores = np.array([overall[query, c] for c in candidates], dtype=np.float64)  # (L',)
        better = scores[:, None] - scores[None, :] >= margin - _MARGIN_TOLERANCE  # (L', L')
        for i, j in zip(*np.nonzero(better), strict=True):
            pair = (query, candidates[i], candidates[j])
            if pair not in seen:
                seen.add(pair)
                rows.append((*pair, session["session_id"]))
    columns = [QUERY_COLUMN, *PAIR_COLUMNS]
    pairs = pd.DataFrame(rows, columns=columns)
    if not per_query:
        pairs = pairs.drop(columns=QUERY_COLUMN)
    if max_pairs is not None and len(pairs) > max_pairs:
        keep = np.random.default_rng(seed).choice(len(pairs), size=max_pairs, replace=False)
        pairs = pairs.iloc[np.sort(keep)]
    return pairs.sort_values(["session_id", "pos_item", "neg_item"]).reset_index(drop=True)


def catalogue_pairs(
    annotations: pd.DataFrame, margin: float = 0.5, max_pairs: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """Ordered pairs (A > B) of annotated items with ``overall(A) - overall(B) >= margin``.

    Without queries or sessions to pair within (docs/methods/experience.md, step 3 pairs candidates of one query), pairs
    come from the whole annotated catalogue, oriented better-first, each unordered pair once:
    seeded uniform draws of two distinct items, kept when their gap reaches ``margin``, until
    ``max_pairs``; when that is half or more of all such pairs, a seeded sample of all of them
    instead (rejection would take long to find the last ones). Fewer pairs when the catalogue
    has fewer.

    Returns:
        ``CATALOGUE_PAIR_COLUMNS`` (``pos_item``, ``neg_item``) in draw order.
    """
    if not margin > 0:
        raise ValueError(f"margin must be > 0 (0 would pair ties both ways), got {margin}")
    if isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1:
        raise ValueError(f"max_pairs must be an int >= 1, got {max_pairs!r}")
    ok = ok_annotations(annotations).drop_duplicates("item_id")
    ids, scores = ok["item_id"].to_numpy(), ok["overall"].to_numpy(dtype=np.float64)
    gaps = np.abs(scores[:, None] - scores[None, :]) >= margin - _MARGIN_TOLERANCE  # (I, I)
    n_possible = int(np.triu(gaps, k=1).sum())
    target = min(max_pairs, n_possible)
    rng = np.random.default_rng(seed)
    if 2 * target >= n_possible:
        first, second = np.nonzero(np.triu(gaps, k=1))  # every pair once, i < j
        keep = np.sort(rng.permutation(n_possible)[:target])
        return pd.DataFrame(
            [_oriented(ids, scores, i, j) for i, j in zip(first[keep], second[keep], strict=True)],
            columns=list(CATALOGUE_PAIR_COLUMNS),
        )
    seen: set[tuple[int, int]] = set()
    rows = []
    while len(rows) < target:
        i, j = rng.choice(len(ids), size=2, replace=False)
        key = (min(i, j), max(i, j))
        if not gaps[i, j] or key in seen:
            continue
        seen.add(key)
        rows.append(_oriented(ids, scores, i, j))
    return pd.DataFrame(rows, columns=list(CATALOGUE_PAIR_COLUMNS))


def _oriented(ids: np.ndarray, scores: np.ndarray, i: int, j: int) -> tuple[Any, Any]:
    """``(pos_item, neg_item)`` of items ``i`` and ``j``: the higher teacher score first."""
    return (ids[i], ids[j]) if scores[i] > scores[j] else (ids[j], ids[i])


def split_pairs(
    pairs_df: pd.DataFrame,
    heldout_fraction: float,
    seed: int,
    heldout_split: str = "items",
    known_items: Sequence[Any] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(train_pairs, heldout_pairs)`` of ``pairs_df`` by ``HELDOUT_SPLITS[heldout_split]``.

    Raises:
        ValueError: an unknown split, a fraction outside [0, 1), missing columns, items not
            in ``known_items`` (when given) or no training pair left.
    """
    if heldout_split not in HELDOUT_SPLITS:
        raise ValueError(
            f"unknown heldout_split {heldout_split!r}; valid: {', '.join(sorted(HELDOUT_SPLITS))}"
        )
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must lie in [0, 1), got {heldout_fraction}")
    missing = [c for c in ("pos_item", "neg_item") if c not in pairs_df.columns]
    if missing:
        raise ValueError(f"pairs_df is missing columns {missing}; build it with preference_pairs")
    if known_items is not None:
        named = set(pairs_df["pos_item"]) | set(pairs_df["neg_item"])
        unknown = sorted(named - set(known_items))
        if unknown:
            raise ValueError(f"pairs_df names items missing from items_df: {unknown[:10]}")
    train_rows, heldout_rows = HELDOUT_SPLITS[heldout_split](
        pairs_df, heldout_fraction, np.random.default_rng(seed)
    )
    train_pairs = pairs_df.iloc[np.sort(train_rows)].reset_index(drop=True)
    heldout_pairs = pairs_df.iloc[np.sort(heldout_rows)].reset_index(drop=True)
    if train_pairs.empty:
        raise ValueError(f"no training pair left of {len(pairs_df)}: lower heldout_fraction")
    return train_pairs, heldout_pairs


def pair_units(pairs_df: pd.DataFrame) -> pd.DataFrame:
    """``QUERY_COLUMN, item_id``: the distinct (query, item) of per-query pairs, both sides."""
    sides = [
        pairs_df[[QUERY_COLUMN, side]].set_axis([QUERY_COLUMN, "item_id"], axis=1)
        for side in ("pos_item", "neg_item")
    ]
    return pd.concat(sides).drop_duplicates().reset_index(drop=True)


# --- helpers ------------------------------------------------------------------------------------


def _queries_of(pairs_df: pd.DataFrame) -> list[Any]:
    """The query of each pair (None for per-item pairs)."""
    if is_per_query(pairs_df):
        return pairs_df[QUERY_COLUMN].tolist()
    return [None] * len(pairs_df)


def _split_by_pairs(
    pairs_df: pd.DataFrame, heldout_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``round(heldout_fraction * n)`` random pairs held out; their items may also be trained on."""
    permutation = rng.permutation(len(pairs_df))
    n_heldout = round(heldout_fraction * len(pairs_df))
    return permutation[n_heldout:], permutation[:n_heldout]


def _split_by_items(
    pairs_df: pd.DataFrame, heldout_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``round(heldout_fraction * n_items)`` random items held out: a pair of two held-out items
    is held out, a pair of two others trains, a mixed pair is dropped (it would leak)."""
    items = pd.unique(pairs_df[["pos_item", "neg_item"]].to_numpy().ravel())
    n_heldout = round(heldout_fraction * len(items))
    heldout_items = set(items[rng.permutation(len(items))[:n_heldout]].tolist())
    pos_out = pairs_df["pos_item"].isin(heldout_items).to_numpy()
    neg_out = pairs_df["neg_item"].isin(heldout_items).to_numpy()
    return np.flatnonzero(~pos_out & ~neg_out), np.flatnonzero(pos_out & neg_out)


# How train_expmodel_pft holds pairs out: name -> (pairs, fraction, rng) -> (train, held-out) rows.
HELDOUT_SPLITS = {"items": _split_by_items, "pairs": _split_by_pairs}


@dataclass(frozen=True)
class PFTOptions:
    """What PFT trains on and how, beside its ``SupervisedConfig``.

    lam: weight of the centring term ``mean((s+ + s-)^2)`` (>= 0).
    heldout_fraction: share held out, in [0, 1); 0 gives no held-out metric.
    heldout_split: what ``heldout_fraction`` is a share of (``HELDOUT_SPLITS``): ``"items"``
        holds out items and evaluates on pairs of two unseen items, dropping pairs that mix the
        two sides; this measures what ``s_exp`` is for, scoring items without pairs.
        ``"pairs"`` holds out pairs; their items are mostly trained on through other pairs, so
        it mostly measures how well the scores of seen items fit.
    train_backbone: True trains every parameter; False only the head, the last decoder layer
        and the final norm (``ExpScorer.parameters_to_train``), which skips the backward pass
        through the vision tower: the fast option for smoke runs.
    """

    lam: float = 0.01
    heldout_fraction: float = 0.2
    heldout_split: str = "items"
    train_backbone: bool = True

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> PFTOptions:
        """The options of a ``parameters_*.yml`` block; ConfigError on an unknown key."""
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise ConfigError(f"unknown PFT option(s) {unknown}; valid keys are {valid}")
        return cls(**params)

    def __post_init__(self) -> None:
        if type(self.lam) not in (int, float) or self.lam < 0:
            raise ConfigError(f"lam must be a number >= 0, got {self.lam!r}")
        if type(self.heldout_fraction) not in (int, float) or not 0 <= self.heldout_fraction < 1:
            raise ConfigError(f"heldout_fraction must lie in [0, 1), got {self.heldout_fraction!r}")
        if self.heldout_split not in HELDOUT_SPLITS:
            raise ConfigError(
                f"unknown heldout_split {self.heldout_split!r}; valid: "
                f"{', '.join(sorted(HELDOUT_SPLITS))}"
            )
        if not isinstance(self.train_backbone, bool):
            raise ConfigError(f"train_backbone must be true or false, got {self.train_backbone!r}")
