"""The vllm tests use the engine tests' TAPO tokenizer and prompts (tests/training/conftest.py)."""

from tests.training.conftest import (  # noqa: F401 - fixtures are found by name
    tapo_prompts,
    tapo_tasks,
    tapo_texts,
    tapo_tokenizer,
)
