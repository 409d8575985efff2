"""TAPO's reasoning reward: is the last ``\\boxed{...}`` answer right? (SPEC 1).

The answer is located with plain string work in the calling process; the comparison with
the gold answer runs math_verify in a child process (see ``_timeout``) so that every
completion is bounded by a timeout that also works outside the main thread.
Lists are of length ``B`` (completions in a batch).
"""

import functools
import logging
import re

from creditflow.rewards._timeout import TimeoutWorker, WorkerError
from creditflow.rewards.format import translation_segment_end

logger = logging.getLogger(__name__)

_BOXED = re.compile(r"\\boxed\s*\{")
# Inside a group, only unescaped braces count: ``\{`` and ``\}`` are literal braces.
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)
# A run of thousands groups such as 2,125 or 1{,}234{,}567 (LaTeX's spacing-free comma);
# not part of a longer number (so 12,3456 and the tuple 1,2 stay as written).
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:(?:,|\{,\})\d{3})+(?![\d,])")


def extract_boxed_answer(completion: str) -> str | None:
    """The content of the LAST ``\\boxed{...}`` in the reasoning part, else None.

    The reasoning part is the text after the first ``</translation>`` (SPEC 1's reasoning
    segment); a completion without ``</translation>`` is searched whole, so the reward
    also serves math prompts that ask for no translation (TAPO's format is scored by the
    format reward, not here). None when there is no ``\\boxed{`` or the last one is never
    closed (a truncated answer is no answer).

    >>> extract_boxed_answer(
    ...     "<translation>Q</translation> \\\\boxed{1} so \\\\boxed{\\\\frac{1}{2}}"
    ... )
    '\\\\frac{1}{2}'
    """
    end = translation_segment_end(completion)
    reasoning = completion if end is None else completion[end:]
    last = None
    for last in _BOXED.finditer(reasoning):  # noqa: B007 - only the last match is wanted
        pass
    if last is None:
        return None
    depth = 1
    for token in _BRACE_OR_ESCAPE.finditer(reasoning, last.end()):
        if token.group() == "{":
            depth += 1
        elif token.group() == "}":
            depth -= 1
            if depth == 0:
                return reasoning[last.end() : token.start()]
    return None


def normalize_thousands(text: str) -> str:
    """Drop thousands separators: ``2,125`` -> ``2125`` (SPEC 1: commas must be handled).

    >>> normalize_thousands("1,234,567.5 and (1,2)")
    '1234567.5 and (1,2)'
    """
    return _THOUSANDS.sub(lambda m: m.group().replace("{,}", "").replace(",", ""), text)


def reasoning_reward(
    completions: list[str], answers: list[str | int | float], timeout_s: float = 5.0
) -> list[float]:
    """TAPO's reasoning reward R_reason in {0, 1} per completion (SPEC 1).

    1.0 iff the last ``\\boxed{...}`` of the reasoning part (:func:`extract_boxed_answer`),
    parsed with math_verify, equals the gold answer; 0.0 when it is wrong, missing,
    unclosed, empty or unparsable, and when the check exceeds ``timeout_s``. Thousands
    separators are removed from both sides first (:func:`normalize_thousands`).

    Args:
        completions: ``B`` decoded completions.
        answers: ``B`` gold answers, as strings (e.g. ``"2,125"``, ``"\\frac{1}{2}"``) or
            numbers.
        timeout_s: wall-clock budget of each completion's check, in seconds. A check
            that runs over scores 0.0 (the only way machine speed can change a reward).
            It is enforced by killing a worker process, so it works in any thread; the
            worker (started on first use, a few seconds) is then restarted on the next call.

    Returns:
        ``B`` floats in {0.0, 1.0}.

    >>> reasoning_reward(
    ...     ["... = \\\\boxed{2,125}", "\\\\boxed{2126}", "2125"], ["2125", 2125, "2125"]
    ... )
    [1.0, 0.0, 0.0]
    """
    if len(completions) != len(answers):
        raise ValueError(
            f"got {len(completions)} completions but {len(answers)} answers; pass one gold "
            "answer per completion (repeat each prompt's answer G times)"
        )
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    return [_score_one(c, a, timeout_s) for c, a in zip(completions, answers, strict=True)]


def _score_one(completion: str, answer: str | int | float, timeout_s: float) -> float:
    predicted = extract_boxed_answer(completion)
    if predicted is None:
        return 0.0
    predicted = normalize_thousands(predicted).strip()
    gold = normalize_thousands(str(answer)).strip()
    if not predicted or not gold:
        return 0.0
    try:
        same = _VERIFIER.call(_verify_in_worker, predicted, gold, timeout_s=timeout_s)
    except TimeoutError:
        logger.warning("answer check timed out after %s s: %.80r", timeout_s, predicted)
        return 0.0
    except WorkerError as err:
        # Model output may make the parser raise or even crash the worker (deep nesting
        # can overflow the C stack); either way the answer was not verifiable: score 0.
        logger.warning("answer check failed (%s): %.80r", err, predicted)
        return 0.0
    return 1.0 if same else 0.0


# --- runs in the worker process -------------------------------------------------------
# math_verify (and sympy behind it) is imported there only: the calling process never
# needs it, and its import costs about a second.


def _verify_in_worker(predicted: str, gold: str) -> bool:
    """math_verify's verdict on ``\\boxed{predicted}`` against the gold answer."""
    from math_verify import parse, verify  # noqa: PLC0415 - worker-only import, see above

    # parsing_timeout / timeout_seconds None: math_verify's SIGALRM timeout is off, the
    # parent's deadline bounds the whole call instead (see _timeout).
    try:
        gold_parsed = _parse_gold(gold)
        predicted_parsed = parse(f"\\boxed{{{predicted}}}", parsing_timeout=None)
        if not gold_parsed or not predicted_parsed:
            return False
        return bool(verify(gold_parsed, predicted_parsed, timeout_seconds=None))
    except Exception:
        # Deliberately broad: model junk can make antlr / latex2sympy / sympy raise nearly
        # anything (RecursionError, ValueError past int's digit limit, TypeError, ...)
        # despite math_verify's raise_on_error=False. An unverifiable answer is a wrong
        # answer (SPEC 1), never a crashed training step.
        return False


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list:
    # A group's G completions share one gold answer: parse it once.
    from math_verify import parse  # noqa: PLC0415 - worker-only import, see above

    text = gold if "\\boxed" in gold else f"\\boxed{{{gold}}}"
    return parse(text, parsing_timeout=None)


def _warm_up() -> None:
    """Import math_verify and run one check, so a call's timeout measures the call alone."""
    # The SIGALRM-free mode logs "Timeout is disabled ..." warnings; here that is by design.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _verify_in_worker("1", "1")


_VERIFIER = TimeoutWorker(warm_up=_warm_up)
