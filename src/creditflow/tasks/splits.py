"""Where a comparison's problems come from, and how a catalog source is split (no Kedro, no I/O).

``tapo.tasks.source`` / ``tor.tasks.source`` is :data:`SYNTHETIC` (the seeded generators of
:mod:`creditflow.tasks.tapo` / :mod:`creditflow.tasks.tor`) or the name of a catalog dataset
in a task schema (:mod:`creditflow.ingest.source_rows` validates it). A catalog source has no
separate evaluation set, so :func:`split_by_problem_id` holds out a seeded fraction of its
problems: every row of a problem (all its languages, for MGSM) lands on one side, so no
problem is trained on in one language and evaluated in another.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

SYNTHETIC = "synthetic"


def split_by_problem_id(
    problems: pd.DataFrame,
    heldout_fraction: float,
    seed: int,
    max_train_problems: int | None = None,
    max_eval_problems: int | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Hold out ``heldout_fraction`` of the problem ids, drawn with ``seed``.

    Args:
        problems: rows with an ``id`` column; several rows may share an id (one per language).
        heldout_fraction: in (0, 1); ``round(fraction * n_ids)`` ids are held out, at least one
            and at most ``n_ids - 1``, so both sides are non-empty.
        seed: the permutation of the sorted ids comes from ``numpy.random.default_rng(seed)``,
            so the split depends only on the set of ids, not on the row order.
        max_train_problems / max_eval_problems: keep at most this many ids of each side (the
            first ones of the permutation, so a smaller cap keeps a subset of a larger one's
            ids); None keeps all.

    Returns:
        ``(train, heldout)``: the rows of each side's ids, in the order of ``problems``, each
        with a fresh RangeIndex.

    >>> frame = pd.DataFrame({"id": ["a", "a", "b", "c", "d"], "language": list("eneee")})
    >>> train, heldout = split_by_problem_id(frame, 0.25, seed=0)
    >>> sorted(set(train["id"])), sorted(set(heldout["id"]))
    (['a', 'b', 'd'], ['c'])
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    ids = np.array(sorted(problems["id"].unique()), dtype=object)
    if len(ids) < 2:
        raise ValueError(
            f"a split by problem id needs at least 2 problems, the source has {len(ids)}"
        )
    order = ids[np.random.default_rng(seed).permutation(len(ids))]
    n_heldout = min(max(round(heldout_fraction * len(ids)), 1), len(ids) - 1)
    heldout_ids, train_ids = order[:n_heldout], order[n_heldout:]
    sides = []
    for side, cap in ((train_ids, max_train_problems), (heldout_ids, max_eval_problems)):
        kept = set(side[:cap] if cap is not None else side)
        sides.append(problems[problems["id"].isin(kept)].reset_index(drop=True))
    return sides[0], sides[1]


def split_options(tasks: Mapping[str, object]) -> dict[str, object]:
    """The keyword arguments of :func:`split_by_problem_id` from a ``tasks`` parameter block
    (``heldout_fraction``, ``split_seed``, ``max_train_problems``, ``max_eval_problems``)."""
    return {
        "heldout_fraction": tasks["heldout_fraction"],
        "seed": tasks["split_seed"],
        "max_train_problems": tasks["max_train_problems"],
        "max_eval_problems": tasks["max_eval_problems"],
    }


def evaluation_label(source: str, benchmarks: Mapping[str, str]) -> str:
    """The ``dataset`` value of a source's held-out rows in the evaluation tables.

    ``benchmarks`` maps an evaluation set's label to the catalog table it evaluates on
    (``{"mgsm": "mgsm_problems"}``). A source that is one of those tables is labelled as that
    set: its held-out rows then are the set's evaluation (its other rows were trained on).
    Any other source keeps its catalog name; ``synthetic`` stays ``synthetic``.

    >>> evaluation_label("mgsm_problems", {"mgsm": "mgsm_problems"})
    'mgsm'
    >>> evaluation_label("gsm8k_train_problems", {"mgsm": "mgsm_problems"})
    'gsm8k_train_problems'
    """
    for label, table in benchmarks.items():
        if source == table:
            return label
    return source
