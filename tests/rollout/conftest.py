"""The rollout tests use the engine tests' tiny tokenizers and models (tests/training/conftest.py)."""

from tests.rollout.test_vision_policy import (  # noqa: F401 - the vision-language fixtures
    make_vl_model,
    tor_tasks,
    vl_processor,
    vl_prompts,
)
from tests.training.conftest import (  # noqa: F401 - fixtures are found by name
    _single_thread_torch,
    make_model,
    plain_tokenizer,
    tapo_prompts,
    tapo_tasks,
    tapo_texts,
    tapo_tokenizer,
)
