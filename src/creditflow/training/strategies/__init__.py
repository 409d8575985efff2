"""Credit-assignment strategies, chosen by name from two small tables (one home per method).

- ``grpo.py``: plain GRPO advantages and uniform token weights (docs/methods/grpo.md).
- ``tapo.py``: TAPO's step-level advantages, the translation segment, the sign-conflict rate
  (docs/methods/tapo.md).
- ``tor.py``: ToR's batch-global token selection and weights, with its ablations (docs/methods/tor.md).
- ``vppo.py``: VPPO, the visual dependency as a completion's scale and a token filter
  (docs/methods/vppo.md).
- ``gdpo.py``: GDPO, each reward normalised within its group before the weighted sum
  (docs/methods/gdpo.md).
- ``hicra.py``: HICRA, GRPO's advantages amplified on planning tokens (docs/methods/hicra.md).
- ``controls.py``: controls (shuffled advantages, random tokens) and the entropy-fraction
  selections of the high-entropy-minority study (docs/methods/controls.md).

Adding a method means adding a module and a row here, not a branch in the training loop.
(Page-level GRPO is plain ``grpo`` on a reward of its own: ``creditflow.chain.reranker.page_reward``.)
A name that is in neither table is an import path or an entry point of a strategy of one's own
(``plugins.py``, docs/extending.md). ``validate_strategies`` checks a config's strategy specs
before any model is built.
"""

from __future__ import annotations

from creditflow.config.grpo import GRPOConfig
from creditflow.errors import ConfigError
from creditflow.training.strategies.base import (
    AdvantageStrategy,
    Metrics,
    RewardMetric,
    TokenWeightStrategy,
    WeightContext,
    weighted_reward,
)
from creditflow.training.strategies.controls import CONTROL_TOKEN_WEIGHTS, SHUFFLED_ADVANTAGES
from creditflow.training.strategies.gdpo import GDPO
from creditflow.training.strategies.grpo import GRPO, UNIFORM
from creditflow.training.strategies.hicra import HICRA
from creditflow.training.strategies.plugins import plugin_strategy
from creditflow.training.strategies.tapo import TAPO, SignConflictRate
from creditflow.training.strategies.tor import TOR_STRATEGIES
from creditflow.training.strategies.vppo import VPPO

ADVANTAGE_STRATEGIES: dict[str, AdvantageStrategy] = {
    "grpo": GRPO,
    "tapo": TAPO,
    "gdpo": GDPO,
    "hicra": HICRA,
    "shuffled_advantages": SHUFFLED_ADVANTAGES,
}
TOKEN_WEIGHT_STRATEGIES: dict[str, TokenWeightStrategy] = {
    "uniform": UNIFORM,
    **TOR_STRATEGIES,
    "vppo": VPPO,
    **CONTROL_TOKEN_WEIGHTS,
}


def advantage_strategy(config: GRPOConfig) -> AdvantageStrategy:
    return _lookup("advantage", config.advantage, ADVANTAGE_STRATEGIES)


def token_weight_strategy(config: GRPOConfig) -> TokenWeightStrategy:
    """The token-weight strategy of ``config``, with the flags of its spec
    (``TokenWeightStrategy.for_spec``)."""
    strategy = _lookup("token_weights", config.token_weights, TOKEN_WEIGHT_STRATEGIES)
    return strategy.for_spec(config.token_weights)


def check_image_pass(config: GRPOConfig, has_image_pass: bool, policy: str) -> None:
    """ConfigError when ``config``'s token-weight strategy calls ``policy.no_image_logprobs``
    (``needs_image_pass``), or ``config.perception`` hides part of the pictures, and the policy
    has no pictures (``has_image_pass`` False).

    Args:
        policy: the policy as the message names it (its class, or the pipeline's policy).
    """
    if config.perception is not None and not has_image_pass:
        raise ConfigError(
            f"perception (PAPO's perception loss) hides part of each prompt's picture, and "
            f"{policy} takes no pictures: set perception to null, or train a vision-language "
            f"policy (the tor pipeline)"
        )
    strategy = token_weight_strategy(config)
    if strategy.needs_image_pass and not has_image_pass:
        fallback = f"; {strategy.image_pass_fallback}" if strategy.image_pass_fallback else ""
        raise ConfigError(
            f"token_weights {config.token_weights['name']!r} needs the policy's log-probs "
            f"without the image (no_image_logprobs: a vision-language policy, as in the tor "
            f"pipeline), and {policy} has none{fallback}"
        )


def validate_strategies(config: GRPOConfig) -> None:
    """ConfigError, saying what to fix, when ``config.advantage`` or ``config.token_weights``
    names no strategy or gives it options it does not take."""
    advantage_strategy(config).validate(config.advantage, config)
    token_weight_strategy(config).validate(config.token_weights, config)


def _lookup(label: str, spec, table: dict):
    if not (isinstance(spec, dict) and "name" in spec):
        raise ConfigError(f"{label} must be a mapping with a 'name' key, got {spec!r}")
    if spec["name"] in table:
        return table[spec["name"]]
    return plugin_strategy(label, spec["name"], table)


__all__ = [
    "ADVANTAGE_STRATEGIES",
    "TOKEN_WEIGHT_STRATEGIES",
    "AdvantageStrategy",
    "Metrics",
    "RewardMetric",
    "SignConflictRate",
    "TokenWeightStrategy",
    "WeightContext",
    "advantage_strategy",
    "check_image_pass",
    "token_weight_strategy",
    "validate_strategies",
    "weighted_reward",
]
