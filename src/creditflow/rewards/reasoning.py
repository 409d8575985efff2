"""TAPO's reasoning reward: is the last ``\\boxed{...}`` answer right? (docs/methods/tapo.md).

The answer is located with plain string work in the calling process; the comparison with
the gold answer runs math_verify in a child process (see ``_timeout``) so that every
completion is bounded by a timeout that also works outside the main thread.

Hostile output: answers such as ``9^{9^{9^{9}}}``, ``(10^{10})!`` or 100k nested
braces keep sympy busy until the timeout kills it, and each costs the whole timeout plus a
worker restart. So answers are screened before anything parses them (:func:`screen_answer`:
length, nesting and the size of the numbers they spell), the checks of one batch share a
wall-clock budget (:func:`check_pairs`), and each completion's outcome (``OUTCOMES``) is
reported, so a run can count the checks that were rejected, timed out or left over.
Lists are of length ``B`` (completions in a batch).
"""

import functools
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable

from creditflow.errors import WorkerError
from creditflow.rewards._timeout import TimeoutWorker
from creditflow.rewards.format import translation_segment_end

logger = logging.getLogger(__name__)

_BOXED = re.compile(r"\\boxed\s*\{")
# Inside a group, only unescaped braces count: ``\{`` and ``\}`` are literal braces.
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)
# A run of thousands groups such as 2,125 or 1{,}234{,}567 (LaTeX's spacing-free comma);
# not part of a longer number (so 12,3456 and the tuple 1,2 stay as written).
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:(?:,|\{,\})\d{3})+(?![\d,])")

# What happened to one completion's answer check; the reward is 1.0 for RIGHT only.
RIGHT = "right"  # math_verify: equal to the gold answer
WRONG = "wrong"  # math_verify: not equal, or unparsable
NO_ANSWER = "no_answer"  # no closed, non-empty \boxed{...} (or an empty gold answer)
REJECTED = "rejected"  # screened out before parsing (screen_answer), predicted or gold
FAILED = "failed"  # the check raised or crashed the worker (e.g. a C stack overflow)
TIMED_OUT = "timed_out"  # the check ran past timeout_s
OVER_BUDGET = "over_budget"  # the batch's budget_s ran out before the check finished
OUTCOMES = (RIGHT, WRONG, NO_ANSWER, REJECTED, FAILED, TIMED_OUT, OVER_BUDGET)
# The outcomes the registry reports per completion, for a run to count.
FLAGS = (REJECTED, TIMED_OUT, OVER_BUDGET)

# screen_answer's caps. Real gold answers (GSM8K, MGSM, TAPO's synthetic tasks, TabMWP,
# MathVision) have at most 9 characters, no nesting and 7 digits; MATH-style answers rarely
# pass 200 characters or nesting 4. What math_verify 0.9 / sympy 1.14 did with more (one
# check, this machine): 10 nested braces 0.6 s, 15 4.5 s, 20 never finished (20 nested
# \frac neither); 10^{10^6} 0.16 s, 10^{10^7} never finished; 100000! 0.08 s, 1000000! 4 s.
MAX_ANSWER_CHARS = 1000
MAX_NESTING = 8
MAX_DIGITS = 10_000
# Under a budget every check first gets this long; those that overrun it are retried with the
# full timeout_s after all the others, so a few slow answers cannot spend the budget the
# ordinary ones need (about 1 ms each).
FIRST_PASS_TIMEOUT_S = 1.0


