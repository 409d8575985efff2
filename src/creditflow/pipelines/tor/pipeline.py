"""``tor``: tasks -> processor -> VL policy -> SFT warm start -> GRPO per token-weight strategy
-> evaluation (synthetic, TabMWP, MATH-Vision) -> comparison.

The tasks come from ``tor.tasks.source``: the synthetic generators, or a catalog dataset of
the visual schema, read through the fixed input ``tor_source_problems``
(``creditflow.config.task_sources``: Kedro builds the pipeline before it reads ``--params``).

Every strategy listed under ``tor.strategies`` in ``conf/base/parameters_tor.yml`` trains from
the same warm start with the same seeds and budget; only the token weights differ: plain GRPO
(``uniform``), ToR with the paper's defaults (``tor``) and its ablations. Each is
``comparison.strategy_template`` in its own namespace, with stable dataset names:
``tor_policies_<strategy>`` (``{seed: model}``), ``tor_<strategy>_metrics``,
``tor_samples_<strategy>``, ``tor_results_<strategy>``; each strategy's GRPO runs
``tor.comparison.n_seeds`` times (seeds ``grpo.seed + k``; ``comparison`` module docstring),
and ``compare_tor_strategies`` writes ``tor_comparison`` (over seeds, with intervals) and
``tor_per_seed_comparison``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kedro.pipeline import Pipeline

from creditflow.config.task_sources import TASK_SOURCES
from creditflow.pipelines.comparison import ComparisonWorld, world_pipeline
from creditflow.pipelines.tor import nodes

WORLD = ComparisonWorld(
    group="tor",
    source=TASK_SOURCES["tor"].dataset,
    build_tasks=nodes.build_tor_tasks,
    train_tokenizer=nodes.train_tor_processor,
    build_policy=nodes.build_tor_policy,
    warm_start=nodes.warm_start_tor_policy,
    evaluate=nodes.evaluate_tor_policy,
    train_policy=nodes.train_tor_policy,
    compare=nodes.compare_tor_strategies,
    text_side="processor",
    evaluation_extra=("tabmwp_problems", "mathvision_problems"),
    image_pass=True,  # a vision-language policy: ToR's perception score has its pass
)


def create_pipeline(strategies: Sequence[str] | None = None, **kwargs) -> Pipeline:
    """The tor pipeline over ``strategies`` (default: those of the parameters files)."""
    return world_pipeline(WORLD, strategies)
