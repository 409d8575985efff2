"""Seeded multilingual arithmetic word problems for TAPO (docs/methods/tapo.md).

Each row is a short word problem ("Anna has 5 pencils. She buys 3 pencils. She sells 2 pencils.
How many pencils does Anna have now?") in one language, its English reference translation
(the pivot the policy must produce inside ``<translation>...</translation>``), the integer answer
and the arithmetic chain in English, used to build the SFT warm-start target.

Conventions, chosen once here:

- ``question_en`` always writes numbers as digits, whatever the style of ``question``; the
  reference answer to "translate" is therefore the digit form, and the numbers of a problem can be
  read back from ``question_en`` with ``re.findall(r"\\d+", ...)`` in the order they are used.
  For ``language == "en"`` the question itself may spell numbers as words, so ``question`` and
  ``question_en`` can differ in number style only.
- Numbers in ``question`` are written as words (in that language, 0..20) or digits, drawn per
  number from ``number_style_probs``; numbers above 20 are always digits.
- Operands are at least ``MIN_OPERAND`` (2): every counted noun is then plural, which avoids the
  singular / gendered "one" (German "ein/eine", Russian "один/одна") that would need agreement
  rules. Russian counted nouns still decline (2-4 vs 5-20); all Russian nouns are masculine so
  the citation number words fit. Swahili nouns are all N-class, whose numbers take no prefix.
- Subtraction never goes below zero: a problem whose running total would drop below the next
  subtrahend is redrawn (rejection sampling), so answers are integers >= 0.
- ``variant="conflict"`` inserts one distractor sentence per problem, a
  number the answer does not use: "Tom's neighbor buys 7 glasses." (same object, another
  owner), at a random place after the intro. A faithful translation keeps it (``question_en``
  does, so chrF++ rewards keeping it); reading the faithful translation literally, every
  number a step, gives ``answer + distractor``, a wrong answer, while a sloppy translation
  that drops the sentence loses chrF++ and reads off the right answer. Translation quality
  and answer correctness then pull apart, the conflict TAPO's step-level advantages are for.
  The step after a distractor names its actor again (a pronoun could mean the neighbor), and
  ``question_en``'s numbers are then the used ones plus the distractor; ``reasoning_en``,
  ``answer`` and ``n_operations`` still cover the steps only. ``"standard"`` draws exactly
  the problems it drew before the variant existed.
- ``n_problems`` is the number of problems *per language*. Rows are drawn independently per
  language (the same index in two languages is not the same problem), from a stream seeded by
  ``(seed, language)``: the rows of one language do not depend on which other languages were
  asked for. IDs are ``tapo-{language}-{index:05d}`` with a per-language index.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

import pandas as pd

from creditflow.tasks.tapo_languages import _CONCEPTS, _EN, _LANGUAGES, _SCENARIOS, _Language, _Name

TAPO_INSTRUCTION = (
    "Translate the question into English inside <translation></translation>, "
    "then solve it and put the final answer in \\boxed{}."
)

# The project's math-text schema first, then the TAPO extras.
TAPO_COLUMNS = (
    "id",
    "language",
    "question",
    "question_en",
    "answer",
    "reasoning_en",
    "template_id",
    "n_operations",
)

OPERATIONS = ("add", "sub")
VARIANTS = ("standard", "conflict")
NUMBER_STYLES = ("digits", "words")
DEFAULT_NUMBER_STYLE_PROBS: Mapping[str, float] = MappingProxyType({"digits": 0.5, "words": 0.5})
MIN_OPERAND = 2  # see module docstring: keeps every counted noun plural
_MAX_DRAWS = 10_000  # rejection-sampling guard; validation makes success possible, so never hit
ALL_LANGUAGES: tuple[str, ...] = tuple(_LANGUAGES)
# Every default language has an MGSM counterpart for evaluation (sw is in MGSM's language holdout).
DEFAULT_LANGUAGES: tuple[str, ...] = ("en", "de", "es", "fr", "ru", "zh", "sw")


@dataclass(frozen=True)
class _Problem:
    scenario: str
    name_index: int
    concept: str
    start: int
    steps: tuple[tuple[str, int], ...]  # (operation, operand) in order
    words: tuple[bool, ...]  # per number (start first): spell it out in the question?
    # variant="conflict": (slot, number, as words); the sentence follows the intro and the
    # first `slot` steps. None: no distractor.
    distractor: tuple[int, int, bool] | None = None

    @property
    def answer(self) -> int:
        total = self.start
        for operation, operand in self.steps:
            total = total + operand if operation == "add" else total - operand
        return total


def _draw_problem(
    rng: random.Random,
    *,
    max_operand: int,
    operations: Sequence[str],
    operation_counts: Sequence[int],
    words_prob: float,
    n_names: int,
) -> _Problem:
    scenario = rng.choice(_SCENARIOS)
    name_index = rng.randrange(n_names)
    concept = rng.choice(_CONCEPTS)
    n_steps = rng.choice(operation_counts)
    for _ in range(_MAX_DRAWS):
        kinds = [rng.choice(operations) for _ in range(n_steps)]
        start = total = rng.randint(MIN_OPERAND, max_operand)
        steps = []
        for kind in kinds:
            if kind == "sub" and total < MIN_OPERAND:
                break  # the subtrahend would exceed the running total: redraw (answers >= 0)
            operand = rng.randint(
                MIN_OPERAND, max_operand if kind == "add" else min(max_operand, total)
            )
            total += operand if kind == "add" else -operand
            steps.append((kind, operand))
        else:
            words = tuple(rng.random() < words_prob for _ in range(n_steps + 1))
            return _Problem(scenario, name_index, concept, start, tuple(steps), words)
    raise RuntimeError(f"no non-negative problem found in {_MAX_DRAWS} draws; raise max_operand")


def _with_distractor(
    rng: random.Random, problem: _Problem, *, max_operand: int, words_prob: float
) -> _Problem:
    """``problem`` with one distractor (variant="conflict"), drawn after the problem itself so
    the standard variant's stream is untouched."""
    slot = rng.randint(0, len(problem.steps))
    number = rng.randint(MIN_OPERAND, max_operand)
    return replace(problem, distractor=(slot, number, rng.random() < words_prob))


