"""Generic prompt sets: the ``grpo`` pipeline's task schema and its synthetic default (no Kedro,
no I/O).

A prompt set is one row per prompt (TRL's dataset layout):

- ``id``: names the prompt; the held-out split is drawn over ids (``splits.split_by_problem_id``);
- ``prompt``: the text of one user turn, or a conversation as chat messages
  ``[{"role": "system", "content": ...}, {"role": "user", "content": ...}]``;
- ``completion`` (optional): a gold completion, the SFT warm start's target;
- any other column (``answer``, ``kind``, ...): handed to TRL-style rewards as keyword
  arguments of those names, one value per completion; ``answer`` is also the gold answer the
  built-in ``exact_match`` reward reads.

:func:`generate_prompt_tasks` writes the synthetic default: short arithmetic and counting
questions whose answer is one number, scored by exact match.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import pandas as pd

from creditflow.errors import ConfigError, TaskSourceError

ID, PROMPT, COMPLETION = "id", "prompt", "completion"
# The synthetic questions: ``add`` ("What is 7 + 12?"), ``sub`` (never negative), ``max``
# ("Which is larger, 37 or 52?") and ``count`` (how often a letter occurs in a short string
# of a few letters).
PROMPT_KINDS = ("add", "sub", "max", "count")
_LETTERS = "abcd"  # few letters, so the counted one occurs 0-5 times in a short word


def generate_prompt_tasks(
    n: int,
    kinds: Sequence[str] = PROMPT_KINDS,
    max_operand: int = 20,
    word_length: int = 6,
    seed: int = 0,
    id_prefix: str = "synthetic",
) -> pd.DataFrame:
    """``n`` seeded questions, kinds drawn uniformly from ``kinds``.

    Args:
        n: number of rows.
        kinds: from ``PROMPT_KINDS``.
        max_operand: operands of ``add`` / ``sub`` are drawn from 0..max_operand.
        word_length: letters of a ``count`` question's string.
        seed: numpy seed; the same arguments give the same rows.
        id_prefix: ids are ``<id_prefix>-<kind>-<row>``.

    Returns:
        Columns ``id``, ``prompt`` (text), ``answer`` (the number as text), ``completion``
        (the gold completion: the answer alone) and ``kind``.

    >>> generate_prompt_tasks(2, ["add"], max_operand=9, seed=1)[
    ...     ["prompt", "answer"]
    ... ].values.tolist()
    [['What is 4 + 5? Answer with the number only.', '9'], ['What is 7 + 9? Answer with the number only.', '16']]
    """
    unknown = sorted(set(kinds) - set(PROMPT_KINDS))
    if unknown or not kinds:
        raise ValueError(f"unknown prompt kinds {unknown}; valid: {list(PROMPT_KINDS)}")
    if n < 1 or max_operand < 1 or word_length < 1:
        raise ValueError("n, max_operand and word_length must be >= 1")
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(n):
        kind = str(kinds[int(rng.integers(len(kinds)))])
        if kind == "count":
            # Letters spaced, so each is a token of its own (BPE would merge "ccbbaa" into
            # pieces whose letters the policy cannot see to count).
            letters = [str(x) for x in rng.choice(list(_LETTERS), size=word_length)]
            letter = str(rng.choice(list(_LETTERS)))
            question = f"How many times does the letter {letter} occur in: {' '.join(letters)}?"
            answer = letters.count(letter)
        elif kind == "max":
            a, b = (int(x) for x in rng.choice(max_operand + 1, size=2, replace=False))
            question = f"Which is larger, {a} or {b}?"
            answer = max(a, b)
        else:
            a, b = (int(x) for x in rng.integers(0, max_operand + 1, size=2))
            if kind == "sub":
                a, b = max(a, b), min(a, b)
            question = f"What is {a} {'+' if kind == 'add' else '-'} {b}?"
            answer = a + b if kind == "add" else a - b
        rows.append(
            {
                ID: f"{id_prefix}-{kind}-{index:05d}",
                PROMPT: f"{question} Answer with the number only.",
                "answer": str(answer),
                COMPLETION: str(answer),
                "kind": kind,
            }
        )
    return pd.DataFrame(rows)


def prompt_texts(prompts: Sequence[object]) -> list[str]:
    """The text of every prompt: a text prompt itself, a conversation's message contents
    (for training a tokenizer on what the policy reads).

    >>> prompt_texts(
    ...     [
    ...         "Hi",
    ...         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    ...     ]
    ... )
    ['Hi', 'Be brief.', '2+2?']
    """
    texts: list[str] = []
    for prompt in prompts:
        if isinstance(prompt, str):
            texts.append(prompt)
        else:
            texts += [str(message["content"]) for message in prompt]
    return texts


def synthetic_prompt_split(
    n_train: int, n_eval: int, seed: int = 0, **options: object
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(train, heldout)`` synthetic prompt sets with no prompt in both: ``n_train + n_eval``
    questions drawn (``generate_prompt_tasks`` with ``options``), repeated prompts dropped
    (the first kept), the last ``n_eval`` held out.

    Raises:
        ValueError: the questions' space is too small for ``n_eval`` held-out prompts and at
            least one training prompt after the repeats are dropped.

    >>> train, heldout = synthetic_prompt_split(30, 5, kinds=["add"], max_operand=9)
    >>> len(heldout), set(train["prompt"]) & set(heldout["prompt"])
    (5, set())
    """
    drawn = generate_prompt_tasks(n_train + n_eval, seed=seed, **options)  # type: ignore[arg-type]
    unique = drawn.drop_duplicates(PROMPT).reset_index(drop=True)
    if len(unique) <= n_eval:
        raise ValueError(
            f"only {len(unique)} distinct synthetic prompts for {n_eval} held-out ones: raise "
            "max_operand or word_length, add kinds, or lower n_eval"
        )
    return unique.iloc[:-n_eval].reset_index(drop=True), unique.iloc[-n_eval:].reset_index(
        drop=True
    )


