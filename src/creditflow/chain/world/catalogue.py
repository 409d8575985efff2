"""Seeded short-video catalogue and click-biased search logs for the experience model (docs/methods/experience.md).

The paper (arXiv 2603.24975) learns an "experience score" that historical clicks do not
pollute. This module builds a world where that matters: every item has a hidden true quality
that shows in its cover pixels and its title, while the logged production ranker and the users'
clicks follow popularity and click-bait instead.

Hidden variables, drawn per item, each in [0, 1] with 1 the best experience (so
``true_noise = 1`` means a clean image):

- ``true_sharpness``: the cover is Gaussian-blurred with radius ``BLUR_MAX_RADIUS * (1 - s)``.
- ``true_exposure``: every pixel is shifted by ``+-EXPOSURE_MAX_SHIFT * (1 - e)`` grey levels
  (sign drawn per item: over- or under-exposed), then clipped to [0, 255].
- ``true_noise``: Gaussian pixel noise with std ``NOISE_MAX_STD * (1 - n)`` is added last.
- ``true_title_informativeness``: the chance that a title word is a specific one (a word of a
  category's vocabulary or a descriptor such as "tutorial") rather than a vague filler ("this",
  "stuff").
- ``true_relevance``: how on-topic the item is for its own category: the cover's category glyph
  is large and alone when high, small among glyphs of other categories when low, and the title's
  topical words come from the item's own category with probability ``0.2 + 0.8 * r``.
- ``true_quality = sum_d QUALITY_WEIGHTS[d] * true_d``, the overall experience in [0, 1].
- ``true_clickbait`` (click-bait appeal) is drawn independently of every quality variable: it adds
  a "you won't believe"-style prefix, a trailing "!!!" and an all-caps title, each with
  probability ``true_clickbait``. ``popularity`` (log-normal) is independent of quality too.

Sessions (``generate_sessions``) are ranked by a :class:`LoggingRanker` that follows popularity
and click-bait; users react through a :class:`ClickModel` (exposure depth, position bias,
clicks, long views), which also scores any other page in the simulated online A/B
(``candidate_response``, ``ClickModel.position_weights``).

Rankers and annotators must read only ``item_id, category, title, image_png`` and
``popularity``; every ``true_*`` column is for building the world and evaluating against it.
Titles are ASCII only (no emoji), so every tokenizer reads them the same way.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw, ImageFilter

# --- catalogue ---------------------------------------------------------------------------------

DEFAULT_CATEGORIES = ("cooking", "travel", "fitness", "pets", "gaming", "music", "diy", "beauty")

# Topical words per category: disjoint across categories, so a word names one topic. Categories
# outside this table get the generic vocabulary "<category> <category>s".
CATEGORY_VOCABULARY: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "cooking": tuple(
            "pasta recipe sourdough kitchen skillet roast dumplings ramen baking garlic".split()
        ),
        "travel": tuple(
            "hiking beach itinerary backpacking hostel island mountains roadtrip passport sunset".split()
        ),
        "fitness": tuple(
            "workout squat deadlift cardio stretching yoga protein running kettlebell pushups".split()
        ),
        "pets": tuple(
            "puppy kitten grooming leash aquarium parrot hamster adoption vet fetch".split()
        ),
        "gaming": tuple(
            "speedrun boss walkthrough controller multiplayer platformer loot esports console raid".split()
        ),
        "music": tuple(
            "guitar chords piano drummer vinyl melody synth bassline acoustic vocals".split()
        ),
        "diy": tuple(
            "woodworking drill shelf plywood sanding workbench repair tiles soldering furniture".split()
        ),
        "beauty": tuple(
            "skincare makeup eyeliner serum moisturizer haircut nails lipstick curls sunscreen".split()
        ),
    }
)
# Informative but not topical: they say what kind of video it is.
DESCRIPTOR_WORDS = tuple(
    "tutorial beginner guide review quick budget advanced explained tips comparison".split()
)
# Vague words that say nothing about the content.
FILLER_WORDS = tuple(
    "this thing stuff something moment video just really so what happened look".split()
)
CLICKBAIT_PREFIXES = ("you won't believe", "WOW!!!", "wait for it...", "nobody expected")

QUALITY_DIMENSIONS = ("sharpness", "exposure", "noise", "title_informativeness", "relevance")
# Weights of the overall true quality; they sum to 1 so true_quality stays in [0, 1].
QUALITY_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {
        "sharpness": 0.25,
        "exposure": 0.2,
        "noise": 0.15,
        "title_informativeness": 0.2,
        "relevance": 0.2,
    }
)
HIDDEN_COLUMNS = (
    *(f"true_{d}" for d in QUALITY_DIMENSIONS),
    "true_quality",
    "true_clickbait",
)
CATALOGUE_COLUMNS = ("item_id", "category", "title", "image_png", "popularity", *HIDDEN_COLUMNS)

BLUR_MAX_RADIUS = 3.0  # Gaussian blur radius (pixels at 96 px, scaled with image_size) at s = 0
EXPOSURE_MAX_SHIFT = 110.0  # grey levels added or removed at e = 0
NOISE_MAX_STD = 8.0  # std of the added pixel noise (grey levels) at n = 0
MIN_IMAGE_SIZE = 32
_REFERENCE_SIZE = 96  # size at which the pixel constants above are stated

# Mid-tone RGB per glyph slot (category index mod 8): far from black and white, so exposure
# shifts, not the palette, decide the clipping.
_PALETTE = (
    (196, 92, 72),
    (72, 140, 196),
    (96, 170, 96),
    (200, 160, 70),
    (150, 100, 180),
    (70, 170, 170),
    (170, 120, 80),
    (200, 110, 150),
)
_GLYPHS = ("circle", "square", "triangle", "diamond", "star", "cross", "ring", "hexagon")
# The glyph colour of each default category: what an annotator looks for on a cover to judge
# relevance (annotation.heuristic), as CATEGORY_VOCABULARY is what it looks for in a title.
CATEGORY_COLOURS: Mapping[str, tuple[int, int, int]] = MappingProxyType(
    {c: _PALETTE[i % len(_PALETTE)] for i, c in enumerate(DEFAULT_CATEGORIES)}
)


def generate_catalogue(
    n_items: int,
    seed: int = 0,
    image_size: int = 96,
    categories: Sequence[str] = DEFAULT_CATEGORIES,
) -> pd.DataFrame:
    """Draw ``n_items`` short videos with a rendered cover, a title and hidden true quality.

    Item ``i`` draws from ``np.random.default_rng([seed, i])``, so the first ``n`` items do not
    depend on ``n_items`` and the frame is identical across runs and machines.

    Args:
        n_items: number of items (>= 0).
        seed: seed of the catalogue.
        image_size: side of the square PNG cover in pixels (>= 32).
        categories: topic names, no repeats; each item's category is uniform over them. Names in
            ``CATEGORY_VOCABULARY`` get its topical words; others get ``"<name> <name>s"``.

    Returns:
        DataFrame with columns ``CATALOGUE_COLUMNS``: ``item_id`` (int, 0..n_items-1),
        ``category``, ``title`` (ASCII), ``image_png`` (PNG bytes, RGB), ``popularity``
        (float > 0, log-normal) and the hidden ``HIDDEN_COLUMNS`` described in the module
        docstring (floats in [0, 1]).
    """
    if isinstance(n_items, bool) or not isinstance(n_items, int) or n_items < 0:
        raise ValueError(f"n_items must be a non-negative int, got {n_items!r}")
    if not isinstance(image_size, int) or image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be an int >= {MIN_IMAGE_SIZE}, got {image_size!r}")
    categories = tuple(categories)
    if not categories or len(set(categories)) != len(categories):
        raise ValueError(f"categories must be non-empty without repeats, got {list(categories)}")
    rows = [_draw_item(i, seed, image_size, categories) for i in range(n_items)]
    return pd.DataFrame(rows, columns=list(CATALOGUE_COLUMNS))


def category_vocabulary(category: str) -> tuple[str, ...]:
    """Topical title words of ``category`` (see ``CATEGORY_VOCABULARY``)."""
    return CATEGORY_VOCABULARY.get(category, (category, f"{category}s"))


def _draw_item(index: int, seed: int, size: int, categories: tuple[str, ...]) -> dict:
    rng = np.random.default_rng([seed, index])
    category_index = int(rng.integers(len(categories)))
    true = {d: float(rng.uniform()) for d in QUALITY_DIMENSIONS}
    clickbait = float(rng.uniform())
    popularity = float(rng.lognormal(mean=0.0, sigma=1.0))
    title = _render_title(rng, categories, category_index, true, clickbait)
    cover = _render_cover(rng, size, len(categories), category_index, true)
    quality = sum(QUALITY_WEIGHTS[d] * true[d] for d in QUALITY_DIMENSIONS)
    return {
        "item_id": index,
        "category": categories[category_index],
        "title": title,
        "image_png": _to_png(cover),
        "popularity": popularity,
        **{f"true_{d}": v for d, v in true.items()},
        "true_quality": float(min(max(quality, 0.0), 1.0)),
        "true_clickbait": clickbait,
    }


def _render_title(
    rng: np.random.Generator,
    categories: tuple[str, ...],
    category_index: int,
    true: Mapping[str, float],
    clickbait: float,
) -> str:
    specific = 0.05 + 0.9 * true["title_informativeness"]
    on_topic = 0.2 + 0.8 * true["relevance"]
    others = [c for j, c in enumerate(categories) if j != category_index]
    words = []
    for _ in range(int(rng.integers(4, 8))):
        if rng.uniform() >= specific:
            words.append(_pick(rng, FILLER_WORDS))
        elif rng.uniform() < 0.3:
            words.append(_pick(rng, DESCRIPTOR_WORDS))
        else:
            own = not others or rng.uniform() < on_topic
            topic = categories[category_index] if own else _pick(rng, others)
            words.append(_pick(rng, category_vocabulary(topic)))
    title = " ".join(words)
    title = title[0].upper() + title[1:]
    # Each click-bait marker independently with probability ``clickbait``: the appeal shows
    # in the text without touching any quality variable.
    if rng.uniform() < clickbait:
        title = f"{_pick(rng, CLICKBAIT_PREFIXES)} {title}"
    if rng.uniform() < clickbait:
        title += "!!!"
    if rng.uniform() < clickbait:
        title = title.upper()
    return title


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _render_cover(
    rng: np.random.Generator,
    size: int,
    n_categories: int,
    category_index: int,
    true: Mapping[str, float],
) -> Image.Image:
    """Clean cover (background, striped texture, blocks, category glyph), then the degradations."""
    scale = size / _REFERENCE_SIZE
    base = np.array(_PALETTE[category_index % len(_PALETTE)])
    background = tuple(int(v) for v in np.clip(base * 0.55 + rng.normal(0, 8, 3) + 40, 0, 255))
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    # Axis-aligned stripes and blocks give the cover fine, high-contrast detail for blur to
    # erase; being axis-aligned they leave the noise estimate of annotators (a separable
    # second-difference filter) untouched.
    x0, y0 = (int(v) for v in rng.integers(0, size // 3, 2))
    x1, y1 = (int(v) for v in rng.integers(2 * size // 3, size, 2))
    period = max(2, round(2 * scale))
    dark = tuple(int(v) for v in rng.integers(30, 70, 3))
    light = tuple(int(v) for v in rng.integers(180, 225, 3))
    draw.rectangle([x0, y0, x1, y1], fill=light)
    vertical = rng.uniform() < 0.5
    for offset in range(0, (x1 - x0) if vertical else (y1 - y0), 2 * period):
        if vertical:
            draw.rectangle([x0 + offset, y0, x0 + offset + period - 1, y1], fill=dark)
        else:
            draw.rectangle([x0, y0 + offset, x1, y0 + offset + period - 1], fill=dark)
    for _ in range(int(rng.integers(3, 7))):
        bx, by = (int(v) for v in rng.integers(0, size - 8, 2))
        bw, bh = (int(v) for v in rng.integers(6, size // 4, 2))
        draw.rectangle([bx, by, bx + bw, by + bh], fill=_mid_colour(rng))
    # Relevance: a large lone glyph of the item's category, or a small one among distractors.
    relevance = true["relevance"]
    for _ in range(round((1 - relevance) * 3)):
        other = int(rng.integers(n_categories))
        cx, cy = (float(v) for v in rng.uniform(0.15 * size, 0.85 * size, 2))
        _draw_glyph(draw, other, cx, cy, 0.12 * size)
    glyph_radius = (0.15 + 0.2 * relevance) * size
    _draw_glyph(draw, category_index, size / 2, size / 2, glyph_radius)

    radius = BLUR_MAX_RADIUS * scale * (1 - true["sharpness"])
    if radius > 0.05:
        image = image.filter(ImageFilter.GaussianBlur(radius))
    pixels = np.asarray(image, dtype=np.float64)
    sign = 1.0 if rng.uniform() < 0.5 else -1.0
    pixels = np.clip(pixels + sign * EXPOSURE_MAX_SHIFT * (1 - true["exposure"]), 0, 255)
    pixels = pixels + rng.normal(0.0, NOISE_MAX_STD * (1 - true["noise"]), pixels.shape)
    return Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "RGB")


def _mid_colour(rng: np.random.Generator) -> tuple[int, int, int]:
    return tuple(int(v) for v in rng.integers(50, 206, 3))


def _draw_glyph(draw: ImageDraw.ImageDraw, category_index: int, cx: float, cy: float, r: float):
    """Category ``category_index``'s shape (mod 8) in its palette colour, dark outline."""
    shape = _GLYPHS[category_index % len(_GLYPHS)]
    fill = _PALETTE[category_index % len(_PALETTE)]
    outline = (30, 30, 30)
    box = [cx - r, cy - r, cx + r, cy + r]
    if shape == "circle":
        draw.ellipse(box, fill=fill, outline=outline, width=2)
    elif shape == "square":
        draw.rectangle(box, fill=fill, outline=outline, width=2)
    elif shape == "ring":
        draw.ellipse(box, outline=fill, width=max(2, round(r / 3)))
    elif shape == "cross":
        w = r / 3
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)
    else:
        corners = {"triangle": 3, "diamond": 4, "hexagon": 6, "star": 10}[shape]
        points = []
        for k in range(corners):
            angle = 2 * math.pi * k / corners - math.pi / 2
            reach = r * (0.45 if shape == "star" and k % 2 else 1.0)
            points.append((cx + reach * math.cos(angle), cy + reach * math.sin(angle)))
        draw.polygon(points, fill=fill, outline=outline)


