"""Reranking world (docs/methods/experience.md): catalogue determinism and visibility of hidden quality; biased logs."""

import io

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy.stats import spearmanr

from creditflow.chain.world.catalogue import (
    CATALOGUE_COLUMNS,
    CATEGORY_VOCABULARY,
    FILLER_WORDS,
    HIDDEN_COLUMNS,
    QUALITY_DIMENSIONS,
    QUALITY_WEIGHTS,
    SESSION_COLUMNS,
    ClickModel,
    LoggingRanker,
    candidate_response,
    frequency_bands,
    generate_catalogue,
    generate_sessions,
    zipf_probabilities,
)


@pytest.fixture(scope="module")
def catalogue() -> pd.DataFrame:
    return generate_catalogue(400, seed=0)


@pytest.fixture(scope="module")
def sessions(catalogue) -> pd.DataFrame:
    return generate_sessions(catalogue, n_queries=150, n_sessions=3000, list_length=20, seed=0)


def gray_pixels(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as image:
        rgb = np.asarray(image.convert("RGB"), dtype=np.float64)
    return rgb @ np.array([0.299, 0.587, 0.114])


def test_catalogue_is_deterministic_and_prefix_stable():
    first = generate_catalogue(30, seed=3)
    pd.testing.assert_frame_equal(first, generate_catalogue(30, seed=3))
    # Item i draws from its own stream: a longer catalogue starts with the same items.
    pd.testing.assert_frame_equal(first.head(12), generate_catalogue(12, seed=3))
    other = generate_catalogue(30, seed=4)
    assert not first["title"].equals(other["title"])
    assert not np.allclose(first["true_quality"], other["true_quality"])


def test_catalogue_schema_and_hidden_quality(catalogue):
    assert tuple(catalogue.columns) == CATALOGUE_COLUMNS
    assert catalogue["item_id"].tolist() == list(range(400))
    assert set(catalogue["category"]) <= set(CATEGORY_VOCABULARY)
    assert (catalogue["popularity"] > 0).all()
    hidden = catalogue[list(HIDDEN_COLUMNS)].to_numpy()
    assert ((hidden >= 0) & (hidden <= 1)).all()
    expected = sum(QUALITY_WEIGHTS[d] * catalogue[f"true_{d}"] for d in QUALITY_DIMENSIONS)
    np.testing.assert_allclose(catalogue["true_quality"], expected)
    assert catalogue["title"].map(str.isascii).all()
    with Image.open(io.BytesIO(catalogue["image_png"][0])) as image:
        assert image.format == "PNG" and image.mode == "RGB" and image.size == (96, 96)


def test_image_size_is_honoured():
    small = generate_catalogue(3, seed=0, image_size=48, categories=("cooking", "pets"))
    assert gray_pixels(small["image_png"][0]).shape == (48, 48)
    assert set(small["category"]) <= {"cooking", "pets"}


def test_clickbait_and_popularity_do_not_follow_quality(catalogue):
    # Independent draws: with n = 400 the null std of Spearman's rho is ~0.05.
    for column in ("true_clickbait", "popularity"):
        rho = spearmanr(catalogue[column], catalogue["true_quality"]).statistic
        assert abs(rho) < 0.15, (column, rho)


def test_laplacian_variance_follows_true_sharpness(catalogue):
    def laplacian_variance(png: bytes) -> float:
        g = gray_pixels(png)
        lap = g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1] - 4 * g[1:-1, 1:-1]
        return lap.var()

    variances = catalogue["image_png"].map(laplacian_variance)
    rho = spearmanr(variances, catalogue["true_sharpness"]).statistic
    assert rho > 0.5, rho


def test_exposure_and_title_quality_are_visible(catalogue):
    brightness_gap = catalogue["image_png"].map(lambda png: abs(gray_pixels(png).mean() - 128))
    assert spearmanr(brightness_gap, catalogue["true_exposure"]).statistic < -0.5

    def filler_share(title: str) -> float:
        words = title.lower().replace("!", " ").split()
        return sum(w in FILLER_WORDS for w in words) / len(words)

    shares = catalogue["title"].map(filler_share)
    assert spearmanr(shares, catalogue["true_title_informativeness"]).statistic < -0.5


def test_clickbait_shows_in_titles(catalogue):
    markers = catalogue["title"].map(
        lambda t: ("!!!" in t) + t.isupper() + ("WOW" in t.upper() or "BELIEVE" in t.upper())
    )
    assert spearmanr(markers, catalogue["true_clickbait"]).statistic > 0.5


def test_catalogue_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n_items"):
        generate_catalogue(-1)
    with pytest.raises(ValueError, match="image_size"):
        generate_catalogue(2, image_size=16)
    with pytest.raises(ValueError, match="categories"):
        generate_catalogue(2, categories=("pets", "pets"))


def test_sessions_are_deterministic(catalogue):
    a = generate_sessions(catalogue, n_queries=20, n_sessions=50, list_length=10, seed=5)
    pd.testing.assert_frame_equal(
        a, generate_sessions(catalogue, n_queries=20, n_sessions=50, list_length=10, seed=5)
    )
    b = generate_sessions(catalogue, n_queries=20, n_sessions=50, list_length=10, seed=6)
    assert a["candidates"].tolist() != b["candidates"].tolist()


