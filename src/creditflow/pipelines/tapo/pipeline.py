"""``tapo``: tasks -> tokenizer -> policy -> SFT warm start -> GRPO per strategy -> evaluation.

Every strategy trains from the same warm start with the same seed and budget; only the
credit assignment differs (``params:tapo.strategies``). ``tapo_policy_tapo`` is the TAPO run.
"""

from functools import partial, update_wrapper

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.tapo import nodes

PARAMS = "params:tapo"
# The compared strategies; each is defined (as overrides of params:tapo.grpo) in
# conf/base/parameters_tapo.yml under tapo.strategies.
STRATEGIES = ("grpo_sum", "grpo_reasoning", "tapo")


def _named(func, name: str, **bound):
    """``partial(func, **bound)`` that keeps ``func``'s docstring for kedro-viz."""
    wrapped = partial(func, **bound)
    update_wrapper(wrapped, func)
    wrapped.__name__ = name
    return wrapped


def create_pipeline(**kwargs) -> Pipeline:
    setup = [
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
            ["tapo_initial_policy", "tapo_tokenizer", "tapo_train_tasks", PARAMS],
            ["tapo_sft_policy", "tapo_sft_metrics"],
            name="warm_start_tapo_policy",
        ),
        Node(
            _named(nodes.evaluate_tapo_policy, "evaluate_tapo_policy", label="sft"),
            ["tapo_sft_policy", "tapo_tokenizer", "tapo_eval_tasks", "mgsm_problems", PARAMS],
            "tapo_results_sft",
            name="evaluate_tapo_policy_sft",
        ),
    ]
    per_strategy = []
    for strategy in STRATEGIES:
        per_strategy += [
            Node(
                _named(nodes.train_tapo_policy, "train_tapo_policy", strategy=strategy),
                [
                    "tapo_sft_policy",
                    "tapo_tokenizer",
                    "tapo_train_tasks",
                    f"tapo_checkpoints_{strategy}",
                    PARAMS,
                ],
                [f"tapo_policy_{strategy}", f"tapo_{strategy}_metrics", f"tapo_samples_{strategy}"],
                name=f"train_tapo_policy_{strategy}",
            ),
            Node(
                _named(nodes.evaluate_tapo_policy, "evaluate_tapo_policy", label=strategy),
                [
                    f"tapo_policy_{strategy}",
                    "tapo_tokenizer",
                    "tapo_eval_tasks",
                    "mgsm_problems",
                    PARAMS,
                ],
                f"tapo_results_{strategy}",
                name=f"evaluate_tapo_policy_{strategy}",
            ),
        ]
    report = Node(
        _named(
            nodes.compare_tapo_strategies,
            "compare_tapo_strategies",
            n_evaluations=1 + len(STRATEGIES),
        ),
        [
            PARAMS,
            "tapo_results_sft",
            *(f"tapo_results_{s}" for s in STRATEGIES),
            *(f"tapo_{s}_metrics" for s in STRATEGIES),
        ],
        ["tapo_comparison", "tapo_reward_curves"],
        name="compare_tapo_strategies",
    )
    return Pipeline([*setup, *per_strategy, report], tags=["tapo"])
