"""The GRPO engine: config, credit-assignment strategies, the training loop, SFT and checkpoints."""

from creditflow.training.checkpoint import CheckpointStore
from creditflow.training.config import ConfigError, GRPOConfig
from creditflow.training.grpo import GRPOResult, GRPOTrainer
from creditflow.training.strategies import ADVANTAGE_STRATEGIES, TOKEN_WEIGHT_STRATEGIES

__all__ = [
    "ADVANTAGE_STRATEGIES",
    "TOKEN_WEIGHT_STRATEGIES",
    "CheckpointStore",
    "ConfigError",
    "GRPOConfig",
    "GRPOResult",
    "GRPOTrainer",
]
