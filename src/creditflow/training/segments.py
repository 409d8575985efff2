"""Map character offsets in decoded completions to completion-token indices.

TAPO's translation segment (SPEC section 1) runs from the first completion token through the
token that completes ``</translation>``. The reward side finds that point as a character
offset in the decoded text; this module finds the token, for any tokenizer (the closing tag
may be one added token or several BPE pieces).
"""

from __future__ import annotations

import torch

from creditflow.rewards import translation_segment_end

TRANSLATION, REASONING, PADDING = 0, 1, -1


def first_token_reaching(token_ids: list[int], tokenizer, prefix: str) -> int | None:
    """Smallest t such that the decoding of ``token_ids[: t + 1]`` contains ``prefix`` in full
    as its start, i.e. the token that completes ``prefix``; None when no prefix of the tokens does.

    Binary search over t: "the decoded prefix starts with ``prefix``" is monotone in t once the
    prefix is reached (more tokens only append text).
    """

    def reaches(t: int) -> bool:
        return tokenizer.decode(token_ids[: t + 1], skip_special_tokens=True).startswith(prefix)

    if not token_ids or not reaches(len(token_ids) - 1):
        return None
    lo, hi = 0, len(token_ids) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def translation_segment_ids(
    completion_ids: torch.Tensor, completion_mask: torch.Tensor, texts: list[str], tokenizer
) -> torch.Tensor:
    """(B, T) long segment ids: 0 translation, 1 reasoning, -1 padding.

    completion_ids, completion_mask: (B, T); texts: the B decoded completions.
    A completion without ``</translation>`` is all translation segment.
    """
    segment_ids = torch.full_like(completion_ids, TRANSLATION)
    for row, text in enumerate(texts):
        end_char = translation_segment_end(text)
        if end_char is None:
            continue
        n_valid = int(completion_mask[row].sum())
        ids = completion_ids[row, :n_valid].tolist()
        end_token = first_token_reaching(ids, tokenizer, text[:end_char])
        if end_token is not None:
            segment_ids[row, end_token + 1 :] = REASONING
    return segment_ids.masked_fill(completion_mask == 0, PADDING)