def extract_boxed_answer(completion: str) -> str | None:
    """The content of the LAST ``\\boxed{...}`` in the reasoning part, else None.

    The reasoning part is the text after the first ``</translation>`` (docs/methods/tapo.md's reasoning
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
    """Drop thousands separators: ``2,125`` -> ``2125`` (docs/methods/tapo.md: commas must be handled).

    >>> normalize_thousands("1,234,567.5 and (1,2)")
    '1234567.5 and (1,2)'
    """
    return _THOUSANDS.sub(lambda m: m.group().replace("{,}", "").replace(",", ""), text)


def gold_answer(answer: str | int | float) -> str:
    """A gold answer as the reward compares it: a string, thousands separators dropped, outer
    whitespace stripped. Task-source loaders check gold answers in this form, as the reward
    will read them.

    >>> gold_answer(" 2,125 "), gold_answer(7)
    ('2125', '7')
    """
    return normalize_thousands(str(answer)).strip()


def screen_answer(
    answer: str,
    max_chars: int = MAX_ANSWER_CHARS,
    max_nesting: int = MAX_NESTING,
    max_digits: int = MAX_DIGITS,
) -> str | None:
    """Why ``answer`` must not reach math_verify, or None when it may.

    Cheapest first: more than ``max_chars`` characters; brackets (``{}``, ``()``, ``[]``)
    nested deeper than ``max_nesting``; a number, or a power, factorial, Gamma, binomial,
    sum, product or fraction of numbers, whose value has more than ``max_digits`` decimal
    digits by an upper bound (towers such as ``9^{9^{9^{9}}}``, factorials such as
    ``(10^{10})!``). Expressions with symbols are not sized (``e^{x^{2}}`` is cheap,
    ``(a+b+c+d)^{20}`` took 2.8 s to expand): the timeout and the budget bound those.

    >>> screen_answer("\\\\frac{1}{2}") is None
    True
    >>> screen_answer("(10^{10})!")
    'a number of more than 10000 digits'
    """
    if len(answer) > max_chars:
        return f"longer than {max_chars} characters"
    if _nesting(answer) > max_nesting:
        return f"nested deeper than {max_nesting}"
    try:
        _NumberSize(answer, max_digits).sequence(closer=None)
    except _TooBig:
        return f"a number of more than {max_digits} digits"
    except RecursionError:  # unbraced \sqrt\sqrt\sqrt...: nesting all the same
        return f"nested deeper than {max_nesting}"
    return None


def reasoning_outcomes(
    completions: list[str],
    answers: list[str | int | float],
    timeout_s: float = 5.0,
    budget_s: float | None = 30.0,
    max_answer_chars: int = MAX_ANSWER_CHARS,
    max_nesting: int = MAX_NESTING,
    max_digits: int = MAX_DIGITS,
) -> list[str]:
    """What the check of each completion's answer came to: ``B`` of ``OUTCOMES``.

    See :func:`reasoning_reward` for the arguments; it is 1.0 exactly where this is RIGHT.

    >>> reasoning_outcomes(["\\\\boxed{4}", "\\\\boxed{9^{9^{9^{9}}}}", "4"], ["4", "4", "4"])
    ['right', 'rejected', 'no_answer']
    """
    if len(completions) != len(answers):
        raise ValueError(
            f"got {len(completions)} completions but {len(answers)} answers; pass one gold "
            "answer per completion (repeat each prompt's answer G times)"
        )
    _check_limits(timeout_s, budget_s, max_answer_chars, max_nesting, max_digits)
    screens: dict[str, str | None] = {}  # a group's G completions share one gold answer

    def rejected(text: str) -> bool:
        if text not in screens:
            screens[text] = screen_answer(text, max_answer_chars, max_nesting, max_digits)
        return screens[text] is not None

    outcomes: list[str | None] = [None] * len(completions)
    rows_of: dict[tuple[str, str], list[int]] = {}  # (predicted, gold) -> rows; checked once
    for row, (completion, answer) in enumerate(zip(completions, answers, strict=True)):
        predicted = extract_boxed_answer(completion)
        gold = gold_answer(answer)
        # Dropping thousands separators at most halves a text ("{,}123"): past twice the cap
        # it is rejected before the regex work on a possibly huge string.
        if predicted is not None and len(predicted) > 2 * max_answer_chars:
            outcomes[row] = REJECTED
            continue
        predicted = normalize_thousands(predicted or "").strip()
        if not predicted or not gold:
            outcomes[row] = NO_ANSWER
        elif rejected(predicted) or rejected(gold):
            outcomes[row] = REJECTED
        else:
            rows_of.setdefault((predicted, gold), []).append(row)
    if rows_of:
        _start_verifier()  # its start (seconds on first use) is no part of the budget
    checked = check_pairs(list(rows_of), _verify, timeout_s, budget_s)
    for rows, outcome in zip(rows_of.values(), checked, strict=True):
        for row in rows:
            outcomes[row] = outcome
    _log_outcomes(outcomes, timeout_s, budget_s)
    return outcomes


def reasoning_reward(
    completions: list[str],
    answers: list[str | int | float],
    timeout_s: float = 5.0,
    budget_s: float | None = 30.0,
    max_answer_chars: int = MAX_ANSWER_CHARS,
    max_nesting: int = MAX_NESTING,
    max_digits: int = MAX_DIGITS,
) -> list[float]:
    """TAPO's reasoning reward R_reason in {0, 1} per completion (docs/methods/tapo.md).

    1.0 iff the last ``\\boxed{...}`` of the reasoning part (:func:`extract_boxed_answer`),
    parsed with math_verify, equals the gold answer; 0.0 when it is wrong, missing,
    unclosed, empty or unparsable, when it or the gold answer fails :func:`screen_answer`,
    and when its check runs out of time. Thousands separators are removed from both sides
    first (:func:`normalize_thousands`). Completions with the same answer and gold answer
    are checked once.

    Args:
        completions: ``B`` decoded completions.
        answers: ``B`` gold answers, as strings (e.g. ``"2,125"``, ``"\\frac{1}{2}"``) or
            numbers.
        timeout_s: wall-clock limit of one check, in seconds. It is enforced by killing a
            worker process, so it works in any thread; the worker (started on first use, a
            few seconds) is then restarted on the next check (about 0.3 s).
        budget_s: wall-clock budget of all the batch's checks, in seconds (see
            :func:`check_pairs`); the checks it leaves undone score 0.0. None: no budget.
            Time limits are the only way machine speed can change a reward; an ordinary
            check takes about a millisecond, so only slow answers ever meet them.
        max_answer_chars, max_nesting, max_digits: the caps of :func:`screen_answer`.

    Returns:
        ``B`` floats in {0.0, 1.0}.

    >>> reasoning_reward(
    ...     ["... = \\\\boxed{2,125}", "\\\\boxed{2126}", "2125"], ["2125", 2125, "2125"]
    ... )
    [1.0, 0.0, 0.0]
    """
    outcomes = reasoning_outcomes(
        completions, answers, timeout_s, budget_s, max_answer_chars, max_nesting, max_digits
    )
    return [1.0 if outcome == RIGHT else 0.0 for outcome in outcomes]


def check_pairs(
    pairs: list[tuple[str, str]],
    verify: Callable[..., bool],
    timeout_s: float,
    budget_s: float | None,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """The outcome of each ``(predicted, gold)`` check, all of them within ``budget_s``.

    ``verify(predicted, gold, timeout_s=t)`` says whether the answers are equal; it raises
    TimeoutError past ``t`` seconds and WorkerError when the check fails. Without a budget
    each pair gets ``timeout_s``. With one, a first pass gives each pair at most
    ``FIRST_PASS_TIMEOUT_S``, a second retries those that overran it with the full
    ``timeout_s``, and no check may run past ``budget_s`` after the start (as told by
    ``clock``): a pair whose check the budget cut short or never started is OVER_BUDGET.
    A pair is TIMED_OUT only when it had the whole ``timeout_s``.

    Returns:
        one of RIGHT, WRONG, FAILED, TIMED_OUT, OVER_BUDGET per pair.
    """

    def attempt(pair: tuple[str, str], limit: float) -> str:
        try:
            return RIGHT if verify(*pair, timeout_s=limit) else WRONG
        except TimeoutError:
            return TIMED_OUT
        except WorkerError:
            return FAILED

    if budget_s is None:
        return [attempt(pair, timeout_s) for pair in pairs]
    deadline = clock() + budget_s
    outcomes = [OVER_BUDGET] * len(pairs)
    first_limit = min(timeout_s, FIRST_PASS_TIMEOUT_S)
    retry = []
    for k, pair in enumerate(pairs):
        left = deadline - clock()
        if left <= 0:
            return outcomes
        outcome = attempt(pair, min(first_limit, left))
        if outcome != TIMED_OUT or timeout_s <= min(first_limit, left):
            outcomes[k] = outcome
        elif first_limit < left:  # it overran the first pass, not the budget
            retry.append(k)
    for k in retry:
        left = deadline - clock()
        if left <= 0:
            break
        outcome = attempt(pairs[k], min(timeout_s, left))
        if outcome != TIMED_OUT or timeout_s <= left:
            outcomes[k] = outcome
    return outcomes


def _check_limits(
    timeout_s: float,
    budget_s: float | None,
    max_answer_chars: int,
    max_nesting: int,
    max_digits: int,
) -> None:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 seconds or None (no budget), got {budget_s}")
    caps = {"max_answer_chars": max_answer_chars, "max_nesting": max_nesting}
    for name, cap in {**caps, "max_digits": max_digits}.items():
        if not (isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1):
            raise ValueError(f"{name} must be an int >= 1, got {cap!r}")


def _verify(predicted: str, gold: str, timeout_s: float) -> bool:
    return _VERIFIER.call(_verify_in_worker, predicted, gold, timeout_s=timeout_s)


def _start_verifier() -> None:
    try:
        _VERIFIER.start()
    except WorkerError:
        pass  # every check will try again, and fail (FAILED) if it cannot start either


def _log_outcomes(outcomes: list[str], timeout_s: float, budget_s: float | None) -> None:
    counts = Counter(outcomes)
    if counts[TIMED_OUT] or counts[OVER_BUDGET]:
        logger.warning(
            "reasoning reward: of %d answer checks %d timed out (%s s each) and %d were cut "
            "short or skipped by the batch budget (%s s); they score 0",
            len(outcomes),
            counts[TIMED_OUT],
            timeout_s,
            counts[OVER_BUDGET],
            budget_s,
        )
    if counts[REJECTED] or counts[FAILED]:
        logger.debug(
            "reasoning reward: %d answers rejected unparsed, %d checks failed",
            counts[REJECTED],
            counts[FAILED],
        )


def _nesting(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "})]":
            depth = max(depth - 1, 0)
    return deepest


# --- sizing the numbers an answer spells (screen_answer) -------------------------------
# A size is an upper bound on |log10| of a value: its decimal digits, or those of its
# reciprocal. None: not a number (a symbol, a function, a tuple); its parts are still sized.

_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|!!|\\[A-Za-z]+|\\.|\s+|.", re.DOTALL | re.ASCII)
_DIGITS = "0123456789"  # ASCII: str.isdigit also takes "²", which float() refuses
_SUMS = {"+", "-", "\\pm"}
_PRODUCTS = {"*", "/", "\\cdot", "\\times", "\\div"}
_FRACTIONS = {"\\frac", "\\dfrac", "\\tfrac"}
_GROUPS = {"{": "}", "(": ")", "[": "]"}
_LAYOUT = {
    "\\left",
    "\\right",
    "\\,",
    "\\!",
    "\\;",
    "\\:",
    "\\ ",
    "\\quad",
    "\\qquad",
    "\\displaystyle",
}
# Past 10^300, 10**size overflows a float; no value that large fits any cap anyway.
_HUGE = 300.0


class _TooBig(Exception):
    pass


class _NumberSize:
    """A recursive descent over an answer's tokens that sizes every numeric subexpression
    and raises _TooBig at the first one over ``max_digits``. Powers are right-associative
    (``a^b^c = a^(b^c)``); an unbraced exponent is its whole digit run (LaTeX would take
    one digit), which can only overestimate."""

    def __init__(self, text: str, max_digits: int) -> None:
        tokens = _TOKEN.findall(text)
        self.tokens = [t for t in tokens if not t.isspace() and t not in _LAYOUT]
        self.i = 0
        self.max_digits = max_digits

    def sequence(self, closer: str | None) -> float | None:
        """Terms up to ``closer`` (None: the end), joined by sums, products or juxtaposition."""
        terms: list[float | None] = []
        product, after_operator = False, True
        while self.i < len(self.tokens):
            token = self.tokens[self.i]
            if token == closer:
                self.i += 1
                break
            if token in _SUMS or token in _PRODUCTS:
                product |= token in _PRODUCTS
                after_operator = True
                self.i += 1
                continue
            product |= not after_operator  # 2(3) multiplies
            after_operator = False
            terms.append(self.operand())
        if not terms or None in terms:
            return None
        # |log10| of a sum is at most its largest term's plus log10(terms); of a product or
        # quotient at most the sum of its factors'.
        size = (sum(terms) if product else max(terms)) + math.log10(len(terms))
        return self.checked(size)

    def operand(self) -> float | None:
        sizes = [self.postfix(self.atom())]
        while self.peek() == "^":
            self.i += 1
            sizes.append(self.postfix(self.atom()))
        size = sizes.pop()
        while sizes:
            size = self.power(sizes.pop(), size)
        return size

    def atom(self) -> float | None:
        if self.i >= len(self.tokens):
            return None
        token = self.tokens[self.i]
        self.i += 1
        if token[0] in _DIGITS or (token[0] == "." and len(token) > 1):
            return self.checked(_literal_size(token))
        if token in _GROUPS:
            return self.sequence(_GROUPS[token])
        return self.command(token)

    def command(self, token: str) -> float | None:
        """A LaTeX command and its arguments; None for any other token (a symbol)."""
        if token in _FRACTIONS or token == "\\binom":
            a, b = self.atom(), self.atom()
            if a is None or b is None:
                return None
            # |log10(a / b)| <= |log10 a| + |log10 b|; |log10 C(a, b)| <= b |log10 a|
            return self.checked(a + b) if token in _FRACTIONS else self.power(a, b)
        if token == "\\Gamma":  # Gamma(n) = (n - 1)!
            return self.factorial(self.atom())
        if token == "\\sqrt":
            if self.peek() == "[":  # the root's index: a root is no larger than its radicand
                self.i += 1
                self.sequence("]")
            return self.atom()
        return None

    def postfix(self, size: float | None) -> float | None:
        while self.peek() in ("!", "!!"):  # n!! <= n!
            self.i += 1
            size = self.factorial(size)
        return size

    def factorial(self, size: float | None) -> float | None:
        if size is None:
            return None
        if size > _HUGE:
            raise _TooBig
        n = 10.0**size
        return self.checked(n * math.log10(max(n, 2.0)))  # log10(n!) <= n log10 n

    def power(self, base: float | None, exponent: float | None) -> float | None:
        if base is None or exponent is None:
            return None
        if base == 0.0:  # 0 or 1 to any power
            return 0.0
        if exponent > _HUGE:
            raise _TooBig
        return self.checked(10.0**exponent * base)  # |log10(b^e)| = |e| |log10 b|

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def checked(self, size: float) -> float:
        if size > self.max_digits:
            raise _TooBig
        return size


def _literal_size(token: str) -> float:
    """|log10| of a decimal literal, from its digits (any length, no float overflow)."""
    whole, _, fraction = token.partition(".")
    whole = whole.lstrip("0")
    if whole:
        head = whole[:15]
        return math.log10(float(head)) + len(whole) - len(head)
    zeros = len(fraction) - len(fraction.lstrip("0"))
    return zeros + 1.0 if fraction.strip("0") else 0.0


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
        # answer (docs/methods/tapo.md), never a crashed training step.
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
