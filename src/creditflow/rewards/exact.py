"""Answer rewards of the generic prompt sets (the ``grpo`` pipeline): exact match (its synthetic
default), the final number of a sentence-style answer, and the number-only format.

Pure functions of strings: ``B`` completions (and ``B`` gold answers) in, ``B`` floats out.
"""

from __future__ import annotations

import re
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


# An integer or decimal, signed, thousands separators aside ("1,234" is 1234).
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> str | None:
    """The last number written in ``text`` (thousands separators dropped, a trailing ``.0``
    kept as written), or None.

    >>> final_number("15 + 19 = 34."), final_number("It is 1,200 apples"), final_number("none")
    ('34', '1200', None)
    """
    found = _NUMBER.findall(text or "")
    return found[-1].replace(",", "") if found else None


def final_number_reward(completions: Sequence[str], answers: Sequence[str | None]) -> list[float]:
    """1.0 where the last number of the completion is the gold answer, else 0.0 (0.0 without
    a gold answer): the answer a chat model gives in a sentence ("7 + 2 = 9.") counts, so a
    pretrained model that does not yet answer with the number alone still gets its credit.

    >>> final_number_reward(["7 + 2 = 9.", "The answer is 9", "9 or 8", "nine"], ["9"] * 4)
    [1.0, 1.0, 0.0, 0.0]
    """
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completions but {len(answers)} answers")
    return [
        float(bool(normalise_answer(gold)) and final_number(said) == normalise_answer(gold))
        for said, gold in zip(completions, answers, strict=True)
    ]


def number_format_reward(completions: Sequence[str]) -> list[float]:
    """1.0 where the completion is one number and nothing else (the format "Answer with the
    number only" asks for), right or wrong; else 0.0.

    >>> number_format_reward(["42", " -3\\n", "42.", "x = 42"])
    [1.0, 1.0, 0.0, 0.0]
    """
    return [float(_NUMBER.fullmatch(normalise_answer(c)) is not None) for c in completions]
