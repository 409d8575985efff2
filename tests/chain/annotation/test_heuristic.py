"""Heuristic annotator: hand-made images and titles, hidden columns unread, agreement with truth."""

import io
import math

import numpy as np
import pandas as pd
import pytest
from PIL import Image, ImageFilter
from scipy.stats import kendalltau

from creditflow.chain.annotation.heuristic import (
    HeuristicAnnotator,
    colourfulness,
    glyph_share,
    laplacian_variance,
    measure_image,
    measure_title,
    noise_std,
)
from creditflow.chain.annotation.schema import ANNOTATION_COLUMNS, DIMENSIONS, parse_annotation
from creditflow.chain.world.catalogue import (
    CATEGORY_COLOURS,
    CATEGORY_VOCABULARY,
    DESCRIPTOR_WORDS,
    HIDDEN_COLUMNS,
)


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8), "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def grey(value: float, size: int = 64) -> np.ndarray:
    return np.full((size, size, 3), value, dtype=np.uint8)


def checkerboard(cell: int, low: int = 60, high: int = 190, size: int = 64) -> np.ndarray:
    y, x = np.indices((size, size))
    board = np.where((x // cell + y // cell) % 2 == 0, low, high)
    return np.repeat(board[..., None], 3, axis=2).astype(np.uint8)


def stripes(width: int, low: int = 60, high: int = 190, size: int = 64) -> np.ndarray:
    x = np.indices((size, size))[1]
    board = np.where((x // width) % 2 == 0, low, high)
    return np.repeat(board[..., None], 3, axis=2).astype(np.uint8)


def test_laplacian_variance_hand_computed():
    # 1-pixel checkerboard of 0/100: a 0 pixel has four 100 neighbours -> 400 - 0 = 400, a 100
    # pixel -> 0 - 400 = -400; mean 0, variance 400^2 = 160000.
    gray = checkerboard(1, low=0, high=100)[..., 0].astype(float)
    assert laplacian_variance(gray) == pytest.approx(160_000)
    assert laplacian_variance(np.full((8, 8), 77.0)) == 0


def test_noise_estimate_recovers_white_noise():
    rng = np.random.default_rng(0)
    gray = 128 + rng.normal(0, 10, (200, 200))
    # Immerkaer: E|N * noise| = sqrt(2/pi) * sigma * sqrt(36) (N's squared weights sum to 36).
    assert noise_std(gray) == pytest.approx(10, rel=0.03)
    # Axis-aligned stripes cost nothing: N is separable into two second differences.
    assert noise_std(stripes(4)[..., 0].astype(float)) == 0
    assert noise_std(np.tile(np.arange(50.0), (50, 1))) == 0  # a linear ramp


def test_colourfulness_hand_computed():
    # Uniform (200, 100, 50): rg = 100, yb = 150 - 50 = 100, no spread -> 0.3 * hypot(100, 100).
    assert colourfulness(np.full((4, 4, 3), (200, 100, 50))) == pytest.approx(
        0.3 * math.hypot(100, 100)
    )
    assert colourfulness(grey(90)) == 0


def test_checkerboard_is_sharper_than_its_blur():
    sharp = checkerboard(4)
    blurred = np.asarray(Image.fromarray(sharp).filter(ImageFilter.GaussianBlur(2)))
    blurrier = np.asarray(Image.fromarray(sharp).filter(ImageFilter.GaussianBlur(4)))
    sharp_m, blurred_m = measure_image(sharp), measure_image(blurred)
    assert sharp_m.laplacian_variance > 100 * blurred_m.laplacian_variance
    annotator = HeuristicAnnotator()
    scores = [
        annotator.annotate_one(png(image), "Pasta recipe tutorial", "cooking")
        for image in (sharp, blurred, blurrier)
    ]
    assert [a.scores["sharpness"] for a in scores] == sorted(
        (a.scores["sharpness"] for a in scores), reverse=True
    )
    assert scores[0].scores["sharpness"] == 5 and scores[2].scores["sharpness"] <= 2
    assert "crisp" in scores[0].analysis
    assert f"Laplacian variance {blurred_m.laplacian_variance:.1f}" in scores[1].analysis


@pytest.mark.parametrize(
    ("value", "score", "phrase"),
    [(0, 1, "too dark"), (255, 1, "washed out"), (128, 5, "well exposed"), (200, 2, "washed out")],
)
def test_exposure_of_flat_images(value, score, phrase):
    # badness = |mean - 128| / 128 + clipped share: black 1 + 1 = 2, white 127/128 + 1,
    # mid-grey 0, 200 -> 72/128 = 0.5625 (between the cuts 0.54 and 0.73 -> score 2).
    annotation = HeuristicAnnotator().annotate_one(png(grey(value)), "Pasta recipe", "cooking")
    assert annotation.scores["exposure"] == score
    assert phrase in annotation.analysis


def test_noise_score_falls_with_added_noise():
    rng = np.random.default_rng(1)
    scores = []
    for sigma in (0, 3, 8):
        noisy = np.clip(stripes(4) + rng.normal(0, sigma, (64, 64, 1)), 0, 255)
        scores.append(
            HeuristicAnnotator().annotate_one(png(noisy), "Pasta", "cooking").scores["noise"]
        )
    assert scores[0] == 5 and scores[0] > scores[1] > scores[2]


def test_title_measures_hand_counted():
    measures = measure_title(
        "WOW!!! YOU WON'T BELIEVE THIS PASTA RECIPE TUTORIAL GUITAR!!!",
        "cooking",
        CATEGORY_VOCABULARY,
        DESCRIPTOR_WORDS,
    )
    # Content words after the stock phrases: this pasta recipe tutorial guitar.
    assert measures.n_words == 5
    assert measures.n_specific == 4  # pasta, recipe, guitar (topical) + tutorial (descriptor)
    assert (measures.n_topical, measures.n_on_topic) == (3, 2)
    assert set(measures.markers) == {"wow", "you won't believe", "!!!", "all caps"}
    # One acronym is not shouting.
    calm = measure_title("DIY shelf repair guide", "diy", CATEGORY_VOCABULARY, DESCRIPTOR_WORDS)
    assert calm.markers == () and (calm.n_words, calm.n_specific, calm.n_on_topic) == (4, 3, 2)


def test_title_scores():
    image = png(checkerboard(4))
    annotator = HeuristicAnnotator(colours={})  # no glyph colour known: the title alone
    good = annotator.annotate_one(image, "Sourdough baking tutorial with garlic roast", "cooking")
    bait = annotator.annotate_one(image, "WOW!!! THIS STUFF JUST HAPPENED!!!", "cooking")
    off_topic = annotator.annotate_one(image, "Guitar chords and piano tutorial", "cooking")
    assert good.scores["title_informativeness"] == 5 and good.scores["relevance"] == 5
    assert bait.scores["title_informativeness"] == 1
    assert bait.scores["relevance"] == 3  # no topical word: no evidence either way
    assert off_topic.scores["relevance"] == 1
    assert "click-bait markers" in bait.analysis
    # Click-bait markers take nothing off informativeness: 3 of 3 content words are specific.
    loud = annotator.annotate_one(image, "WOW!!! PASTA RECIPE TUTORIAL!!!", "cooking")
    assert loud.scores["title_informativeness"] == 5


def test_relevance_reads_the_cover_too():
    colour = CATEGORY_COLOURS["cooking"]
    glyph = grey(128)
    glyph[8:56, 8:56] = colour  # 48^2 / 64^2 = 56 % of the cover in the category's colour
    assert glyph_share(glyph, colour) == pytest.approx(0.5625)
    # An exposure shift moves the three channels alike: the chroma, so the share, stays.
    assert glyph_share(np.clip(glyph.astype(int) + 40, 0, 255), colour) == pytest.approx(0.5625)
    annotator = HeuristicAnnotator()
    on_topic = "Sourdough baking tutorial with garlic roast"  # title grade 5
    off_topic = "Guitar chords and piano tutorial"  # title grade 1
    no_topic = "This stuff just happened"  # no evidence in the title
    relevance = {
        (cover, title): annotator.annotate_one(png(pixels), title, "cooking").scores["relevance"]
        for cover, pixels in [("glyph", glyph), ("grey", grey(128))]
        for title in (on_topic, off_topic, no_topic)
    }
    # The mean of the two grades, rounded half up: (5 + 5) / 2, (5 + 1) / 2, (1 + 5) / 2, ...
    assert relevance == {
        ("glyph", on_topic): 5,
        ("glyph", off_topic): 3,
        ("glyph", no_topic): 5,
        ("grey", on_topic): 3,
        ("grey", off_topic): 1,
        ("grey", no_topic): 1,
    }


def test_hidden_columns_are_never_read(catalogue):
    items = catalogue.head(25)
    reference = HeuristicAnnotator().annotate(items)
    garbage = items.assign(**{c: "garbage" for c in HIDDEN_COLUMNS}, popularity=-1.0)
    pd.testing.assert_frame_equal(HeuristicAnnotator().annotate(garbage), reference)
    bare = items[["image_png", "title", "category", "item_id"]]
    pd.testing.assert_frame_equal(HeuristicAnnotator().annotate(bare), reference)


def test_annotations_agree_with_hidden_quality(catalogue):
    frame = HeuristicAnnotator().annotate(catalogue)
    assert tuple(frame.columns) == ANNOTATION_COLUMNS
    assert (frame["status"] == "ok").all() and (frame["attempts"] == 1).all()
    assert frame["item_id"].tolist() == catalogue["item_id"].tolist()
    tau = kendalltau(frame["overall"], catalogue["true_quality"]).statistic
    assert tau > 0.3, tau
    for dim in DIMENSIONS:
        # Calibrated cuts: every dimension uses at least four of the five scores.
        assert frame[dim].nunique() >= 4, dim
        assert kendalltau(frame[dim], catalogue[f"true_{dim}"]).statistic > 0.25, dim
    # raw_text is the annotation's JSON, the SFT target.
    first = frame.iloc[0]
    parsed = parse_annotation(first["raw_text"])
    assert parsed.overall == first["overall"] and parsed.analysis == first["analysis"]
    assert [parsed.scores[d] for d in DIMENSIONS] == [first[d] for d in DIMENSIONS]


def test_overall_is_the_weighted_mean():
    weights = {**dict.fromkeys(DIMENSIONS, 0.0), "sharpness": 1.0}
    annotation = HeuristicAnnotator(weights=weights).annotate_one(png(checkerboard(4)), "x", "pets")
    assert annotation.overall == annotation.scores["sharpness"]
    with pytest.raises(ValueError, match="keys"):
        HeuristicAnnotator(weights={"sharpness": 1.0})
    with pytest.raises(ValueError, match="positive sum"):
        HeuristicAnnotator(weights=dict.fromkeys(DIMENSIONS, 0.0))
