"""Format reward, translation extraction and the translation segment boundary (docs/methods/tapo.md)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from creditflow.rewards import (
    TRANSLATION_CLOSE,
    TRANSLATION_OPEN,
    extract_translation,
    format_reward,
    translation_segment_end,
)

VALID = "<translation>How many eggs?</translation> 16 - 3 - 4 = 9, so \\boxed{9}"

# (completion, F): one case per rule of docs/methods/tapo.md's format reward.
FORMAT_CASES = [
    (VALID, 1.0),
    (" \n\t" + VALID, 1.0),  # only whitespace before the block is allowed
    ("Sure! " + VALID, 0.0),  # the block must come first
    ("How many eggs? \\boxed{9}", 0.0),  # no block at all
    ("<translation></translation> \\boxed{9}", 0.0),  # empty translation
    ("<translation> \n </translation> \\boxed{9}", 0.0),  # whitespace-only translation
    ("<translation>How many eggs?</translation>", 0.0),  # nothing follows
    ("<translation>How many eggs?</translation> \n\t ", 0.0),  # only whitespace follows
    ("<translation>A</translation> x <translation>B</translation> y", 0.0),  # two blocks
    ("<translation>A <translation>B</translation></translation> y", 0.0),  # nested blocks
    ("<translation>A</translation> x <translation> y", 0.0),  # a stray opening tag later
    ("<translation>A</translation> x </translation> y", 0.0),  # a stray closing tag later
    ("<translation>How many eggs? \\boxed{9}", 0.0),  # never closed
    ("</translation>A<translation> y", 0.0),  # closing tag before the opening one
    ("<Translation>A</Translation> y", 0.0),  # tags are case-sensitive
    ("", 0.0),
]


@pytest.mark.parametrize(("completion", "expected"), FORMAT_CASES)
def test_format_reward_rules(completion, expected):
    assert format_reward([completion]) == [expected]
    assert (extract_translation(completion) is not None) == (expected == 1.0)


def test_format_reward_is_elementwise():
    completions = [c for c, _ in FORMAT_CASES]
    assert format_reward(completions) == [f for _, f in FORMAT_CASES]
    assert format_reward([]) == []


def test_extract_translation_strips_the_text():
    assert extract_translation(VALID) == "How many eggs?"
    assert extract_translation("\n<translation>\n  A  b \n</translation>\nC") == "A  b"


def test_translation_segment_end_hand_offsets():
    # "  " (2) + "<translation>" (13) + "ab" (2) + "</translation>" (14) = 31
    completion = "  <translation>ab</translation>xyz"
    assert translation_segment_end(completion) == 31
    assert completion[:31].endswith(TRANSLATION_CLOSE) and completion[31:] == "xyz"
    # Only the FIRST closing tag counts, and the format need not be valid:
    # "abc" (3) + "</translation>" (14) = 17
    assert translation_segment_end("abc</translation>d</translation>e") == 17
    assert translation_segment_end("<translation>never closed") is None
    assert translation_segment_end("") is None
    # A closing tag right at the end: the whole completion is translation segment.
    assert translation_segment_end("<translation>q</translation>") == 28  # 13 + 1 + 14


@given(st.lists(st.sampled_from(["a", " ", "\n", TRANSLATION_OPEN, TRANSLATION_CLOSE, "<", "/"])))
def test_translation_segment_end_is_just_past_the_first_closing_tag(pieces):
    completion = "".join(pieces)
    end = translation_segment_end(completion)
    if TRANSLATION_CLOSE not in completion:
        assert end is None
    else:
        assert completion[:end].endswith(TRANSLATION_CLOSE)
        assert TRANSLATION_CLOSE not in completion[: end - 1]


@given(st.text(), st.text(), st.text())
def test_format_reward_matches_the_rules_on_wrapped_text(lead, body, tail):
    completion = lead + TRANSLATION_OPEN + body + TRANSLATION_CLOSE + tail
    expected = (
        not lead.strip()
        and bool(body.strip())
        and bool(tail.strip())
        and TRANSLATION_OPEN not in lead + body + tail
        and TRANSLATION_CLOSE not in lead + body + tail
    )
    assert format_reward([completion]) == [1.0 if expected else 0.0]
    if expected:
        assert extract_translation(completion) == body.strip()


@given(st.text())
def test_format_functions_never_raise_on_arbitrary_text(text):
    assert format_reward([text]) in ([0.0], [1.0])
    end = translation_segment_end(text)
    assert end is None or 0 < end <= len(text)
