"""``tapo``: tasks -> tokenizer -> policy -> SFT warm start -> GRPO per strategy -> evaluation.

Every strategy listed under ``tapo.strategies`` in ``conf/base/parameters_tapo.yml`` trains
from the same warm start with the same seed and budget; only the credit assignment differs.
Each is the ``strategy_template`` in its own namespace (``grpo_sum``, ``grpo_reasoning``,
``tapo``, ...), with stable dataset names: ``tapo_policy_<strategy>``,
``tapo_<strategy>_metrics``, ``tapo_samples_<strategy>``, ``tapo_results_<strategy>``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.comparison import (
    comparison_inputs,
    configured_strategies,
    strategy_pipelines,
)
from creditflow.pipelines.tapo import nodes

PARAMS = "params:tapo"
EVALUATION_INPUTS = ["tapo_tokenizer", "tapo_eval_tasks", "mgsm_problems", PARAMS]
# Template dataset -> catalog name of each strategy's copy.
STRATEGY_OUTPUTS = {
    "policy": "tapo_policy_{strategy}",
    "metrics": "tapo_{strategy}_metrics",
    "samples": "tapo_samples_{strategy}",
    "results": "tapo_results_{strategy}",
}


def strategy_template() -> Pipeline:
    """Train one strategy from the warm start, then evaluate it."""
    return Pipeline(
        [
            Node(
                nodes.train_tapo_policy,
                [
                    "tapo_sft_policy",
                    "tapo_tokenizer",
                    "tapo_train_tasks",
                    "checkpoints",
                    PARAMS,
                    "params:strategy",
                ],
                ["policy", "metrics", "samples"],
                name="train_tapo_policy",
            ),
            Node(
                nodes.evaluate_tapo_policy,
                ["policy", *EVALUATION_INPUTS],
                "results",
                name="evaluate_tapo_policy",
            ),
        ]
    )


def create_pipeline(strategies: Sequence[str] | None = None, **kwargs) -> Pipeline:
    """The tapo pipeline over ``strategies`` (default: those of the parameters files)."""
    strategies = list(strategies or configured_strategies("tapo"))
    setup = Pipeline(
        [
            Node(
                nodes.build_tapo_tasks,
                PARAMS,
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
    per_strategy = strategy_pipelines(
        strategy_template(),
        "tapo",
        strategies,
        shared_inputs={
            "tapo_sft_policy",
            "tapo_tokenizer",
            "tapo_train_tasks",
            "tapo_eval_tasks",
            "mgsm_problems",
        },
        outputs=STRATEGY_OUTPUTS,
    )
    report = Node(
        nodes.compare_tapo_strategies,
        {
            "tapo_results_sft": "tapo_results_sft",
            **comparison_inputs(
                "tapo", strategies, STRATEGY_OUTPUTS["results"], STRATEGY_OUTPUTS["metrics"]
            ),
        },
        ["tapo_comparison", "tapo_reward_curves"],
        name="compare_tapo_strategies",
    )
    return Pipeline([setup, per_strategy, report], tags=["tapo"])
