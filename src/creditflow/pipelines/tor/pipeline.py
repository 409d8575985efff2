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

from kedro.pipeline import Node, Pipeline

from creditflow.config.task_sources import TASK_SOURCES
from creditflow.pipelines.comparison import comparison_pipeline, configured_strategies
from creditflow.pipelines.tor import nodes

PARAMS = "params:tor"
EVALUATION_INPUTS = [
    "tor_processor",
    "tor_eval_tasks",
    "tabmwp_problems",
    "mathvision_problems",
    PARAMS,
]


def create_pipeline(strategies: Sequence[str] | None = None, **kwargs) -> Pipeline:
    """The tor pipeline over ``strategies`` (default: those of the parameters files)."""
    strategies = list(strategies or configured_strategies("tor"))
    setup = Pipeline(
        [
            Node(
                nodes.build_tor_tasks,
                [TASK_SOURCES["tor"].dataset, PARAMS],
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
    comparison = comparison_pipeline(
        "tor",
        strategies,
        nodes.train_tor_policies,
        nodes.evaluate_tor_policies,
        nodes.compare_tor_strategies,
        train_inputs=["tor_sft_policy", "tor_processor", "tor_train_tasks"],
        evaluation_inputs=EVALUATION_INPUTS,
        image_pass=True,  # a vision-language policy: ToR's perception score has its pass
    )
    return Pipeline([setup, comparison], tags=["tor"])
