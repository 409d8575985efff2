"""The ``lean`` backend and the shared-prefix update on the real SmolLM2-135M-Instruct
(``LlamaForCausalLM``, 30 layers, vocabulary 49152), against transformers, on short sequences.

Skipped unless the checkpoint is on disk: ``creditflow fetch-model smollm2-135m-instruct``
puts it under ``data/06_models/pretrained/smollm2-135m-instruct``.
"""

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from creditflow.rollout.backends.hf import HFBackend
from creditflow.rollout.backends.lean import LeanBackend
from creditflow.rollout.language_policy import LanguagePolicy, SamplingSettings
from tests.rollout.test_lean_backend import hf_logits, lean_logits
from tests.rollout.test_shared_prefix import _assert_same, _score

FOLDER = Path(__file__).resolve().parents[2] / "data/06_models/pretrained/smollm2-135m-instruct"
pytestmark = pytest.mark.skipif(
    not (FOLDER / "config.json").is_file(),
    reason="SmolLM2-135M-Instruct is not on disk: run `creditflow fetch-model smollm2-135m-instruct`",
)
PROMPTS = ["What is 7 + 5?", "Name a colour of the sky."]


@pytest.fixture(scope="module")
def smollm2():
    model = LlamaForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(FOLDER)
    return model, tokenizer


def test_smollm2_is_sampled_by_lean_with_hf_logits_and_tokens(smollm2):
    model, tokenizer = smollm2
    backend = LeanBackend()
    assert backend.unsupported_reason(model) is None
    policy = LanguagePolicy(model, tokenizer, SamplingSettings(max_new_tokens=8), backend=backend)
    ids, mask = policy.encode_prompts(PROMPTS)  # (2, P) left-padded chat prompts
    G, T = 2, 8
    completion = torch.randint(
        0, model.config.vocab_size, (2 * G, T), generator=torch.Generator().manual_seed(0)
    )
    expected = hf_logits(
        model, ids.repeat_interleave(G, dim=0), mask.repeat_interleave(G, dim=0), completion
    )
    actual = lean_logits(model, ids, mask, G, completion)
    torch.testing.assert_close(actual, expected, atol=2e-4, rtol=1e-4)

    request = policy.sampling.request(ids, mask, G, policy.eos_ids, tokenizer.pad_token_id)
    torch.manual_seed(1)
    hf = HFBackend().generate(model, request)
    torch.manual_seed(1)
    lean = backend.generate(model, request)
    torch.testing.assert_close(lean.completion_ids, hf.completion_ids, rtol=0, atol=0)


def test_smollm2_shared_prefix_equals_the_plain_forward(smollm2):
    model, tokenizer = smollm2
    policy = LanguagePolicy(model, tokenizer, SamplingSettings(max_new_tokens=6))
    torch.manual_seed(2)
    batch = policy.sample(PROMPTS, group_size=2, with_logprobs=False)
    model.train()
    try:
        shared = _score(model, tokenizer, batch, shared_prefix=True, max_new_tokens=6)
        plain = _score(model, tokenizer, batch, shared_prefix=False, max_new_tokens=6)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    assert shared["rows"] == [2, 4] and plain["rows"] == [4]
    _assert_same(shared, plain)
