"""Exact match: the generic prompt sets' reward (the ``grpo`` pipeline's synthetic default).

A pure function of strings: ``B`` completions and ``B`` gold answers in, ``B`` floats out.
"""

from __future__ import annotations

from collections.abc import Sequence


def normalise_answer(text: str | None) -> str:
    """``text`` with its outer whitespace stripped and inner runs of whitespace made one
    space: what two answers must share to match.

    >>> normalise_answer("  12 \\n"), normalise_answer("a  b")
    ('12', 'a b')
    """
    return " ".join(str(text).split()) if text is not None else ""


def exact_match_reward(
    completions: Sequence[str], answers: Sequence[str | None], case_sensitive: bool = True
) -> list[float]:
    """1.0 where the completion is the gold answer (both ``normalise_answer``-ed), else 0.0;
    0.0 where there is no gold answer (None or blank). ``case_sensitive=False`` compares
    case-folded text.

    >>> exact_match_reward(["7", " 7\\n", "7.", "Seven"], ["7", "7", "7", "seven"])
    [1.0, 1.0, 0.0, 0.0]
    >>> exact_match_reward(["Seven"], ["seven"], case_sensitive=False)
    [1.0]
    """
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completions but {len(answers)} answers")
    scores = []
    for completion, answer in zip(completions, answers, strict=True):
        gold, said = normalise_answer(answer), normalise_answer(completion)
        if not case_sensitive:
            gold, said = gold.casefold(), said.casefold()
        scores.append(float(bool(gold) and said == gold))
    return scores