def _render(language: _Language, problem: _Problem, name: _Name, english: bool) -> str:
    """Write ``problem`` in ``language``; ``english`` renders the reference (romanised name, digits)."""
    template = language.templates[problem.scenario]
    forms = language.objects[problem.concept]
    numbers = (problem.start, *(operand for _, operand in problem.steps))

    def counted_number(n: int, words: bool) -> str:
        as_words = words and not english and n < len(language.number_words)
        return language.count(n, language.number_words[n] if as_words else str(n), forms)

    def counted(position: int) -> str:
        return counted_number(numbers[position], problem.words[position])

    name_text = name.english if english else name.native
    pron_initial, pron_inline = language.pronouns[name.gender]
    fields = {
        **forms,
        "obj": forms["q"],
        "name": name_text,
        "name_gen": name_text if english else (name.genitive or name_text),
        "pron": pron_inline,
    }
    # The first step names the actor when the intro has not (the "box" story); then a pronoun.
    named = "{name" in template.intro
    sentences = [template.intro.format(**fields, a=counted(0))]
    slot, number, words = problem.distractor or (None, 0, False)
    neighbor = language.distractor.format(**fields, d=counted_number(number, words))
    for k, (operation, _) in enumerate(problem.steps):
        if k == slot:
            sentences.append(neighbor)
            named = False  # after the neighbor's sentence a pronoun would be ambiguous
        subject = pron_initial if named else name_text
        named = True
        step = template.add if operation == "add" else template.sub
        sentences.append(step.format(**fields, Subj=subject, b=counted(k + 1)))
    if slot == len(problem.steps):
        sentences.append(neighbor)
    sentences.append(template.question.format(**fields))
    return language.sentence_separator.join(sentences)


def _reasoning_chain(problem: _Problem) -> str:
    """The arithmetic in English, one equation per step: ``"5 + 3 = 8. 8 - 2 = 6."``."""
    total, parts = problem.start, []
    for operation, operand in problem.steps:
        new = total + operand if operation == "add" else total - operand
        parts.append(f"{total} {'+' if operation == 'add' else '-'} {operand} = {new}.")
        total = new
    return " ".join(parts)


def _check_known(kind: str, given: Sequence[str], valid: Sequence[str]) -> None:
    if isinstance(given, str):
        raise ValueError(
            f"{kind} must be a sequence of names, not the string {given!r}; wrap it: [{given!r}]"
        )
    unknown = [g for g in given if g not in valid]
    if unknown:
        raise ValueError(f"unknown {kind} {unknown}; valid: {list(valid)}")


