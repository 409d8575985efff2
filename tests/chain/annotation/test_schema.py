"""Annotation schema: tolerant extraction, strict validation, round trips, the result frame."""

import json
import math
import time

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from creditflow.chain.annotation.schema import (
    ANNOTATION_COLUMNS,
    DIMENSIONS,
    ITEM_COLUMNS,
    MAX_PARSE_CHARS,
    Annotation,
    annotation_json_schema,
    annotations_frame,
    failed_row,
    ok_row,
    parse_annotation,
    visible_items,
)
from creditflow.errors import AnnotationParseError

VALID = {
    "sharpness": 4,
    "exposure": 3,
    "noise": 5,
    "title_informativeness": 2,
    "relevance": 4,
    "overall": 3.6,
    "analysis": "Sharp cover, slightly dark; the title is vague {but on topic}.",
}


def with_(**changes) -> str:
    return json.dumps({**VALID, **changes})


def test_parses_plain_json():
    annotation = parse_annotation(json.dumps(VALID))
    assert dict(annotation.scores) == {d: VALID[d] for d in DIMENSIONS}
    assert annotation.overall == 3.6
    assert annotation.analysis == VALID["analysis"]


@pytest.mark.parametrize(
    "wrap",
    [
        "```json\n{}\n```",
        "Here is my assessment:\n```\n{}\n```\nHope this helps.",
        "Sure! The annotation is {} -- let me know.",
        "Thinking {{not json}} ... final: {}",
    ],
)
def test_tolerates_fences_and_prose(wrap):
    assert parse_annotation(wrap.format(json.dumps(VALID))).to_dict() == VALID


def test_integral_floats_are_scores():
    assert parse_annotation(with_(sharpness=4.0)).scores["sharpness"] == 4
    assert isinstance(parse_annotation(with_(sharpness=4.0)).scores["sharpness"], int)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("I cannot rate this image.", "no JSON object"),
        ("```json\n{'sharpness': 4}\n```", "no JSON object"),
        (json.dumps({k: v for k, v in VALID.items() if k != "noise"}), r"missing keys \['noise'\]"),
        (with_(sharpness=0), "sharpness must be an integer in"),
        (with_(exposure=6), "exposure must be an integer in"),
        (with_(noise=4.5), "noise must be an integer in"),
        (with_(relevance="4"), "relevance must be an integer in"),
        (with_(title_informativeness=True), "title_informativeness must be an integer in"),
        (with_(overall=5.5), "overall must be a number in"),
        (with_(overall=None), "overall must be a number in"),
        (with_(overall=float("nan")), "overall must be a number in"),
        (with_(analysis="   "), "analysis must be a non-empty string"),
        (with_(analysis=3), "analysis must be a non-empty string"),
    ],
)
def test_rejects_with_clear_message(text, message):
    with pytest.raises(AnnotationParseError, match=message):
        parse_annotation(text)


def test_parse_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_annotation("")
    with pytest.raises(AnnotationParseError, match="as str"):
        parse_annotation(None)


@given(
    scores=st.tuples(*[st.integers(1, 5) for _ in DIMENSIONS]),
    overall=st.floats(1, 5),
    analysis=st.text(min_size=1).filter(str.strip),
)
def test_json_round_trip(scores, overall, analysis):
    annotation = Annotation(dict(zip(DIMENSIONS, scores, strict=True)), overall, analysis.strip())
    assert parse_annotation(annotation.to_json()) == annotation
    assert parse_annotation(f"```json\n{annotation.to_json()}\n```") == annotation


# Junk with many `{`: bare ones, ones opening a key whose value is not JSON, and ones opening
# an unterminated string.
JUNK = ("noise {" * 5 + '{"k": noise ' + '{"open ') * 20_000


def test_megabytes_of_junk_fail_cleanly_in_linear_time():
    """A reply of 2 MB of junk holding ~260k `{` is refused with AnnotationParseError after
    reading only its first MAX_PARSE_CHARS characters; each candidate is decoded from a window
    of its own, so the time grows linearly (before: O(n^2), minutes for 1 MB)."""
    text = (JUNK * 2)[:2_000_000]
    started = time.perf_counter()
    with pytest.raises(AnnotationParseError, match=f"only its first {MAX_PARSE_CHARS} of 2000000"):
        parse_annotation(text)
    assert time.perf_counter() - started < 10  # generous: ~0.01 s here, a noisy machine


