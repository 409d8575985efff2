"""``grpo``: prompts -> tokenizer -> policy -> SFT warm start -> GRPO per strategy -> evaluation
on the held-out prompts -> comparison.

The prompts come from ``grpo.tasks.source``: the synthetic questions of
``creditflow.tasks.prompts``, or a catalog dataset of the prompts schema (``id``, ``prompt``
as text or chat messages, optional ``completion``, any other columns), read through the fixed
input ``grpo_source_prompts`` (``creditflow.config.task_sources``: Kedro builds the pipeline
before it reads ``--params``). The rewards are ``grpo.reward_functions``: built-in names or
TRL-style functions by import path, which get the prompt set's other columns as keyword
arguments, in training and in the evaluation alike.

Every strategy listed under ``grpo.strategies`` in ``conf/base/parameters_grpo.yml`` trains
from the same warm start with the same seeds and budget (``comparison.strategy_template`` in
its own namespace): ``grpo_policies_<strategy>`` (``{seed: model}``),
``grpo_<strategy>_metrics``, ``grpo_samples_<strategy>``, ``grpo_results_<strategy>``; and
``compare_grpo_strategies`` writes ``grpo_comparison`` (over seeds, with intervals),
``grpo_per_seed_comparison`` and ``grpo_reward_curves``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kedro.pipeline import Pipeline

from creditflow.config.task_sources import TASK_SOURCES
from creditflow.pipelines.comparison import ComparisonWorld, world_pipeline
from creditflow.pipelines.grpo import nodes

WORLD = ComparisonWorld(
    group="grpo",
    source=TASK_SOURCES["grpo"].dataset,
    build_tasks=nodes.build_grpo_tasks,
    train_tokenizer=nodes.train_grpo_tokenizer,
    build_policy=nodes.build_grpo_policy,
    warm_start=nodes.warm_start_grpo_policy,
    evaluate=nodes.evaluate_grpo_policy,
    train_policy=nodes.train_grpo_policy,
    compare=nodes.compare_grpo_strategies,
)


def create_pipeline(strategies: Sequence[str] | None = None, **kwargs) -> Pipeline:
    """The grpo pipeline over ``strategies`` (default: those of the parameters files)."""
    return world_pipeline(WORLD, strategies)