def _to_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)  # speed over size
    return buffer.getvalue()


def decode_png(image_png: bytes) -> np.ndarray:
    """PNG bytes -> ``(H, W, 3)`` uint8 RGB array."""
    with Image.open(io.BytesIO(image_png)) as image:
        return np.asarray(image.convert("RGB"), dtype=np.uint8)


# --- queries and biased logs -------------------------------------------------------------------

FREQUENCY_BANDS = ("head", "torso", "tail")
SESSION_COLUMNS = (
    "session_id",
    "query_id",
    "query_text",
    "query_frequency_band",
    "candidates",
    "logged_order",
    "labels",
    "clicks",
    "long_views",
    "relevance",
    "true_quality",
)
LABEL_CLICKED, LABEL_EXPOSED, LABEL_UNEXPOSED = "C", "E", "U"


def _check_finite(config: object, skip: Sequence[str] = ()) -> None:
    for field in fields(config):
        value = getattr(config, field.name)
        if field.name not in skip and not math.isfinite(value):
            raise ValueError(f"{field.name} must be finite, got {value}")


@dataclass(frozen=True)
class LoggingRanker:
    """The logged production ranker: it orders a session's candidates by
    ``popularity * z_pop + clickbait * z_clickbait + N(0, noise^2)`` (z-scores over the
    catalogue of ``log(popularity)`` and ``true_clickbait``). It never sees quality, and it
    follows what drives clicks (:class:`ClickModel`), so it is a strong click baseline."""

    popularity: float = 1.0
    clickbait: float = 1.0
    noise: float = 0.5

    def __post_init__(self) -> None:
        _check_finite(self)
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0, got {self.noise}")