def _words_probability(number_style_probs: Mapping[str, float]) -> float:
    _check_known("number styles", list(number_style_probs), NUMBER_STYLES)
    probs = [float(number_style_probs.get(style, 0.0)) for style in NUMBER_STYLES]
    if any(not math.isfinite(p) or p < 0 for p in probs) or not math.isclose(sum(probs), 1.0):
        raise ValueError(
            f"number_style_probs must be non-negative and sum to 1, got {dict(number_style_probs)}; "
            'e.g. {"digits": 0.5, "words": 0.5}'
        )
    return float(number_style_probs.get("words", 0.0))


def generate_tapo_problems(
    n_problems: int,
    languages: Sequence[str] = DEFAULT_LANGUAGES,
    seed: int = 0,
    *,
    max_operand: int = 20,
    operations: Sequence[str] = OPERATIONS,
    number_style_probs: Mapping[str, float] = DEFAULT_NUMBER_STYLE_PROBS,
    operation_counts: Sequence[int] = (1, 2),
    variant: str = "standard",
) -> pd.DataFrame:
    """Draw ``n_problems`` word problems per language, with English references and answers.

    Args:
        n_problems: problems per language (>= 0); the frame has ``n_problems * len(languages)`` rows,
            grouped by language in the order given.
        languages: codes from ``ALL_LANGUAGES``, no repeats.
        seed: each language draws from ``random.Random(f"tapo:{seed}:{language}")`` (string seeds
            hash with SHA-512, not Python's randomised ``hash``), so the frame is identical across
            runs and machines.
        max_operand: largest number in a question; every number is in [MIN_OPERAND, max_operand].
        operations: step kinds to draw from, uniformly: "add", "sub".
        number_style_probs: probability that a number in ``question`` is written as "digits" or
            "words" (drawn per number; numbers above 20 are always digits). ``question_en``
            always uses digits.
        operation_counts: numbers of steps to draw from, uniformly (the method's tasks use 1 or 2).
        variant: ``"standard"``, or ``"conflict"``: one distractor sentence per problem, which
            a faithful translation keeps and the answer does not use (module docstring).

    Returns:
        DataFrame with columns ``TAPO_COLUMNS``: ``id`` (``tapo-{language}-{index:05d}``),
        ``language``, ``question``, ``question_en`` (the English rendering of the same problem,
        same names and numbers), ``answer`` (canonical integer string, >= 0), ``reasoning_en``
        (``"5 + 3 = 8. 8 - 2 = 6."``), ``template_id`` (scenario key, shared across languages) and
        ``n_operations`` (int64).
    """
    if isinstance(n_problems, bool) or not isinstance(n_problems, int) or n_problems < 0:
        raise ValueError(f"n_problems must be a non-negative int, got {n_problems!r}")
    _check_known("languages", languages, ALL_LANGUAGES)
    if len(set(languages)) != len(languages):
        raise ValueError(f"languages must not repeat, got {list(languages)}")
    _check_known("operations", operations, OPERATIONS)
    if not operations:
        raise ValueError(f"operations must not be empty; valid: {list(OPERATIONS)}")
    if not operation_counts or any(not isinstance(k, int) or k < 1 for k in operation_counts):
        raise ValueError(
            f"operation_counts must be positive ints, e.g. (1, 2); got {operation_counts!r}"
        )
    if max_operand < MIN_OPERAND:
        raise ValueError(f"max_operand must be >= {MIN_OPERAND}, got {max_operand}")
    if "add" not in operations and max_operand < MIN_OPERAND * max(operation_counts):
        raise ValueError(
            f"with only 'sub', {max(operation_counts)} steps need max_operand >= "
            f"{MIN_OPERAND * max(operation_counts)} to stay non-negative; got {max_operand}"
        )
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {list(VARIANTS)}")
    words_prob = _words_probability(number_style_probs)

    rows = []
    for code in languages:
        language = _LANGUAGES[code]
        rng = random.Random(f"tapo:{seed}:{code}")
        for index in range(n_problems):
            problem = _draw_problem(
                rng,
                max_operand=max_operand,
                operations=operations,
                operation_counts=operation_counts,
                words_prob=words_prob,
                n_names=len(language.names),
            )
            if variant == "conflict":
                problem = _with_distractor(
                    rng, problem, max_operand=max_operand, words_prob=words_prob
                )
            name = language.names[problem.name_index]
            rows.append(
                {
                    "id": f"tapo-{code}-{index:05d}",
                    "language": code,
                    "question": _render(language, problem, name, english=False),
                    # Same name (romanised) and numbers, English story, digits.
                    "question_en": _render(_EN, problem, name, english=True),
                    "answer": str(problem.answer),
                    "reasoning_en": _reasoning_chain(problem),
                    "template_id": problem.scenario,
                    "n_operations": len(problem.steps),
                }
            )
    frame = pd.DataFrame(rows, columns=list(TAPO_COLUMNS))
    return frame.astype(
        {column: "str" for column in TAPO_COLUMNS if column != "n_operations"}
        | {"n_operations": "int64"}
    )


