"""The seeds of a GRPO run's steps: one home for the trainer and its sampling process
(``training.offpolicy``), which must draw a step exactly as the trainer would."""

from __future__ import annotations


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """A distinct, reproducible seed for each (run seed, step) so a resumed run draws exactly
    what an uninterrupted one would.

    >>> step_seed(0, 1), step_seed(0, 1, salt=2)
    (7919, 7921)
    """
    return (seed * 1_000_003 + step * 7919 + salt) % (2**31 - 1)


# Process r samples with step_seed(..., salt=RANK_SALT * r): process 0 keeps the
# single-process seed, the others draw independent completions.
RANK_SALT = 1000
