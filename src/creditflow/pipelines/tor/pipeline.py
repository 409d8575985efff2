"""``tor``: tasks -> processor -> VL policy -> SFT warm start -> GRPO per token-weight strategy
-> evaluation (synthetic, TabMWP, MATH-Vision) -> comparison.

Every strategy listed under ``tor.strategies`` in ``conf/base/parameters_tor.yml`` trains from
the same warm start with the same seed and budget; only the token weights differ: plain GRPO
(``uniform``), ToR with the paper's defaults (``tor``) and its ablations. Each is the
``strategy_template`` in its own namespace, with stable dataset names:
``tor_policy_<strategy>``, ``tor_<strategy>_metrics``, ``tor_samples_<strategy>``,
``tor_results_<strategy>``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.comparison import (
    comparison_inputs,
    configured_strategies,
    strategy_pipelines,
)
from creditflow.pipelines.tor import nodes

PARAMS = "params:tor"
EVALUATION_INPUTS = [
    "tor_processor",
    "tor_eval_tasks",
    "tabmwp_problems",
    "mathvision_problems",
    PARAMS,
]
# Template dataset -> catalog name of each strategy's copy.
STRATEGY_OUTPUTS = {
    "policy": "tor_policy_{strategy}",
    "metrics": "tor_{strategy}_metrics",
    "samples": "tor_samples_{strategy}",
    "results": "tor_results_{strategy}",
}


def strategy_template() -> Pipeline:
    """Train one token-weight strategy from the warm start, then evaluate it."""
    return Pipeline(
        [
            Node(
                nodes.train_tor_policy,
                [
                    "tor_sft_policy",
                    "tor_processor",
                    "tor_train_tasks",
                    "checkpoints",
                    PARAMS,
                    "params:strategy",
                ],
                ["policy", "metrics", "samples"],
                name="train_tor_policy",
            ),
            Node(
                nodes.evaluate_tor_policy,
                ["policy", *EVALUATION_INPUTS],
                "results",
                name="evaluate_tor_policy",
            ),
        ]
    )


def create_pipeline(strategies: Sequence[str] | None = None, **kwargs) -> Pipeline:
    """The tor pipeline over ``strategies`` (default: those of the parameters files)."""
    strategies = list(strategies or configured_strategies("tor"))
    setup = Pipeline(
        [
            Node(
                nodes.build_tor_tasks,
                PARAMS,
                ["tor_train_tasks", "tor_eval_tasks"],
                name="build_tor_tasks",
            ),
            Node(
                nodes.train_tor_tokenizer,
                ["tor_train_tasks", PARAMS],
                "tor_processor",
                name="train_tor_tokenizer",
            ),
            Node(
                nodes.build_vl_policy,
                ["tor_processor", PARAMS],
                "tor_initial_policy",
                name="build_vl_policy",
            ),
            Node(
                nodes.sft_warmstart_tor,
                [
                    "tor_initial_policy",
                    "tor_processor",
                    "tor_train_tasks",
                    "tor_sft_checkpoints",
                    PARAMS,
                ],
                ["tor_sft_policy", "tor_sft_metrics"],
                name="sft_warmstart_tor",
            ),
            Node(
                nodes.evaluate_tor_policy,
                ["tor_sft_policy", *EVALUATION_INPUTS],
                "tor_results_sft",
                name="evaluate_tor_policy_sft",
            ),
        ]
    )
    per_strategy = strategy_pipelines(
        strategy_template(),
        "tor",
        strategies,
        shared_inputs={
            "tor_sft_policy",
            "tor_processor",
            "tor_train_tasks",
            "tor_eval_tasks",
            "tabmwp_problems",
            "mathvision_problems",
        },
        outputs=STRATEGY_OUTPUTS,
    )
    report = Node(
        nodes.compare_tor_strategies,
        {
            "tor_results_sft": "tor_results_sft",
            **comparison_inputs(
                "tor", strategies, STRATEGY_OUTPUTS["results"], STRATEGY_OUTPUTS["metrics"]
            ),
        },
        ["tor_comparison", "tor_reward_curves"],
        name="compare_tor_strategies",
    )
    return Pipeline([setup, per_strategy, report], tags=["tor"])