def reward_dataset(tasks: pd.DataFrame) -> pd.DataFrame:
    """``tasks`` as the rewards see them: without the gold ``completion`` (TRL leaves it out
    of a reward's keyword arguments too; the evaluation writes its own ``completion``), every
    cell a plain Python value and a missing one None (a JSON null loads as NaN in a numeric
    column; TRL hands a reward None).

    >>> reward_dataset(pd.DataFrame({"completion": ["2"], "d": [float("nan")]}))["d"].tolist()
    [None]
    """
    frame = tasks.drop(columns=[COMPLETION], errors="ignore").astype(object)
    return frame.where(frame.notna(), None)


def sft_targets(tasks: pd.DataFrame, column: str, source: str, steps: int) -> list[str]:
    """The SFT target after each prompt: column ``column`` (``grpo.tasks.sft_target``) of the
    prompt set ``source``, as text (an integer as its digits), for an SFT of ``steps`` steps.

    Raises:
        ConfigError: the prompt set has no such column (naming the keys that fix it).
        TaskSourceError: a target is blank or no text, naming its row.

    >>> sft_targets(pd.DataFrame({"answer": ["7", 12]}), "answer", "mine", 100)
    ['7', '12']
    """
    if column not in tasks:
        raise ConfigError(
            f"grpo.sft.steps is {steps} but the prompt set `{source}` has no `{column}` column "
            "(grpo.tasks.sft_target) for SFT to learn: add gold completions in that column, "
            "name another one with grpo.tasks.sft_target, or set grpo.sft.steps=0 (a "
            "pretrained checkpoint needs no warm start)"
        )
    targets = []
    for row, value in enumerate(tasks[column].tolist()):
        is_int = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        text = str(int(value)) if is_int else value
        if not isinstance(text, str) or not text.strip():
            raise TaskSourceError(
                source,
                f"the SFT target is {value!r}, not text",
                "fill it in or drop the row (or set grpo.sft.steps=0)",
                row,
                column,
            )
        targets.append(text)
    return targets
