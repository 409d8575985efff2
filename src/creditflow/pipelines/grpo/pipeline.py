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

from kedro.pipeline import Node, Pipeline

from creditflow.config.task_sources import TASK_SOURCES
from creditflow.pipelines.comparison import comparison_pipeline, configured_strategies
from creditflow.pipelines.grpo import nodes

PARAMS = "params:grpo"
EVALUATION_INPUTS = ["grpo_tokenizer", "grpo_eval_tasks", PARAMS]


def create_pipeline(strategies: Sequence[str] | None = None, **kwargs) -> Pipeline:
    """The grpo pipeline over ``strategies`` (default: those of the parameters files)."""
    strategies = list(strategies or configured_strategies("grpo"))
    setup = Pipeline(
        [
            Node(
                nodes.build_grpo_tasks,
                [TASK_SOURCES["grpo"].dataset, PARAMS],
                ["grpo_train_tasks", "grpo_eval_tasks"],
                name="build_grpo_tasks",
            ),
            Node(
                nodes.train_grpo_tokenizer,
                ["grpo_train_tasks", PARAMS],
                "grpo_tokenizer",
                name="train_grpo_tokenizer",
            ),
            Node(
                nodes.build_grpo_policy,
                ["grpo_tokenizer", PARAMS],
                "grpo_initial_policy",
                name="build_grpo_policy",
            ),
            Node(
                nodes.warm_start_grpo_policy,
                [
                    "grpo_initial_policy",
                    "grpo_tokenizer",
                    "grpo_train_tasks",
                    "grpo_sft_checkpoints",
                    PARAMS,
                ],
                ["grpo_sft_policy", "grpo_sft_metrics"],
                name="warm_start_grpo_policy",
            ),
            Node(
                nodes.evaluate_grpo_policy,
                ["grpo_sft_policy", *EVALUATION_INPUTS],
                "grpo_results_sft",
                name="evaluate_grpo_policy_sft",
            ),
        ]
    )
    comparison = comparison_pipeline(
        "grpo",
        strategies,
        nodes.train_grpo_policies,
        nodes.evaluate_grpo_policies,
        nodes.compare_grpo_strategies,
        train_inputs=["grpo_sft_policy", "grpo_tokenizer", "grpo_train_tasks"],
        evaluation_inputs=EVALUATION_INPUTS,
    )
    return Pipeline([setup, comparison], tags=["grpo"])
