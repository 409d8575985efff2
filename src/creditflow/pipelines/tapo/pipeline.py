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

from kedro.pipeline import Node, Pipeline

from creditflow.config.task_sources import TASK_SOURCES
from creditflow.pipelines.comparison import comparison_pipeline, configured_strategies
from creditflow.pipelines.tapo import nodes

PARAMS = "params:tapo"
EVALUATION_INPUTS = ["tapo_tokenizer", "tapo_eval_tasks", "mgsm_problems", PARAMS]


def create_pipeline(strategies: Sequence[str] | None = None, **kwargs) -> Pipeline:
    """The tapo pipeline over ``strategies`` (default: those of the parameters files)."""
    strategies = list(strategies or configured_strategies("tapo"))
    setup = Pipeline(
        [
            Node(
                nodes.build_tapo_tasks,
                [TASK_SOURCES["tapo"].dataset, PARAMS],
                ["tapo_train_tasks", "tapo_eval_tasks"],
                name="build_tapo_tasks",
            ),
            Node(
                nodes.train_tapo_tokenizer,
                ["tapo_train_tasks", PARAMS],
                "tapo_tokenizer",
                name="train_tapo_tokenizer",
            ),
            Node(
                nodes.build_tapo_policy,
                ["tapo_tokenizer", PARAMS],
                "tapo_initial_policy",
                name="build_tapo_policy",
            ),
            Node(
                nodes.warm_start_tapo_policy,
                [
                    "tapo_initial_policy",
                    "tapo_tokenizer",
                    "tapo_train_tasks",
                    "tapo_sft_checkpoints",
                    PARAMS,
                ],
                ["tapo_sft_policy", "tapo_sft_metrics"],
                name="warm_start_tapo_policy",
            ),
            Node(
                nodes.evaluate_tapo_policy,
                ["tapo_sft_policy", *EVALUATION_INPUTS],
                "tapo_results_sft",
                name="evaluate_tapo_policy_sft",
            ),
        ]
    )
    comparison = comparison_pipeline(
        "tapo",
        strategies,
        nodes.train_tapo_policies,
        nodes.evaluate_tapo_policies,
        nodes.compare_tapo_strategies,
        train_inputs=["tapo_sft_policy", "tapo_tokenizer", "tapo_train_tasks"],
        evaluation_inputs=EVALUATION_INPUTS,
    )
    return Pipeline([setup, comparison], tags=["tapo"])