def test_session_lists_and_labels_are_consistent(catalogue, sessions):
    assert tuple(sessions.columns) == SESSION_COLUMNS
    assert sessions["session_id"].tolist() == list(range(3000))
    known = set(catalogue["item_id"])
    depths = ClickModel().exposure_depth
    for row in sessions.itertuples():
        assert len(set(row.candidates)) == 20 and set(row.candidates) <= known
        assert sorted(row.logged_order) == list(range(20))
        labels, clicks = np.array(row.labels), np.array(row.clicks)
        assert set(labels) <= {"C", "E", "U"}
        np.testing.assert_array_equal(clicks == 1, labels == "C")  # C iff clicked, so U never is
        assert (np.array(row.long_views) <= clicks).all(), "a long view needs a click"
        assert len(row.relevance) == 20 and all(0 <= r <= 1 for r in row.relevance)
        # Exposure is a prefix of the logged order: exposed candidates fill positions 0..depth-1.
        exposed_by_position = labels[row.logged_order] != "U"
        depth = exposed_by_position.sum()
        assert exposed_by_position[:depth].all()
        assert depths[0] <= depth <= depths[1]


def test_clicks_follow_clickbait_and_popularity_not_quality(catalogue, sessions):
    items = catalogue.set_index("item_id")
    ids = np.concatenate(sessions["candidates"].to_numpy())
    labels = np.concatenate(sessions["labels"].to_numpy())
    clicks = np.concatenate(sessions["clicks"].to_numpy())
    candidate_quality = np.concatenate(sessions["true_quality"].to_numpy())
    exposed = labels != "U"  # ~24k exposed impressions: rho's null std is below 0.01

    def rho(values) -> float:
        return spearmanr(clicks[exposed], np.asarray(values)[exposed]).statistic

    bait = rho(items.loc[ids, "true_clickbait"])
    popularity = rho(items.loc[ids, "popularity"])
    quality = rho(items.loc[ids, "true_quality"])
    assert min(bait, popularity) > 0.15
    assert min(bait, popularity) > quality + 0.1, (bait, popularity, quality)
    assert min(bait, popularity) > rho(candidate_quality) + 0.1


def test_logged_order_follows_popularity_and_clickbait(catalogue, sessions):
    items = catalogue.set_index("item_id")
    z = items[["popularity", "true_clickbait", "true_quality"]].assign(
        popularity=np.log(items["popularity"])
    )
    z = (z - z.mean()) / z.std()
    shown = np.array([np.array(r.candidates)[r.logged_order] for r in sessions.itertuples()])

    def mean_rank_correlation(values: np.ndarray) -> float:
        """Mean over sessions of Spearman's rho between position and ``values`` (S, L)."""
        ranks = values.argsort(axis=1).argsort(axis=1)  # continuous values: no ties
        length = values.shape[1]
        squared = ((ranks - np.arange(length)) ** 2).sum(axis=1)
        return float(np.mean(1 - 6 * squared / (length * (length**2 - 1))))

    def by_position(column: str) -> np.ndarray:
        return z[column].to_numpy()[shown]  # item ids are row numbers  # (S, L)

    # The ranker scores z_pop + z_clickbait + N(0, 0.5^2): position tracks that sum closely,
    # and quality not at all.
    assert mean_rank_correlation(by_position("popularity") + by_position("true_clickbait")) < -0.8
    assert abs(mean_rank_correlation(by_position("true_quality"))) < 0.1


def test_frequency_bands_by_traffic_hand_computed():
    # Traffic before each query: 0, .5, .7, .85, .95 -> head (< 1/3), torso (< 2/3), then tail.
    assert frequency_bands(np.array([0.5, 0.2, 0.15, 0.1, 0.05])) == [
        "head",
        "torso",
        "tail",
        "tail",
        "tail",
    ]
    # p_r ∝ 1/(r+1): weights 1, 1/2, 1/3 sum to 11/6 -> 6/11, 3/11, 2/11.
    np.testing.assert_allclose(zipf_probabilities(3, 1.0), [6 / 11, 3 / 11, 2 / 11])


def test_band_proportions(sessions):
    traffic = zipf_probabilities(150, 1.1)
    bands = np.array(frequency_bands(traffic))
    per_query = sessions.groupby("query_id")["query_frequency_band"].first()
    assert (per_query == bands[per_query.index]).all()
    n_queries = {band: (bands == band).sum() for band in ("head", "torso", "tail")}
    assert n_queries["head"] < n_queries["torso"] < n_queries["tail"]
    shares = sessions["query_frequency_band"].value_counts(normalize=True)
    for band in ("head", "torso", "tail"):
        expected = traffic[bands == band].sum()
        # Binomial std over 3000 sessions is <= 0.009; 0.04 is > 4 std.
        assert abs(shares[band] - expected) < 0.04, (band, shares[band], expected)
    # Query 0 is the most frequent.
    assert sessions["query_id"].value_counts().idxmax() == 0