def split_by_language(
    frame: pd.DataFrame, holdout_languages: Sequence[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Hold whole languages out of training (docs/methods/tapo.md: generalisation to unseen languages).

    Args:
        frame: rows with a ``language`` column, e.g. from ``generate_tapo_problems``.
        holdout_languages: languages present in ``frame``; at least one, and not all of them.

    Returns:
        ``(train_frame, heldout_frame)``: the rows of the other languages and of the held-out
        ones, each in the original order with a fresh RangeIndex.
    """
    if "language" not in frame.columns:
        raise ValueError(f"frame needs a 'language' column; it has {list(frame.columns)}")
    present = sorted(frame["language"].unique())
    _check_known("holdout languages", holdout_languages, present)
    if not holdout_languages:
        raise ValueError(f"holdout_languages must name at least one of {present}")
    held = frame["language"].isin(list(holdout_languages))
    if held.all():
        raise ValueError(
            f"holding out {sorted(set(holdout_languages))} leaves no training language"
        )
    return frame[~held].reset_index(drop=True), frame[held].reset_index(drop=True)


def format_tapo_target(question_en: str, answer: str, reasoning: str | None = None) -> str:
    """The gold SFT completion in docs/methods/tapo.md's format: translation block, reasoning, boxed answer.

    >>> format_tapo_target("Anna has 5 pencils. She buys 3 pencils. How many?", "8", "5 + 3 = 8.")
    '<translation>Anna has 5 pencils. She buys 3 pencils. How many?</translation>\\n5 + 3 = 8. The answer is \\\\boxed{8}'
    """
    question_en, answer = question_en.strip(), str(answer).strip()
    if not question_en or "<translation>" in question_en or "</translation>" in question_en:
        raise ValueError(
            f"question_en must be non-empty and free of translation tags, got {question_en!r}"
        )
    if not answer:
        raise ValueError("answer must be non-empty")
    lead = f"{reasoning.strip()} " if reasoning and reasoning.strip() else ""
    return f"<translation>{question_en}</translation>\n{lead}The answer is \\boxed{{{answer}}}"


def tapo_prompt(question: str) -> str:
    """The user turn the policy sees: ``TAPO_INSTRUCTION``, a blank line, then the question."""
    return f"{TAPO_INSTRUCTION}\n\n{question}"


EVALUATION_COLUMNS = ("dataset", "id", "language", "question", "question_en", "answer")


def tapo_evaluation_problems(
    tasks: pd.DataFrame, mgsm: pd.DataFrame, mgsm_max_per_language: int, label: str = "synthetic"
) -> pd.DataFrame:
    """The evaluation table, with ``EVALUATION_COLUMNS``: the evaluation problems of the task
    source (``dataset=label``: ``"synthetic"``, or a catalog source's name), then the first
    ``mgsm_max_per_language`` MGSM problems of each language (``dataset="mgsm"``).

    With ``label="mgsm"`` the task rows are MGSM's own held-out problems and are the MGSM
    evaluation: no further MGSM rows are added, since those could have been trained on."""
    frames = [tasks.assign(dataset=label)]
    if label != "mgsm":
        capped = mgsm.groupby("language", sort=True).head(mgsm_max_per_language)
        frames.append(capped.assign(dataset="mgsm"))
    return pd.concat(frames, ignore_index=True)[list(EVALUATION_COLUMNS)]