@dataclass(frozen=True)
class ClickModel:
    """How simulated users react to a page: exposure, position-biased clicks and long views.

    The same model draws the logged clicks (``generate_sessions``) and scores any other page in
    the simulated A/B (``expected_feedback`` / ``sample_feedback`` via ``position_weights``),
    so a new ranker is judged by the clicks it would get, not by the clicks the old order got.

    A user scrolls to a depth ``D`` drawn uniformly from ``exposure_depth`` (inclusive; positions
    ``p >= D``, 0-based, stay unexposed). An exposed candidate at position ``p`` is examined
    with probability ``(p + 1) ** -position_bias`` and, examined, clicked with probability
    ``click_probability = sigmoid(intercept + popularity * z_pop + clickbait * z_clickbait
    + quality * z_quality + relevance * (r - 0.5))``, where the z-scores are over the catalogue
    (``log(popularity)``, ``true_clickbait``, ``true_quality``) and ``r`` is the query-item
    relevance in [0, 1]. A click becomes a long view with probability
    ``long_view_probability = sigmoid(long_view_intercept + long_view_quality * z_quality
    + long_view_relevance * (r - 0.5))``: quality shows mainly after the click.

    So ``P(click at p) = position_weights[p] * click_probability`` with
    ``position_weights[p] = P(D > p) * (p + 1) ** -position_bias``, and
    ``P(long view at p) = P(click at p) * long_view_probability``: the expectations of any page
    are exact sums over positions.
    """

    exposure_depth: tuple[int, int] = (4, 12)
    position_bias: float = 1.0
    intercept: float = -0.5
    popularity: float = 1.0
    clickbait: float = 1.2
    quality: float = 0.2
    relevance: float = 1.0
    long_view_intercept: float = -1.0
    long_view_quality: float = 1.0
    long_view_relevance: float = 2.0

    def __post_init__(self) -> None:
        lo, hi = self.exposure_depth
        if not 1 <= lo <= hi:
            raise ValueError(f"exposure_depth must be (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
        _check_finite(self, skip=("exposure_depth",))
        if self.position_bias < 0:
            raise ValueError(f"position_bias must be >= 0, got {self.position_bias}")

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> ClickModel:
        """The model of a ``click_model`` parameter block (``exposure_depth`` as a list)."""
        values = dict(params)
        if "exposure_depth" in values:
            values["exposure_depth"] = tuple(values["exposure_depth"])
        return cls(**values)

    def replace(self, **changes: object) -> ClickModel:
        """A copy with ``changes`` (e.g. another ``quality`` weight for a sweep)."""
        return dataclasses.replace(self, **changes)

    def exposure(self, length: int) -> np.ndarray:
        """``(L,)`` ``P(D > p)``: the chance that position ``p`` is exposed.

        >>> ClickModel(exposure_depth=(1, 2)).exposure(3)  # D is 1 or 2
        array([1. , 0.5, 0. ])
        """
        lo, hi = self.exposure_depth
        depths = np.arange(lo, hi + 1)  # (n_depths,) equally likely
        return (depths[None, :] > np.arange(length)[:, None]).mean(axis=1)

    def examination(self, length: int) -> np.ndarray:
        """``(L,)`` ``(p + 1) ** -position_bias``: the chance an exposed position is examined."""
        return (np.arange(length) + 1.0) ** -self.position_bias

    def position_weights(self, length: int) -> np.ndarray:
        """``(L,)`` ``P(exposed and examined at p)``: non-increasing in ``p``."""
        return self.exposure(length) * self.examination(length)

    def click_probability(
        self,
        z_popularity: np.ndarray,
        z_clickbait: np.ndarray,
        z_quality: np.ndarray,
        relevance: np.ndarray,
    ) -> np.ndarray:
        """``P(click | examined)`` per candidate, arrays of one shape."""
        return _sigmoid(
            self.intercept
            + self.popularity * z_popularity
            + self.clickbait * z_clickbait
            + self.quality * z_quality
            + self.relevance * (relevance - 0.5)
        )

    def long_view_probability(self, z_quality: np.ndarray, relevance: np.ndarray) -> np.ndarray:
        """``P(long view | click)`` per candidate, rising with quality and relevance."""
        return _sigmoid(
            self.long_view_intercept
            + self.long_view_quality * z_quality
            + self.long_view_relevance * (relevance - 0.5)
        )


def candidate_response(
    sessions: pd.DataFrame, catalogue: pd.DataFrame, click_model: ClickModel
) -> tuple[np.ndarray, np.ndarray]:
    """``(click_probability (N, L), long_view_probability (N, L))`` of every session's
    candidates under ``click_model``: what the simulated users would do with each candidate,
    wherever a page puts it (``ClickModel``; ``sessions`` from ``generate_sessions``, reading
    ``candidates`` and the stored per-candidate ``relevance``; z-scores over ``catalogue``).
    Hidden ground truth: for simulating feedback and evaluating, never a ranker input.

    Raises:
        ValueError: sessions of different lengths, or candidates missing from ``catalogue``.
    """
    lengths = {len(c) for c in sessions["candidates"]}
    if len(lengths) > 1:
        raise ValueError(f"sessions must all have the same length, got lengths {sorted(lengths)}")
    items = _ItemFeatures.of(catalogue)
    row_of = pd.Series(np.arange(len(items.item_id)), index=items.item_id)
    candidates = np.array([list(c) for c in sessions["candidates"]], dtype=np.int64)
    missing = sorted(set(candidates.ravel()) - set(row_of.index))
    if missing:
        raise ValueError(f"candidates {missing[:5]} are not in the catalogue")
    rows = row_of.loc[candidates.ravel()].to_numpy().reshape(candidates.shape)  # (N, L)
    relevance = np.array([list(r) for r in sessions["relevance"]], dtype=np.float64)
    relevance = relevance.reshape(candidates.shape)
    click = click_model.click_probability(
        items.z_popularity[rows], items.z_clickbait[rows], items.z_quality[rows], relevance
    )
    long_view = click_model.long_view_probability(items.z_quality[rows], relevance)
    return click, long_view


def zipf_probabilities(n_queries: int, exponent: float) -> np.ndarray:
    """``(n_queries,)`` traffic share of each query: ``p_r ∝ (r + 1) ** -exponent``, r = query_id."""
    weights = np.arange(1, n_queries + 1, dtype=np.float64) ** -exponent
    return weights / weights.sum()


def frequency_bands(
    probabilities: np.ndarray, band_cuts: tuple[float, float] = (1 / 3, 2 / 3)
) -> list[str]:
    """Label queries, given in descending frequency, ``head``/``torso``/``tail`` by traffic.

    A query is ``head`` when the traffic of the more frequent queries before it is below
    ``band_cuts[0]``, ``torso`` when it is below ``band_cuts[1]``, else ``tail``: with the
    default cuts each band carries about a third of the traffic, so a handful of queries make
    the head and most queries the tail.

    >>> frequency_bands(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    ['head', 'torso', 'tail', 'tail', 'tail']
    """
    before = np.concatenate([[0.0], np.cumsum(probabilities)[:-1]])
    return ["head" if b < band_cuts[0] else "torso" if b < band_cuts[1] else "tail" for b in before]


def generate_sessions(
    catalogue: pd.DataFrame,
    n_queries: int,
    n_sessions: int,
    list_length: int = 20,
    seed: int = 0,
    *,
    zipf_exponent: float = 1.1,
    band_cuts: tuple[float, float] = (1 / 3, 2 / 3),
    pool_size: int | None = None,
    relevant_share: float = 0.6,
    relevance_noise: float = 0.1,
    ranker: LoggingRanker = LoggingRanker(),
    click_model: ClickModel = ClickModel(),
) -> pd.DataFrame:
    """Draw search sessions with a biased production ranking, exposure and clicks (docs/methods/experience.md, step 4).

    Queries: ``query_id`` is the frequency rank (0 the most frequent), traffic follows
    :func:`zipf_probabilities`, bands follow :func:`frequency_bands` (expected traffic, not the
    realised counts). Each query has a category, a text of 2-3 of its topical words and a
    retrieval pool of ``pool_size`` items, about ``relevant_share`` of them of its category.
    The query-item relevance is ``clip(match * (0.5 + 0.5 * true_relevance) + N(0, relevance_noise^2), 0, 1)``,
    fixed per (query, item). A session draws its query by traffic, then ``L = list_length``
    candidates from the pool in random (retrieval) order, ranked by ``ranker``; exposure,
    clicks and long views follow ``click_model``.

    Args:
        catalogue: frame from :func:`generate_catalogue` (reads ``item_id``, ``category``,
            ``popularity``, ``true_relevance``, ``true_quality``, ``true_clickbait``).
        n_queries: number of distinct queries (>= 1).
        n_sessions: number of sessions (>= 0).
        list_length: ``L``, candidates per session.
        seed: seed of the logs (the catalogue has its own).
        zipf_exponent: exponent of the query-frequency law (> 0).
        band_cuts: cumulative traffic shares that end the head and the torso.
        pool_size: items retrieved per query, ``L <= pool_size <= len(catalogue)``;
            ``2 * L`` when None (capped at the catalogue size).
        relevant_share: share of a pool drawn from the query's category (fewer when the
            category is small).
        relevance_noise: std of the noise on query-item relevance.
        ranker: the logged production ranker.
        click_model: the simulated users (also what ``candidate_response`` and the simulated
            A/B apply to other pages).

    Returns:
        One row per session, columns ``SESSION_COLUMNS``: ``session_id`` (0..n_sessions-1),
        ``query_id``, ``query_text``, ``query_frequency_band``, ``candidates`` (``list[int]`` of
        ``L`` item ids), ``logged_order`` (``list[int]``, position -> candidate index, a
        permutation of 0..L-1), ``labels`` (``list[str]`` per candidate: ``"C"`` clicked,
        ``"E"`` exposed and not clicked, ``"U"`` unexposed), ``clicks`` (``list[int]`` 0/1 per
        candidate), ``long_views`` (``list[int]`` 0/1 per candidate, 1 only on clicks),
        ``relevance`` (``list[float]`` per candidate: the query-item relevance the click model
        reads) and ``true_quality`` (``list[float]`` per candidate: relevance times the item's
        ``true_quality``). ``relevance`` and ``true_quality`` are hidden ground truth for
        simulating and evaluating only: rankers and training code must not read them.
    """
    _check_count("n_queries", n_queries, minimum=1)
    _check_count("n_sessions", n_sessions, minimum=0)
    _check_count("list_length", list_length, minimum=1)
    pool_size = min(2 * list_length, len(catalogue)) if pool_size is None else pool_size
    if not list_length <= pool_size <= len(catalogue):
        raise ValueError(
            f"need list_length <= pool_size <= len(catalogue), got {list_length}, {pool_size}, "
            f"{len(catalogue)}; lower list_length or generate a larger catalogue"
        )
    if not 0.0 <= relevant_share <= 1.0:
        raise ValueError(f"relevant_share must lie in [0, 1], got {relevant_share}")
    if zipf_exponent <= 0 or relevance_noise < 0:
        raise ValueError("zipf_exponent must be > 0 and relevance_noise >= 0")
    if not 0.0 <= band_cuts[0] <= band_cuts[1] <= 1.0:
        raise ValueError(f"band_cuts must satisfy 0 <= head <= torso <= 1, got {band_cuts}")

    rng = np.random.default_rng(seed)
    # Long views draw from a stream of their own, so adding them left the clicks unchanged.
    long_view_rng = np.random.default_rng([seed, 1])
    items = _ItemFeatures.of(catalogue)
    traffic = zipf_probabilities(n_queries, zipf_exponent)
    bands = frequency_bands(traffic, band_cuts)
    queries = [
        _draw_query(rng, items, pool_size, relevant_share, relevance_noise)
        for _ in range(n_queries)
    ]
    rows = []
    for session_id in range(n_sessions):
        query_id = int(rng.choice(n_queries, p=traffic))
        query = queries[query_id]
        rows.append(
            {
                "session_id": session_id,
                "query_id": query_id,
                "query_text": query.text,
                "query_frequency_band": bands[query_id],
                **_draw_session(rng, long_view_rng, items, query, list_length, ranker, click_model),
            }
        )
    return pd.DataFrame(rows, columns=list(SESSION_COLUMNS))


@dataclass(frozen=True)
class _ItemFeatures:
    """Per catalogue row: what the simulated ranker and users react to."""

    item_id: np.ndarray
    category: np.ndarray
    z_popularity: np.ndarray  # z-score of log(popularity)
    z_clickbait: np.ndarray
    z_quality: np.ndarray
    true_relevance: np.ndarray
    true_quality: np.ndarray

    @classmethod
    def of(cls, catalogue: pd.DataFrame) -> _ItemFeatures:
        def column(name: str) -> np.ndarray:
            return catalogue[name].to_numpy(dtype=np.float64)

        return cls(
            item_id=catalogue["item_id"].to_numpy(),
            category=catalogue["category"].to_numpy(),
            z_popularity=_zscore(np.log(column("popularity"))),
            z_clickbait=_zscore(column("true_clickbait")),
            z_quality=_zscore(column("true_quality")),
            # Only generate_sessions draws from it; a catalogue of your own has none
            # (chain.world.sources: its sessions carry their own relevance).
            true_relevance=(
                column("true_relevance")
                if "true_relevance" in catalogue.columns
                else np.full(len(catalogue), np.nan)
            ),
            true_quality=column("true_quality"),
        )


@dataclass(frozen=True)
class _Query:
    text: str
    pool: np.ndarray  # (pool_size,) catalogue rows retrieved for the query
    relevance: np.ndarray  # (pool_size,) query-item relevance in [0, 1]


def _draw_query(
    rng: np.random.Generator,
    items: _ItemFeatures,
    pool_size: int,
    relevant_share: float,
    relevance_noise: float,
) -> _Query:
    categories = sorted(set(items.category))
    category = categories[int(rng.integers(len(categories)))]
    vocabulary = category_vocabulary(category)
    n_words = min(int(rng.integers(2, 4)), len(vocabulary))
    text = " ".join(rng.choice(vocabulary, size=n_words, replace=False))
    in_category = np.flatnonzero(items.category == category)
    outside = np.flatnonzero(items.category != category)
    n_relevant = min(round(relevant_share * pool_size), len(in_category))
    n_relevant = max(n_relevant, pool_size - len(outside))  # a small rest of the catalogue
    pool = np.concatenate(
        [
            rng.choice(in_category, size=n_relevant, replace=False),
            rng.choice(outside, size=pool_size - n_relevant, replace=False),
        ]
    )
    match = (items.category[pool] == category).astype(np.float64)
    noise = rng.normal(0.0, relevance_noise, pool_size)
    relevance = np.clip(match * (0.5 + 0.5 * items.true_relevance[pool]) + noise, 0.0, 1.0)
    return _Query(text, pool, relevance)


def _draw_session(  # noqa: PLR0913, PLR0917 - one private call site
    rng: np.random.Generator,
    long_view_rng: np.random.Generator,
    items: _ItemFeatures,
    query: _Query,
    list_length: int,
    ranker: LoggingRanker,
    click_model: ClickModel,
) -> dict:
    """Candidates, logged order, exposure, clicks and long views of one session."""
    positions = np.arange(list_length)
    picked = rng.choice(len(query.pool), size=list_length, replace=False)  # retrieval order
    members = query.pool[picked]  # (L,) catalogue rows
    relevance = query.relevance[picked]  # (L,)
    score = (
        ranker.popularity * items.z_popularity[members]
        + ranker.clickbait * items.z_clickbait[members]
        + rng.normal(0.0, ranker.noise, list_length)
    )
    logged_order = np.argsort(-score, kind="stable")  # (L,) position -> candidate
    position_of = np.empty(list_length, dtype=np.int64)
    position_of[logged_order] = positions  # (L,) candidate -> position
    lo, hi = click_model.exposure_depth
    depth = int(rng.integers(lo, hi + 1))
    exposed = position_of < min(depth, list_length)
    attractiveness = click_model.click_probability(
        items.z_popularity[members],
        items.z_clickbait[members],
        items.z_quality[members],
        relevance,
    )
    examination = click_model.examination(list_length)[position_of]  # (L,) per candidate
    clicked = exposed & (rng.uniform(size=list_length) < examination * attractiveness)
    long_view = click_model.long_view_probability(items.z_quality[members], relevance)
    long_viewed = clicked & (long_view_rng.uniform(size=list_length) < long_view)
    labels = np.where(clicked, LABEL_CLICKED, np.where(exposed, LABEL_EXPOSED, LABEL_UNEXPOSED))
    return {
        "candidates": [int(v) for v in items.item_id[members]],
        "logged_order": [int(v) for v in logged_order],
        "labels": [str(v) for v in labels],
        "clicks": [int(v) for v in clicked],
        "long_views": [int(v) for v in long_viewed],
        "relevance": [float(v) for v in relevance],
        "true_quality": [float(v) for v in relevance * items.true_quality[members]],
    }


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _zscore(values: np.ndarray) -> np.ndarray:
    spread = values.std()
    # A constant feature carries no signal; 0 instead of a division by zero.
    return (values - values.mean()) / spread if spread > 0 else np.zeros_like(values)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))
