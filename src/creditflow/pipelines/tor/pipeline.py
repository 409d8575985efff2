"""``tor``: tasks -> processor -> VL policy -> SFT warm start -> GRPO per token-weight strategy
-> evaluation (synthetic, TabMWP, MATH-Vision) -> comparison.

Every strategy trains from the same warm start with the same seed and budget; only the token
weights differ (``params:tor.strategies``): plain GRPO (``uniform``), ToR with the paper's
defaults (``tor``) and its ablations. ``tor_policy_tor`` is the ToR run.
"""

from functools import partial, update_wrapper

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.tor import nodes

PARAMS = "params:tor"
# The compared strategies; each is defined (as overrides of params:tor.grpo) in
# conf/base/parameters_tor.yml under tor.strategies.
STRATEGIES = (
    "uniform",
    "tor",
    "tor_reasoning_only",
    "tor_perception_only",
    "tor_overlap_reasoning",
)
EVALUATION_INPUTS = ["tor_processor", "tor_eval_tasks", "tabmwp_problems", "mathvision_problems"]


def _named(func, name: str, **bound):
    """``partial(func, **bound)`` that keeps ``func``'s docstring for kedro-viz."""
    wrapped = partial(func, **bound)
    update_wrapper(wrapped, func)
    wrapped.__name__ = name
    return wrapped


def create_pipeline(**kwargs) -> Pipeline:
    setup = [
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
            ["tor_initial_policy", "tor_processor", "tor_train_tasks", PARAMS],
            ["tor_sft_policy", "tor_sft_metrics"],
            name="sft_warmstart_tor",
        ),
        Node(
            _named(nodes.evaluate_tor_policy, "evaluate_tor_policy", label="sft"),
            ["tor_sft_policy", *EVALUATION_INPUTS, PARAMS],
            "tor_results_sft",
            name="evaluate_tor_policy_sft",
        ),
    ]
    per_strategy = []
    for strategy in STRATEGIES:
        per_strategy += [
            Node(
                _named(nodes.train_tor_policy, "train_tor_policy", strategy=strategy),
                [
                    "tor_sft_policy",
                    "tor_processor",
                    "tor_train_tasks",
                    f"tor_checkpoints_{strategy}",
                    PARAMS,
                ],
                [f"tor_policy_{strategy}", f"tor_{strategy}_metrics", f"tor_samples_{strategy}"],
                name=f"train_tor_policy_{strategy}",
            ),
            Node(
                _named(nodes.evaluate_tor_policy, "evaluate_tor_policy", label=strategy),
                [f"tor_policy_{strategy}", *EVALUATION_INPUTS, PARAMS],
                f"tor_results_{strategy}",
                name=f"evaluate_tor_policy_{strategy}",
            ),
        ]
    report = Node(
        _named(
            nodes.compare_tor_strategies,
            "compare_tor_strategies",
            n_evaluations=1 + len(STRATEGIES),
        ),
        [
            PARAMS,
            "tor_results_sft",
            *(f"tor_results_{s}" for s in STRATEGIES),
            *(f"tor_{s}_metrics" for s in STRATEGIES),
        ],
        ["tor_comparison", "tor_reward_curves"],
        name="compare_tor_strategies",
    )
    return Pipeline([*setup, *per_strategy, report], tags=["tor"])
