"""``tapo``: tasks -> tokenizer -> policy -> SFT warm start -> GRPO per strategy -> evaluation.

The tasks come from ``tapo.tasks.source``: the synthetic generators, or a catalog dataset of
the math-text schema, read through the fixed input ``tapo_source_problems``
(``creditflow.config.task_sources``: Kedro builds the pipeline before it reads ``--params``).

Every strategy listed under ``tapo.strategies`` in ``conf/base/parameters_tapo.yml`` trains
from the same warm start with the same seeds and budget; only the credit assignment differs.
Each is ``comparison.strategy_template`` in its own namespace (``grpo_sum``,
``grpo_reasoning``, ``tapo``, ...), with stable dataset names: ``tapo_policies_<strategy>``
(``{seed: model}``), ``tapo_<strategy>_metrics``, ``tapo_samples_<strategy>``,
``tapo_results_<strategy>``; each strategy's GRPO runs ``tapo.comparison.n_seeds`` times
(seeds ``grpo.seed + k``; ``comparison`` module docstring), and ``compare_tapo_strategies``
writes ``tapo_comparison`` (over seeds, with intervals) and ``tapo_per_seed_comparison``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kedro.pipeline import Pipeline

from creditflow.config.task_sources import TASK_SOURCES
from creditflow.pipelines.comparison import ComparisonWorld, world_pipeline
from creditflow.pipelines.tapo import nodes

WORLD = ComparisonWorld(
    group="tapo",
    source=TASK_SOURCES["tapo"].dataset,
    build_tasks=nodes.build_tapo_tasks,
    train_tokenizer=nodes.train_tapo_tokenizer,
    build_policy=nodes.build_tapo_policy,
    warm_start=nodes.warm_start_tapo_policy,
    evaluate=nodes.evaluate_tapo_policy,
    train_policy=nodes.train_tapo_policy,
    compare=nodes.compare_tapo_strategies,
    evaluation_extra=("mgsm_problems",),
)


def create_pipeline(strategies: Sequence[str] | None = None, **kwargs) -> Pipeline:
    """The tapo pipeline over ``strategies`` (default: those of the parameters files)."""
    return world_pipeline(WORLD, strategies)
