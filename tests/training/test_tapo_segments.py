"""Mapping the end of ``</translation>`` (a character offset) to the completion token that
completes it, for a tag split into BPE pieces and for a tag that is one added token."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from creditflow.rewards import translation_segment_end
from creditflow.training.strategies.tapo import (
    PADDING,
    REASONING,
    TRANSLATION,
    first_token_reaching,
    translation_segment_ids,
)


def _encode(tokenizer, *pieces: str) -> list[list[int]]:
    """Each piece encoded on its own, so token boundaries fall where the test says."""
    return [tokenizer(piece, add_special_tokens=False)["input_ids"] for piece in pieces]


def _reference_first_token(ids: list[int], tokenizer, prefix: str) -> int | None:
    """Linear scan: the first t whose decoded prefix starts with ``prefix``."""
    for t in range(len(ids)):
        if tokenizer.decode(ids[: t + 1], skip_special_tokens=True).startswith(prefix):
            return t
    return None


def _segments(tokenizer, ids: list[int], width: int | None = None) -> torch.Tensor:
    """translation_segment_ids of one completion, right-padded to ``width`` with pad ids."""
    width = width or len(ids)
    row = ids + [tokenizer.pad_token_id] * (width - len(ids))
    mask = [1.0] * len(ids) + [0.0] * (width - len(ids))
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return translation_segment_ids(torch.tensor([row]), torch.tensor([mask]), [text], tokenizer)[0]


def test_tag_split_over_several_bpe_tokens(plain_tokenizer):
    tok = plain_tokenizer
    assert len(tok.tokenize("</translation>")) > 1, "the plain tokenizer must split the tag"
    # Pieces: "<translation>Anna has 5" | "</tr" | "anslation" | "> A" | " 5 + 3"
    head, opening, middle, closing, tail = _encode(
        tok, "<translation>Anna has 5", "</tr", "anslation", "> A", " 5 + 3"
    )
    assert tok.decode(closing[:1]) == ">", "the '>' is a token of its own here"
    ids = head + opening + middle + closing + tail
    # The tag is complete at the first token of `closing`: index len(head + opening + middle).
    end = len(head) + len(opening) + len(middle)
    text = tok.decode(ids)
    assert first_token_reaching(ids, tok, text[: translation_segment_end(text)]) == end
    expected = [TRANSLATION] * (end + 1) + [REASONING] * (len(ids) - end - 1) + [PADDING] * 3
    assert _segments(tok, ids, width=len(ids) + 3).tolist() == expected


def test_token_that_completes_the_tag_and_starts_the_reasoning_is_translation(plain_tokenizer):
    tok = plain_tokenizer
    # ">\n" is one BPE token (learnt from "</translation>\n" in the gold completions): it ends
    # the tag and carries the reasoning's first character; it completes the tag, so it counts
    # as translation (docs/methods/tapo.md: "through the token that completes </translation>").
    head, opening, closing, tail = _encode(tok, "<translation>Q", "</translation", ">\n", "5")
    assert len(closing) == 1
    ids = head + opening + closing + tail
    end = len(head) + len(opening)
    expected = [TRANSLATION] * (end + 1) + [REASONING] * len(tail)
    assert _segments(tok, ids).tolist() == expected


def test_tag_as_one_added_token(tapo_tokenizer):
    tok = tapo_tokenizer
    close_id = tok.convert_tokens_to_ids("</translation>")
    head, tail = _encode(tok, "<translation>Anna has 5", " so 5 + 3 = 8")
    ids = head + [close_id] + tail + [tok.eos_token_id]
    end = len(head)  # the added token itself completes the tag
    text = tok.decode(ids, skip_special_tokens=True)
    assert first_token_reaching(ids, tok, text[: translation_segment_end(text)]) == end
    # The EOS counts (it is in the mask) and belongs to the reasoning segment.
    expected = [TRANSLATION] * (end + 1) + [REASONING] * (len(tail) + 1) + [PADDING] * 2
    assert _segments(tok, ids, width=len(ids) + 2).tolist() == expected


def test_only_the_first_closing_tag_counts(tapo_tokenizer):
    tok = tapo_tokenizer
    close_id = tok.convert_tokens_to_ids("</translation>")
    head, middle = _encode(tok, "<translation>Q", " A ")
    ids = head + [close_id] + middle + [close_id]
    end = len(head)
    assert _segments(tok, ids).tolist() == [TRANSLATION] * (end + 1) + [REASONING] * (
        len(middle) + 1
    )


@pytest.mark.parametrize("fixture", ["plain_tokenizer", "tapo_tokenizer"])
def test_no_closing_tag_is_all_translation(fixture, request):
    tok = request.getfixturevalue(fixture)
    (ids,) = _encode(tok, "<translation>Anna has 5 pencils. 5 + 3 = 8 </transl")
    assert (
        _segments(tok, ids, width=len(ids) + 2).tolist() == [TRANSLATION] * len(ids) + [PADDING] * 2
    )


def test_first_token_reaching_edge_cases(plain_tokenizer):
    tok = plain_tokenizer
    (ids,) = _encode(tok, "<translation>Q</translation>")
    assert first_token_reaching([], tok, "x") is None
    assert first_token_reaching(ids, tok, "<translation>Q</translation> more") is None
    assert first_token_reaching(ids, tok, "") == 0
    assert first_token_reaching(ids, tok, tok.decode(ids)) == len(ids) - 1


@given(
    st.lists(
        st.text(alphabet="<>/translationAQ 5+=\n", min_size=1, max_size=6), min_size=1, max_size=8
    ),
    st.integers(0, 7),
)
def test_binary_search_matches_a_linear_scan(plain_tokenizer, pieces, where):
    """Random completions (pieces encoded one by one, so the tag may be cut anywhere): the
    binary search finds the same token as a linear scan, and that token's text contains the
    closing '>' at character offset end - 1."""
    tok = plain_tokenizer
    pieces = list(pieces)
    pieces.insert(min(where, len(pieces)), "</translation>")
    ids = [i for piece in _encode(tok, *pieces) for i in piece]
    text = tok.decode(ids)
    end_char = translation_segment_end(text)
    assert end_char is not None
    found = first_token_reaching(ids, tok, text[:end_char])
    assert found == _reference_first_token(ids, tok, text[:end_char])
    # ASCII only, so characters and decoded lengths agree: token `found` spans end_char - 1.
    assert len(tok.decode(ids[:found])) < end_char <= len(tok.decode(ids[: found + 1]))
