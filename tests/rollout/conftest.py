"""The rollout tests use the engine tests' tiny tokenizers and models (tests/training/conftest.py)."""

from tests.training.conftest import (  # noqa: F401 - fixtures are found by name
    _single_thread_torch,
    make_model,
    plain_tokenizer,
    tapo_prompts,
    tapo_tasks,
    tapo_texts,
    tapo_tokenizer,
)