def test_candidate_quality_is_relevance_times_item_quality(catalogue):
    # With relevance_noise = 0: relevance = match * (0.5 + 0.5 * true_relevance).
    logs = generate_sessions(
        catalogue, n_queries=10, n_sessions=40, list_length=8, seed=1, relevance_noise=0.0
    )
    items = catalogue.set_index("item_id")
    topic_of = {w: c for c, words in CATEGORY_VOCABULARY.items() for w in words}
    for row in logs.itertuples():
        (category,) = {topic_of[w] for w in row.query_text.split()}
        for item_id, quality in zip(row.candidates, row.true_quality, strict=True):
            item = items.loc[item_id]
            match = item["category"] == category
            expected = match * (0.5 + 0.5 * item["true_relevance"]) * item["true_quality"]
            assert quality == pytest.approx(expected)


def test_sessions_reject_bad_arguments(catalogue):
    with pytest.raises(ValueError, match="pool_size"):
        generate_sessions(catalogue, 5, 5, list_length=10, pool_size=5)
    with pytest.raises(ValueError, match="exposure_depth"):
        ClickModel(exposure_depth=(5, 3))
    with pytest.raises(ValueError, match="position_bias"):
        ClickModel(position_bias=-1.0)
    with pytest.raises(ValueError, match="noise"):
        LoggingRanker(noise=-0.1)
    with pytest.raises(ValueError, match="n_queries"):
        generate_sessions(catalogue, 0, 5)


def test_click_model_position_weights_by_hand():
    model = ClickModel(exposure_depth=(2, 4), position_bias=1.0)
    # Depth uniform on {2, 3, 4}: P(depth > p) = 1, 1, 2/3, 1/3, 0 for p = 0..4; examination
    # 1 / (p + 1).
    np.testing.assert_allclose(model.exposure(5), [1, 1, 2 / 3, 1 / 3, 0])
    np.testing.assert_allclose(model.examination(5), [1, 1 / 2, 1 / 3, 1 / 4, 1 / 5])
    np.testing.assert_allclose(model.position_weights(5), [1, 1 / 2, 2 / 9, 1 / 12, 0])
    # sigmoid(-0.5 + 1 * 1 + 1.2 * 0 + 0.2 * 0 + 1 * (1.0 - 0.5)) = sigmoid(1)
    click = model.click_probability(np.array(1.0), np.array(0.0), np.array(0.0), np.array(1.0))
    assert click == pytest.approx(1 / (1 + np.exp(-1.0)))
    # sigmoid(-1 + 1 * 1 + 2 * 0) = 0.5
    assert model.long_view_probability(np.array(1.0), np.array(0.5)) == pytest.approx(0.5)


def test_click_model_from_params_and_replace():
    model = ClickModel.from_params({"exposure_depth": [3, 5], "quality": 1.5})
    assert model.exposure_depth == (3, 5) and model.quality == 1.5
    assert model.replace(quality=0.0).quality == 0.0 and model.quality == 1.5
    with pytest.raises(TypeError):
        ClickModel.from_params({"quality_weight": 1.0})


def test_long_views_follow_quality_and_logged_clicks_follow_the_click_model(catalogue, sessions):
    click, long_view = candidate_response(sessions, catalogue, ClickModel())
    assert click.shape == long_view.shape == (len(sessions), 20)
    items = catalogue.set_index("item_id")
    ids = np.concatenate(sessions["candidates"].to_numpy())
    quality = items.loc[ids, "true_quality"].to_numpy()
    clicked = np.concatenate(sessions["clicks"].to_numpy()) == 1
    long_viewed = np.concatenate(sessions["long_views"].to_numpy()) == 1
    # Among clicks, long views follow quality (weight 1 per sd) much more than clicks do.
    assert spearmanr(long_viewed[clicked], quality[clicked]).statistic > 0.15
    # The logged clicks are what the model predicts: expected vs observed click rate at the
    # top logged position (always exposed and examined), over 3000 sessions.
    top = np.array([row.logged_order[0] for row in sessions.itertuples()])
    rows = np.arange(len(sessions))
    observed = np.array([row.clicks[t] for row, t in zip(sessions.itertuples(), top, strict=True)])
    assert observed.mean() == pytest.approx(click[rows, top].mean(), abs=0.03)
    expected_long = (click * long_view)[rows, top].mean()
    top_long = [row.long_views[t] for row, t in zip(sessions.itertuples(), top, strict=True)]
    assert np.mean(top_long) == pytest.approx(expected_long, abs=0.03)


def test_long_views_leave_the_logged_clicks_unchanged(catalogue):
    # Long views draw from their own stream: with long views impossible the clicks are the same.
    default = generate_sessions(catalogue, n_queries=10, n_sessions=40, list_length=8, seed=3)
    never = generate_sessions(
        catalogue,
        n_queries=10,
        n_sessions=40,
        list_length=8,
        seed=3,
        click_model=ClickModel(long_view_intercept=-50.0),
    )
    assert default["clicks"].tolist() == never["clicks"].tolist()
    assert all(sum(v) == 0 for v in never["long_views"])
