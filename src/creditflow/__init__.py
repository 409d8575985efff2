"""creditflow: GRPO-style reinforcement learning with careful credit assignment, as Kedro
pipelines."""

__version__ = "0.1.0"
