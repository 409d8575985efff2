"""TAPO's output format: ``<translation>ENGLISH QUESTION</translation>`` then the reasoning (docs/methods/tapo.md).

Everything here is plain string work on one completion at a time; lists are of length
``B`` (completions in a batch). Tags are matched case-sensitively and literally.
"""

TRANSLATION_OPEN = "<translation>"
TRANSLATION_CLOSE = "</translation>"


def extract_translation(completion: str) -> str | None:
    """The translation text of a well-formed completion, else None.

    Well-formed (docs/methods/tapo.md, the format reward): the completion holds exactly one
    ``<translation>`` and exactly one ``</translation>`` (so nested or repeated blocks
    fail), only whitespace precedes ``<translation>``, the text between the tags is
    non-empty after ``str.strip()``, and non-whitespace text follows ``</translation>``.

    Returns:
        The text between the tags, stripped of surrounding whitespace.

    >>> extract_translation("<translation> Two plus two? </translation> 2 + 2 = \\\\boxed{4}")
    'Two plus two?'
    >>> extract_translation("<translation>Two plus two?</translation>") is None  # no reasoning
    True
    """
    body = completion.lstrip()
    if not body.startswith(TRANSLATION_OPEN):
        return None
    if completion.count(TRANSLATION_OPEN) != 1 or completion.count(TRANSLATION_CLOSE) != 1:
        return None
    # The only opening tag is at the start, so the only closing tag comes after it.
    close = body.find(TRANSLATION_CLOSE)
    translation = body[len(TRANSLATION_OPEN) : close].strip()
    reasoning = body[close + len(TRANSLATION_CLOSE) :]
    if not translation or not reasoning.strip():
        return None
    return translation


def format_reward(completions: list[str]) -> list[float]:
    """TAPO's format reward F in {0, 1} per completion (docs/methods/tapo.md).

    1.0 iff :func:`extract_translation` finds a well-formed translation block (exactly one
    block, first, non-empty, followed by text); 0.0 otherwise.

    Args:
        completions: ``B`` decoded completions.

    Returns:
        ``B`` floats in {0.0, 1.0}.

    >>> format_reward(["<translation>Q</translation> A", "Q A", "<translation></translation> A"])
    [1.0, 0.0, 0.0]
    """
    return [0.0 if extract_translation(c) is None else 1.0 for c in completions]


def translation_segment_end(completion: str) -> int | None:
    """Where the translation segment ends, as a character offset into ``completion``.

    docs/methods/tapo.md: the translation segment runs from the first completion token through the
    token that completes ``</translation>``; the reasoning segment is every later token.

    Returns:
        ``i + len("</translation>")`` for the index ``i`` of the FIRST ``</translation>``,
        i.e. the offset just past its closing ``>``: ``completion[:end]`` is the
        translation segment (ending in ``</translation>``) and ``completion[end:]`` the
        reasoning. Offsets count Python ``str`` code points, not bytes or tokens; the
        engine maps this offset to the token whose character span contains ``end - 1``.
        None when the completion has no ``</translation>``: it is all translation segment
        (it never reached the reasoning). The format need not be valid: only the first
        closing tag matters.

    >>> translation_segment_end("<translation>Q</translation> A")
    28
    >>> translation_segment_end("<translation>Q ...") is None
    True
    """
    close = completion.find(TRANSLATION_CLOSE)
    return None if close < 0 else close + len(TRANSLATION_CLOSE)
