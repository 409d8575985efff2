"""Robust aggregates over runs and tasks with stratified-bootstrap intervals, as Agarwal et al.
("Deep RL at the Edge of the Statistical Precipice", NeurIPS 2021) and the "Sober Look" at
LLM reasoning evaluations (arXiv 2504.07086) recommend: the interquartile mean (IQM) and the
probability of improvement.

Written by hand because the package made for it, ``rliable`` (1.2), does not import beside
this project's pandas 3: its dependency ``arch`` (< 8) fails at import on pandas 3's
``deprecate_kwarg``. The definitions follow rliable's ``metrics`` module: the IQM is the 25 %
trimmed mean of every score pooled; the probability that X improves on Y is, averaged over
tasks, the Mann-Whitney statistic ``P(x > y) + P(x = y) / 2`` of the two methods' runs on
that task. Intervals resample the runs of each task with replacement, independently per task
(stratified), and take percentiles.

Scores are ``(runs, tasks)`` arrays: a run is a seed, a task a sweep point or a testbed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.stats import trim_mean

CONFIDENCE = 0.95


def interquartile_mean(scores: np.ndarray) -> float:
    """The mean of the middle half of every score (25 % trimmed at each end), pooled over
    runs and tasks.

    >>> interquartile_mean(np.array([[0.0, 1.0], [2.0, 100.0]]))
    1.5
    """
    return float(trim_mean(np.asarray(scores, dtype=float), proportiontocut=0.25, axis=None))


def probability_of_improvement(scores_x: np.ndarray, scores_y: np.ndarray) -> float:
    """P(X > Y): per task, the share of (run of X, run of Y) pairs where X scores higher,
    ties counting one half; averaged over tasks. Both ``(runs, tasks)``, the same tasks.

    Runs 1, 3 against 2, 3: of the four pairs one is won (3 > 2) and one tied (3 = 3):

    >>> probability_of_improvement(np.array([[1.0], [3.0]]), np.array([[2.0], [3.0]]))
    0.375
    """
    x, y = np.asarray(scores_x, dtype=float), np.asarray(scores_y, dtype=float)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"need (runs, tasks) arrays over the same tasks, got {x.shape}, {y.shape}")
    per_task = []
    for task in range(x.shape[1]):
        a, b = x[:, task][:, None], y[:, task][None, :]
        per_task.append(float(((a > b) + 0.5 * (a == b)).mean()))
    return float(np.mean(per_task))


def stratified_bootstrap(
    statistic: Callable[..., float],
    *score_sets: np.ndarray,
    reps: int = 2000,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(point, low, high)``: ``statistic(*score_sets)`` and its percentile interval over
    ``reps`` stratified resamples (each task's runs drawn with replacement, independently per
    task and per score set). Seeded: the same inputs give the same interval.

    >>> point, low, high = stratified_bootstrap(interquartile_mean, np.ones((5, 3)))
    >>> (point, low, high)
    (1.0, 1.0, 1.0)
    """
    sets = [np.asarray(s, dtype=float) for s in score_sets]
    rng = np.random.default_rng(seed)
    point = statistic(*sets)
    values = np.empty(reps)
    for rep in range(reps):
        resampled = []
        for scores in sets:
            runs, tasks = scores.shape
            picks = rng.integers(0, runs, size=(runs, tasks))  # (runs, tasks)
            resampled.append(np.take_along_axis(scores, picks, axis=0))
        values[rep] = statistic(*resampled)
    tail = (1 - confidence) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(point), float(low), float(high)
