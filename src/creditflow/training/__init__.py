"""The GRPO engine: config, credit-assignment strategies, the training loop, the supervised
trainer (SFT, VL SFT), evaluation, launches and checkpoints. It names no method of the
experience chain and never imports it (``creditflow.chain`` builds on it)."""

from creditflow.config.grpo import GRPOConfig
from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.grpo import GRPOResult, GRPOTrainer
from creditflow.training.strategies import ADVANTAGE_STRATEGIES, TOKEN_WEIGHT_STRATEGIES

__all__ = [
    "ADVANTAGE_STRATEGIES",
    "TOKEN_WEIGHT_STRATEGIES",
    "CheckpointStore",
    "GRPOConfig",
    "GRPOResult",
    "GRPOTrainer",
]
