"""``credit_gym``: sweep (``run_credit_gym``) -> ``credit_gym_per_seed_sweep`` ->
``credit_gym_dose_response_sweep`` (CSV) and ``credit_gym_dose_response_plot`` (PNG), and
``credit_gym_claims_evaluation`` (the claim cards). All knobs are ``params:credit_gym``
(conf/base/parameters_credit_gym.yml); a strategy of one's own joins by import path there or
in conf/local."""

from __future__ import annotations

from kedro.pipeline import Node, Pipeline

from creditflow.pipelines.credit_gym import nodes


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                nodes.run_credit_gym,
                "params:credit_gym",
                "credit_gym_per_seed_sweep",
                name="run_credit_gym",
            ),
            Node(
                nodes.build_dose_response,
                ["credit_gym_per_seed_sweep", "params:credit_gym"],
                "credit_gym_dose_response_sweep",
                name="build_credit_gym_dose_response",
            ),
            Node(
                nodes.plot_dose_response,
                ["credit_gym_dose_response_sweep", "params:credit_gym"],
                "credit_gym_dose_response_plot",
                name="plot_credit_gym_dose_response",
            ),
            Node(
                nodes.build_gym_claim_cards,
                ["credit_gym_per_seed_sweep", "params:credit_gym"],
                "credit_gym_claims_evaluation",
                name="build_credit_gym_claim_cards",
            ),
        ]
    )
