"""Tiny TAPO tokenizers and Qwen2 policies shared by the engine tests.

Everything here is session-scoped and built in well under a second: BPE tokenizers (vocab 400)
trained on a few hundred TAPO task texts, and Qwen2 models with hidden size 32. Tests that train
a model take a fresh one from ``make_model`` / ``make_format_model``; never train a shared one.
"""

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

from creditflow.models import build_tiny_qwen2, train_bpe_tokenizer
from creditflow.tasks.tapo import format_tapo_target, generate_tapo_problems, tapo_prompt
from creditflow.training.sft import SFTConfig, train_sft

TAPO_TAGS = ("<translation>", "</translation>")
TINY_QWEN2 = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 64,
}
# Short tagged (prompt, target) pairs; a few SFT steps on them give a policy whose samples close
# </translation> about half the time, so one rollout holds completions with and without it.
FORMAT_PAIRS = [
    ("Add 2 and 3.", "<translation>Add 2 and 3.</translation> 2 + 3 = 5 \\boxed{5}"),
    ("Add 4 and 1.", "<translation>Add 4 and 1.</translation> 4 + 1 = 5 \\boxed{5}"),
    ("Sub 5 and 2.", "<translation>Sub 5 and 2.</translation> 5 - 2 = 3 \\boxed{3}"),
    ("Add 6 and 2.", "<translation>Add 6 and 2.</translation> 6 + 2 = 8 \\boxed{8}"),
]


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny matmuls run far faster on one thread on the shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="package")
def _single_thread_torch():
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def tapo_tasks():
    return generate_tapo_problems(40, ["en", "de", "fr", "ru", "zh"], seed=0)


@pytest.fixture(scope="session")
def tapo_prompts(tapo_tasks) -> list[str]:
    return [tapo_prompt(q) for q in tapo_tasks["question"]]


@pytest.fixture(scope="session")
def tapo_texts(tapo_tasks, tapo_prompts) -> list[str]:
    """200 prompts and their 200 gold completions."""
    targets = [
        format_tapo_target(q, a, r)
        for q, a, r in zip(
            tapo_tasks["question_en"], tapo_tasks["answer"], tapo_tasks["reasoning_en"], strict=True
        )
    ]
    return tapo_prompts + targets


@pytest.fixture(scope="session")
def tapo_tokenizer(tapo_texts):
    """The tags are one added token each."""
    return train_bpe_tokenizer(tapo_texts, vocab_size=400, special_tokens=TAPO_TAGS)


@pytest.fixture(scope="session")
def plain_tokenizer(tapo_texts):
    """No tag tokens: ``</translation>`` is split into several BPE pieces."""
    return train_bpe_tokenizer(tapo_texts, vocab_size=400)


@pytest.fixture(scope="session")
def make_model(tapo_tokenizer) -> Callable[..., torch.nn.Module]:
    """A fresh, untrained tiny Qwen2 (same weights for the same seed) on each call."""

    def make(seed: int = 0, **overrides):
        return build_tiny_qwen2(tapo_tokenizer, **{**TINY_QWEN2, "seed": seed, **overrides})

    return make


@pytest.fixture(scope="session")
def _format_model(make_model, tapo_tokenizer):
    model = make_model()
    prompts, targets = zip(*FORMAT_PAIRS, strict=True)
    with one_torch_thread():
        train_sft(
            model,
            tapo_tokenizer,
            list(prompts),
            list(targets),
            SFTConfig(steps=40, batch_size=4, learning_rate=2e-2, warmup_steps=2),
            progress=False,
        )
    return model.eval()


@pytest.fixture(scope="session")
def make_format_model(_format_model) -> Callable[[], torch.nn.Module]:
    """A fresh copy of a tiny model briefly fine-tuned on ``FORMAT_PAIRS``."""
    return lambda: copy.deepcopy(_format_model)


@pytest.fixture(scope="session")
def format_prompts() -> list[str]:
    return [prompt for prompt, _ in FORMAT_PAIRS]