def test_only_the_first_max_chars_are_read():
    prose = "Let me think about this cover. " * 100  # 3,000 characters
    text = prose + json.dumps(VALID)
    assert parse_annotation(text).to_dict() == VALID
    with pytest.raises(AnnotationParseError, match="only its first 2000 of"):
        parse_annotation(text, max_chars=2000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # Nested past the interpreter's recursion limit: each candidate reads far, so the
        # read budget runs out.
        ('{"a": ' * 5000, "gave up after reading"),
        ('{"a": [' * 5000, "gave up after reading"),
        ('{"' * 30_000, "gave up after reading"),  # 30k candidates, each failing at once
        ('{"a": 1, ' * 7000 + "}", "no JSON object"),  # one long candidate, no closing brace
    ],
)
def test_adversarial_json_fails_cleanly(text, message):
    with pytest.raises(AnnotationParseError, match=message):
        parse_annotation(text)


@pytest.mark.parametrize("n_escapes", range(80, 100))
def test_a_long_annotation_decodes_across_window_cuts(n_escapes):
    """An annotation longer than the first decoding window, whose analysis is all 6-character
    escapes, so the window's end falls inside an escape, a number or a key as n_escapes
    varies; junk `{"` before it must not hide it, and the first object is still the one."""
    analysis = "\u00e9t\u00e9 " * n_escapes
    annotation = json.dumps({**VALID, "analysis": analysis}, ensure_ascii=True)
    text = 'Draft: {"sharpness": maybe 4} then {"note": ' + annotation + " done"
    assert parse_annotation(text).analysis == analysis.strip()


def test_annotation_validates_itself():
    with pytest.raises(AnnotationParseError, match="sharpness"):
        Annotation({**dict.fromkeys(DIMENSIONS, 3), "sharpness": 7}, 3.0, "x")


def test_visible_items_drops_everything_else():
    items = pd.DataFrame(
        {
            "item_id": [1],
            "category": ["pets"],
            "title": ["t"],
            "image_png": [b"x"],
            "true_quality": [0.9],
        }
    )
    assert tuple(visible_items(items).columns) == ITEM_COLUMNS
    with pytest.raises(ValueError, match="image_png"):
        visible_items(items.drop(columns="image_png"))


def test_result_frame_keeps_failures_unscored():
    annotation = parse_annotation(json.dumps(VALID))
    frame = annotations_frame(
        [ok_row(7, annotation, "raw", attempts=1), failed_row(8, "bad", attempts=4, error="boom")]
    )
    assert tuple(frame.columns) == ANNOTATION_COLUMNS
    assert frame["status"].tolist() == ["ok", "failed"]
    assert frame.loc[0, "sharpness"] == 4 and frame["sharpness"].dtype == "Int64"
    assert frame.loc[1, DIMENSIONS].isna().all() and math.isnan(frame.loc[1, "overall"])
    assert frame.loc[1, "raw_text"] == "bad" and frame.loc[1, "error"] == "boom"
    assert frame["attempts"].tolist() == [1, 4]


def test_json_schema_is_the_parsers_schema():
    """The structured-output schema asks for exactly what parse_annotation accepts: its keys in
    the canonical order, all required, scores 1-5 as integers, overall in [1, 5]."""
    schema = annotation_json_schema()
    assert schema["required"] == list(parse_annotation(json.dumps(VALID)).to_dict())
    assert list(schema["properties"]) == schema["required"]
    assert schema["additionalProperties"] is False
    for d in DIMENSIONS:
        assert schema["properties"][d]["type"] == "integer"
        for score in schema["properties"][d]["enum"]:
            parse_annotation(json.dumps({**VALID, d: score}))  # every allowed score parses
    overall = schema["properties"]["overall"]
    assert (overall["minimum"], overall["maximum"]) == (1, 5)
    assert schema["properties"]["analysis"]["type"] == "string"
